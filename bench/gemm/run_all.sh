#!/usr/bin/env bash
# Run the INT4 GEMM GPU test, the sanitizer passes and the benchmark in one go.
# Usage: bench/gemm/run_all.sh BIN_DIR OUT_DIR [STEPS]
#   BIN_DIR holds test_gpu_int4_gemm and bench_gemm; logs and JSON go to OUT_DIR.
#   STEPS: any of test,sanitize,bench,sweep,sass (default: all of them).
set -uo pipefail
bin=$1; out=$2; steps=${3:-test,sanitize,bench,sweep,sass}
mkdir -p "$out"
has() { [[ ",$steps," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$out/gpu.txt"
if has sass; then
  cuobjdump -sass "$bin/bench_gemm" > "$out/sass.txt" 2>&1
  echo "sass: HMMA $(grep -c HMMA "$out/sass.txt"), LOP3 $(grep -c LOP3 "$out/sass.txt"), LDL $(grep -c 'LDL' "$out/sass.txt"), STL $(grep -c 'STL' "$out/sass.txt"), LDGSTS $(grep -c LDGSTS "$out/sass.txt"), LDSM $(grep -c LDSM "$out/sass.txt")"
  gzip -f "$out/sass.txt"
fi
if has test; then
  timeout 300 "$bin/test_gpu_int4_gemm" > "$out/test.log" 2>&1; echo "test rc=$?"; tail -25 "$out/test.log"
fi
if has sanitize; then
  INT4SERVE_GEMM_TEST_QUICK=1 timeout 240 compute-sanitizer --tool memcheck "$bin/test_gpu_int4_gemm" > "$out/memcheck.log" 2>&1; echo "memcheck rc=$?"; tail -4 "$out/memcheck.log"
  INT4SERVE_GEMM_TEST_QUICK=1 timeout 240 compute-sanitizer --tool racecheck "$bin/test_gpu_int4_gemm" > "$out/racecheck.log" 2>&1; echo "racecheck rc=$?"; tail -4 "$out/racecheck.log"
fi
if has bench; then
  timeout 300 "$bin/bench_gemm" "$out/bench.json" > "$out/bench.log" 2>&1; echo "bench rc=$?"; cat "$out/bench.log"
fi
if has sweep; then
  timeout 300 "$bin/bench_gemm" "$out/sweep.json" --sweep --shapes llama2 --ms 1,4,16,32,64,128 --replays 5 > "$out/sweep.log" 2>&1; echo "sweep rc=$?"; grep -v "^    sweep" "$out/sweep.log" | tail -40
fi
