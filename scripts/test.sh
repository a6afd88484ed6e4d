#!/usr/bin/env bash
# Install what is missing, then run every test int4serve has, in three builds:
#   build/       Release, CUDA when nvcc is present: every ctest label
#                (unit, integration, gpu, fuzz; gpu tests skip without a GPU)
#   build-asan/  CPU-only (-DINT4SERVE_CUDA=OFF) under AddressSanitizer and
#                UndefinedBehaviorSanitizer, at -O1 (fast enough for the CPU
#                model tests, still precise reports): every label but gpu
#   build-fuzz/  clang + libFuzzer, only where clang is installed: each fuzz
#                target for INT4SERVE_FUZZ_SECONDS (default 20) seconds
# Every stage runs even when an earlier one failed; the summary at the end
# names the failures and the exit status is non-zero when there was any.
# Incremental: a second run reconfigures (cheap) and rebuilds what changed.
# Environment: CI=true turns warnings into errors; JOBS (default nproc);
# INT4SERVE_FUZZ_SECONDS.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
set +e
int4serve_install_deps || { echo "test.sh: installing dependencies failed"; exit 1; }

jobs=${JOBS:-$(nproc)}
INT4SERVE_TOKENIZER_CACHE=$(scripts/fetch-tokenizers.sh); export INT4SERVE_TOKENIZER_CACHE
fuzz_seconds=${INT4SERVE_FUZZ_SECONDS:-20}
failed=()
summary=()

# configure DIR ARGS...: Ninja on first configuration; an existing build
# folder keeps its generator, so re-running never fails on a generator change.
configure() {
    local dir=$1
    shift
    if [ -f "$dir/CMakeCache.txt" ]; then
        cmake -S . -B "$dir" "$@" >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; return 1; }
    else
        mkdir -p "$dir"
        cmake -S . -B "$dir" -G Ninja "$@" >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; return 1; }
    fi
}

# stage NAME FUNCTION: run one stage, time it, remember how it went.
stage() {
    local name=$1 start=$SECONDS
    echo "=== $name"
    if "$2"; then
        summary+=("ok    $name ($((SECONDS - start)) s)")
    else
        summary+=("FAIL  $name ($((SECONDS - start)) s)")
        failed+=("$name")
    fi
}

release() {
    configure build -DCMAKE_BUILD_TYPE=Release &&
        cmake --build build -j "$jobs" &&
        (cd build && ctest --output-on-failure -j "$jobs")
}

sanitize() {
    configure build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DINT4SERVE_SANITIZE=ON \
        -DINT4SERVE_CUDA=OFF &&
        cmake --build build-asan -j "$jobs" &&
        (cd build-asan &&
            ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
            ctest --output-on-failure -j "$jobs" -LE gpu)
}

fuzz() {
    configure build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DINT4SERVE_FUZZ=ON -DINT4SERVE_SANITIZE=ON -DINT4SERVE_CUDA=OFF \
        -DINT4SERVE_FUZZ_SECONDS="$fuzz_seconds" &&
        cmake --build build-fuzz -j "$jobs" --target fuzz_targets &&
        (cd build-fuzz && ctest --output-on-failure -j "$jobs" -L fuzz)
}

stage "release build, all labels (build/)" release
stage "sanitizer build, CPU only, all labels but gpu (build-asan/)" sanitize
if command -v clang >/dev/null 2>&1; then
    stage "libFuzzer build, ${fuzz_seconds} s per target (build-fuzz/)" fuzz
else
    summary+=("skip  libFuzzer build: clang is not installed")
fi

echo "=== summary"
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -ne 0 ]; then
    echo "test.sh: ${#failed[@]} stage(s) failed"
    exit 1
fi
echo "test.sh: all passed"
