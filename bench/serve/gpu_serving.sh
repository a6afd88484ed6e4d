#!/usr/bin/env bash
# Serving benchmark on one GPU: synthetic Llama-shaped checkpoints served by
# int4serve (backend cuda), measured by int4serve-bench-serve over HTTP, for
# INT4 and quantization none (fp16) of the same model in one run.
#   (a) batch 1: N1 requests one at a time, prompt 128, output 256
#   (b) concurrency 32 and 128: N32 / N128 requests, prompt 256, output 256
# every request ignore_eos and streamed. Prints each bench's report and the
# time to write and to load each model.
# Usage: gpu_serving.sh BIN_DIR OUT_DIR   (BIN_DIR holds int4serve,
#        int4serve-bench-serve and int4serve-mkmodel)
# Environment: PRESETS (default "llama2-7b"), QUANTS ("int4 none"), N1 (8),
#              N32 (512), N128 (512), PORT (18000).
set -uo pipefail
BIN=$1
OUT=$2
PRESETS=${PRESETS:-llama2-7b}
QUANTS=${QUANTS:-int4 none}
N1=${N1:-8}
N32=${N32:-512}
N128=${N128:-512}
PORT=${PORT:-18000}
ms() { date +%s%3N; }

for preset in $PRESETS; do
    M=/tmp/int4serve-bench-$preset
    t0=$(ms)
    "$BIN/int4serve-mkmodel" --preset "$preset" --out "$M" >/dev/null || exit 1
    echo "== $preset: checkpoint written in $(( $(ms) - t0 )) ms ($(du -sh "$M" | cut -f1))"
    for quant in $QUANTS; do
        cfg=$OUT/$preset-$quant.toml
        cat >"$cfg" <<EOF
[server]
host = "127.0.0.1"
port = $PORT
log_level = "info"
[model]
model = "$M"
quantization = "$quant"
max_model_len = 2048
[engine]
backend = "cuda"
max_batch = 128
[limits]
per_ip_connections = 1024
max_queue = 4096
EOF
        t0=$(ms)
        "$BIN/int4serve" --config "$cfg" >"$OUT/$preset-$quant.log" 2>&1 &
        pid=$!
        up=0
        for _ in $(seq 1 600); do
            if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" 2>/dev/null; then
                up=1
                break
            fi
            kill -0 $pid 2>/dev/null || break
            sleep 0.2
        done
        if [ $up = 0 ]; then
            echo "== $preset $quant: server did not start"
            tail -5 "$OUT/$preset-$quant.log"
            kill $pid 2>/dev/null
            wait $pid 2>/dev/null
            continue
        fi
        echo "== $preset $quant: loaded in $(( $(ms) - t0 )) ms"
        grep -E "memory plan|engine ready" "$OUT/$preset-$quant.log" | sed 's/^/   /'
        url=http://127.0.0.1:$PORT
        echo "-- batch 1 (prompt 128, output 256)"
        "$BIN/int4serve-bench-serve" --url $url -n "$N1" -c 1 -p 128 -o 256
        echo "-- concurrency 32 (prompt 256, output 256)"
        "$BIN/int4serve-bench-serve" --url $url -n "$N32" -c 32 -p 256 -o 256
        echo "-- concurrency 128 (prompt 256, output 256)"
        "$BIN/int4serve-bench-serve" --url $url -n "$N128" -c 128 -p 256 -o 256
        kill -TERM $pid
        wait $pid
        grep -E "WARN|ERROR| W | E " "$OUT/$preset-$quant.log" | head -5
    done
    rm -rf "$M"
done
