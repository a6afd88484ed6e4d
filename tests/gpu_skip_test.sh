#!/usr/bin/env bash
# Each GPU test executable, run with every GPU hidden, exits with the skip
# status ctest counts as skipped and prints "SKIPPED: no GPU".
# Usage: skip_test.sh CODE EXECUTABLE...
set -uo pipefail
code=$1
shift
failures=0
for exe in "$@"; do
    out=$(CUDA_VISIBLE_DEVICES= "$exe" 2>&1)
    rc=$?
    if [ "$rc" -ne "$code" ] || ! grep -qx "SKIPPED: no GPU" <<<"$out"; then
        echo "FAIL: $(basename "$exe") without a GPU exited $rc (want $code): $(head -c 200 <<<"$out")"
        failures=$((failures + 1))
    fi
done
[ "$failures" -eq 0 ] && echo "OK: $# GPU tests skip without a GPU" || exit 1
