#!/usr/bin/env bash
# Install the Debian packages int4serve needs to build and test, only those
# missing. Idempotent: a second run installs nothing and does not touch apt.
# Sourced by serve.sh and test.sh (int4serve_install_deps), or run directly
# with extra package names as arguments. Runs as root, or through sudo.
#   clang + libclang-rt-dev: the libFuzzer build (build-fuzz) in test.sh.
#   curl, python3: the integration tests that run scripts against a daemon
#   (reliability.py); wrk for scripts/loadcheck.sh is not installed here.
# The CUDA toolkit is not installed here: where nvcc is absent the build is
# CPU-only.
set -euo pipefail

INT4SERVE_PACKAGES=(
    build-essential cmake ninja-build pkg-config git
    libuv1-dev libmicrohttpd-dev libjansson-dev libpcre2-dev libutf8proc-dev
    check libsubunit-dev libcurl4-openssl-dev
    clang libclang-rt-dev python3 curl
)

int4serve_missing_packages() {
    local p missing=()
    for p in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
            missing+=("$p")
        fi
    done
    echo "${missing[@]:-}"
}

int4serve_install_deps() {
    local missing
    missing=$(int4serve_missing_packages "${INT4SERVE_PACKAGES[@]}" "$@")
    # Node.js (for the tokenizer's differential test) may come from another
    # source than Debian; only ask Debian for it when there is no npm at all.
    if ! command -v npm >/dev/null 2>&1; then
        missing="$missing nodejs npm"
    fi
    missing=$(echo $missing)
    if [ -z "$missing" ]; then
        return 0
    fi
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "deps: installing $missing"
    $sudo apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    int4serve_install_deps "$@"
fi
