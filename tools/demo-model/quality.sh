#!/usr/bin/env bash
# The demo model's held-out perplexity at every weight setting, as the table
# in docs/QUALITY.md: fp32 (CPU) or fp16 (CUDA) weights, then INT4 at group
# 128, 64, 32 and per-channel, asymmetric and symmetric, over the whole of
# tests/fixtures/kjv_heldout.txt in windows of CTX tokens.
#   tools/demo-model/quality.sh [BUILD_DIR] [cpu|cuda] [CTX]
# Prints a Markdown table; each run's JSON goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."
bd=${1:-build}; backend=${2:-cpu}; ctx=${3:-256}
tool="$bd/tools/perplexity/int4serve-perplexity"
run() { "$tool" --model models/kjv-demo --text "${QUALITY_TEXT:-tests/fixtures/kjv_heldout.txt}" --ctx "$ctx" \
    --backend "$backend" "$@" 2>/dev/null | tee /dev/stderr; }
field() { grep -o "\"$1\":[0-9.eE+-]*" | cut -d: -f2; }
base=$(run --quantization none)
ppl0=$(field ppl <<<"$base")
echo "| weights ($backend, windows of $ctx, $(field predicted <<<"$base") ids) | perplexity | vs 16-bit |"
echo "| --- | ---: | ---: |"
printf '| %s | %.4f | |\n' "$([ "$backend" = cpu ] && echo fp32 || echo fp16)" "$ppl0"
for g in 128 64 32 0; do
    for sym in "" --symmetric; do
        p=$(run --quantization int4 --group-size "$g" $sym | field ppl)
        name="INT4 $([ "$g" = 0 ] && echo per-channel || echo "group $g"), $([ -n "$sym" ] && echo symmetric || echo asymmetric)"
        awk -v n="$name" -v p="$p" -v b="$ppl0" 'BEGIN { printf "| %s | %.4f | %+.2f%% |\n", n, p, 100 * (p / b - 1) }'
    done
done
