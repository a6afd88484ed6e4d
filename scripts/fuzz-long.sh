#!/usr/bin/env bash
# The long fuzz run, for maintainers: every libFuzzer target (the TOML
# reader, the safetensors header parser, the tokenizer, the OpenAI request
# parser; tests/fuzz/) for FUZZ_SECONDS each (default 600: ten minutes), in
# the same clang + AddressSanitizer + UndefinedBehaviorSanitizer build as
# test.sh's short runs (build-fuzz/). CI keeps the short runs
# (INT4SERVE_FUZZ_SECONDS in test.sh).
#
#   ./scripts/fuzz-long.sh                 # 10 minutes a target
#   FUZZ_SECONDS=3600 JOBS=4 ./scripts/fuzz-long.sh
#
# JOBS targets run at once (default: half the cores, at least 1), so the
# whole run takes about FUZZ_SECONDS x targets / JOBS. A crash leaves its
# input in build-fuzz/tests/fuzz/crash-<target>-* (replay: the target's
# binary with that file as its argument); inputs that found new coverage
# are in build-fuzz/tests/fuzz/work-<target>/, to merge into
# tests/fuzz/corpus/<target>/ with the target's -merge=1.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
int4serve_install_deps || { echo "fuzz-long.sh: installing dependencies failed"; exit 1; }
seconds=${FUZZ_SECONDS:-600}
cores=$(nproc)
jobs=${JOBS:-$((cores / 2 > 0 ? cores / 2 : 1))}
command -v clang >/dev/null || { echo "fuzz-long.sh: clang is not installed"; exit 1; }
if [ -f build-fuzz/CMakeCache.txt ]; then gen=(); else gen=(-G Ninja); fi
cmake -S . -B build-fuzz "${gen[@]}" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DINT4SERVE_FUZZ=ON -DINT4SERVE_SANITIZE=ON -DINT4SERVE_CUDA=OFF \
    -DINT4SERVE_FUZZ_SECONDS="$seconds" >/dev/null || exit 1
cmake --build build-fuzz -j "$cores" --target fuzz_targets || exit 1
n=$(cd build-fuzz && ctest -N -L fuzz | sed -n 's/^Total Tests: //p')
echo "fuzz-long.sh: $n fuzz tests, $seconds s each, $jobs at once (about $(( (n + jobs - 1) / jobs * seconds )) s)"
(cd build-fuzz && ctest --output-on-failure -j "$jobs" -L fuzz)
rc=$?
ls build-fuzz/tests/fuzz/crash-* 2>/dev/null && echo "fuzz-long.sh: crash inputs above"
exit "$rc"
