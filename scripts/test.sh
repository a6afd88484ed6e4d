#!/usr/bin/env bash
# Install what is missing, build, run every test (all ctest labels), then the
# CPU tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
int4serve_install_deps

jobs=$(nproc)
INT4SERVE_TOKENIZER_CACHE=$(scripts/fetch-tokenizers.sh); export INT4SERVE_TOKENIZER_CACHE
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
(cd build && ctest --output-on-failure -j "$jobs")

# Sanitizer build: CPU code only (CUDA off), every label but gpu.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DINT4SERVE_SANITIZE=ON \
    -DINT4SERVE_CUDA=OFF >/dev/null
cmake --build build-asan -j "$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --output-on-failure -j "$jobs" -LE gpu)
