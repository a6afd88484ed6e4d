#!/usr/bin/env bash
# The CUDA version the code needs, in step everywhere: CMakeLists.txt names
# it (INT4SERVE_CUDA_MIN_VERSION) and refuses an older toolkit at configure
# time, with a message saying so; the Dockerfile's base image is at least it.
# Usage: cuda_version_test.sh SOURCE_DIR [NVCC]. The configure check runs
# only where an nvcc is found (else only the pins are checked).
set -uo pipefail
src=$1
nvcc=${2:-/usr/local/cuda/bin/nvcc}
failures=0
fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}
# ver_ge A B: version A >= B
ver_ge() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$2" ]; }

min=$(sed -n 's/^ *set(INT4SERVE_CUDA_MIN_VERSION \([0-9.]*\)).*/\1/p' "$src/CMakeLists.txt")
[ -n "$min" ] || fail "CMakeLists.txt does not set INT4SERVE_CUDA_MIN_VERSION"
docker=$(sed -n 's/^ARG CUDA_VERSION=\([0-9.]*\).*/\1/p' "$src/Dockerfile")
[ -n "$docker" ] || fail "the Dockerfile has no ARG CUDA_VERSION"
if [ -n "$min" ] && [ -n "$docker" ]; then
    ver_ge "$docker" "$min" || fail "the Dockerfile's CUDA $docker is older than the $min CMake needs"
fi

# An nvcc that says it is 12.6: configuring must stop with the reason.
if [ -n "$min" ] && [ -x "$nvcc" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    cat >"$tmp/nvcc" <<EOS
#!/bin/sh
for a in "\$@"; do
    if [ "\$a" = "--version" ]; then
        echo "Cuda compilation tools, release 12.6, V12.6.85"
        exit 0
    fi
done
exec "$nvcc" "\$@"
EOS
    chmod +x "$tmp/nvcc"
    if cmake -S "$src" -B "$tmp/build" -DCMAKE_CUDA_COMPILER="$tmp/nvcc" -DINT4SERVE_TESTS=OFF \
        >"$tmp/log" 2>&1; then
        fail "configuring with CUDA 12.6 succeeded"
    fi
    tr -s ' \n' ' ' <"$tmp/log" | grep -q "older than $min, the version the CUDA backend needs" ||
        fail "configuring with CUDA 12.6 did not say why: $(tail -c 400 "$tmp/log")"
else
    echo "no nvcc at $nvcc: only the version pins are checked"
fi
[ "$failures" -eq 0 ] && echo "OK: CUDA $min or newer (Dockerfile: $docker)" || exit 1
