#!/usr/bin/env bash
# Run the INT4 GEMM GPU test, the sanitizer passes and the benchmark in one go.
# Usage: bench/gemm/run_all.sh BIN_DIR OUT_DIR [STEPS]
#   BIN_DIR holds test_gpu_int4_gemm and bench_gemm; logs and JSON go to OUT_DIR.
#   STEPS: any of test,sanitize,bench,sweep,sass (default: all of them).
set -uo pipefail
bin=$1; out=$2; steps=${3:-test,sanitize,bench,sweep,sass}
mkdir -p "$out"
has() { [[ ",$steps," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
if has sass; then
  # per kernel: spill traffic (LDL/STL) and where it sits relative to the mma loop
  cuobjdump -sass "$bin/bench_gemm" | awk '
    /Function :/ { if (name) print name, "HMMA", h, "LDL", l, "STL", s, "LDL between HMMAs", mid;
                   name=$3; h=0; l=0; s=0; mid=0; pend=0; next }
    /HMMA/ { h++; mid += pend; pend=0 }
    /LDL/ { l++; if (h) pend++ }
    /STL/ { s++ }
    END { if (name) print name, "HMMA", h, "LDL", l, "STL", s, "LDL between HMMAs", mid }' |
    sed -E 's/_ZN8int4gemm[^ ]*int4_gemm_kernelILi([0-9])ELi([0-9])ELi([0-9])ELi([0-9])ELi([0-9])ELi([0-9])ELb([01])ELb([01])[^ ]*/mb\1 nwn\2 nf\3 kpw\4 s\5 bps\6 zp\7 av\8/' > /tmp/sass_summary.txt
  cat /tmp/sass_summary.txt
  echo "memory descriptors in odd uniform registers: $(cuobjdump -sass "$bin/bench_gemm" | grep -cE 'desc\[UR[0-9]*[13579]\]')"
  # the automatic 16-row asymmetric kernel's SASS (config 0), for instruction counting
  cuobjdump -sass "$bin/bench_gemm" | awk '/Function :/{p=($3 ~ /kernelILi1ELi4ELi4ELi4ELi4ELi2ELb1ELb1E/)} p' > "$out/sass_m16.txt"
  grep -c "" "$out/sass_m16.txt"
fi
if has test; then
  timeout 150 "$bin/test_gpu_int4_gemm" > "$out/test.log" 2>&1; echo "test rc=$?"; tail -25 "$out/test.log"
fi
if has bench; then
  # --striped and --noswap time the launcher's old grid and operand order in the same run,
  # --acc the M <= 16 launches in the decode step's form (fixed-point words, no C)
  timeout 200 "$bin/bench_gemm" "$out/bench.json" --striped --noswap --acc > "$out/bench.log" 2>&1; echo "bench rc=$?"; cat "$out/bench.log"
fi
if has sweep; then
  timeout 120 "$bin/bench_gemm" /tmp/sweep.json --sweep --shapes llama2 --ms 1,16,32,64,128,256 --replays 5 > "$out/sweep.log" 2>&1; echo "sweep rc=$?"; grep -v "^    sweep" "$out/sweep.log" | tail -40
fi
if has sanitize; then
  INT4SERVE_GEMM_TEST_QUICK=1 timeout 200 compute-sanitizer --tool memcheck "$bin/test_gpu_int4_gemm" > "$out/memcheck.log" 2>&1; echo "memcheck rc=$?"; tail -4 "$out/memcheck.log"
  INT4SERVE_GEMM_TEST_QUICK=1 timeout 300 compute-sanitizer --tool racecheck "$bin/test_gpu_int4_gemm" > "$out/racecheck.log" 2>&1; echo "racecheck rc=$?"; tail -4 "$out/racecheck.log"
fi
