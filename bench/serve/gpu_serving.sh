#!/usr/bin/env bash
# Serving benchmark on one GPU: synthetic Llama-shaped checkpoints served by
# int4serve (backend cuda), measured by int4serve-bench-serve over HTTP, for
# INT4 and quantization none (fp16) of the same checkpoint in one run:
#   (a) concurrency 1:   N1 requests one at a time, prompt 128, output 256
#   (b) concurrency 32:  N32 requests, prompt 256, output 256
#   (c) concurrency 128: N128 requests, prompt 256, output 256
# every request ignore_eos, greedy and streamed. Each bench's report goes to
# OUT_DIR; one table of all of them is printed at the end (and written to
# OUT_DIR/table.md), with the time to write and to load each model.
#
# Tokenizer: the checkpoints get the real Llama-2 (llama2-7b) and Llama-3.1
# (llama3-8b) tokenizer.json from $INT4SERVE_TOKENIZER_CACHE (filled by
# scripts/fetch-tokenizers.sh) when it is there, so every generated id has
# text and the per-text-event ITL is per token. Without it mkmodel's
# synthetic tokenizer has text for a few hundred ids only; the table says
# which tokenizer each row used, and TPOT (from the usage counts) stays a
# per-token time either way.
#
# Usage: gpu_serving.sh BIN_DIR OUT_DIR [N1 [N32 [N128]]]
#        BIN_DIR holds int4serve, int4serve-bench-serve, int4serve-mkmodel;
#        request counts default to 8, 512, 512 (a short run: 4 64 128).
# Environment: PRESETS (default "llama2-7b llama3-8b"), QUANTS ("int4 none"),
#              PORT (18000), INT4SERVE_TOKENIZER_CACHE, BACKEND (cuda; cpu
#              with PRESETS=tiny tries the script on a machine without GPU).
set -uo pipefail
BIN=$1
OUT=$2
N1=${3:-8}
N32=${4:-512}
N128=${5:-512}
PRESETS=${PRESETS:-llama2-7b llama3-8b}
QUANTS=${QUANTS:-int4 none}
PORT=${PORT:-18000}
BACKEND=${BACKEND:-cuda}
TOKCACHE=${INT4SERVE_TOKENIZER_CACHE:-}
mkdir -p "$OUT"
ms() { date +%s%3N; }
TABLE=$OUT/table.md
{
    echo "| model | weights | tokenizer | N | C | P | O | output tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms (per text event) | TPOT p50 / p99 ms | text events / token | errors |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$TABLE"

# row PRESET QUANT TOK N C P O REPORT: one table line from a bench report.
row() {
    awk -v m="$1" -v q="$2" -v t="$3" -v n="$4" -v c="$5" -v p="$6" -v o="$7" '
        /^requests/ { n = $2; c = $4 } # as run: the bench caps C at N
        /^duration/ { tps = $NF }
        /^TTFT/ { ttft = $4 " / " $6 }
        /^ITL/ { itl = $4 " / " $6 }
        /^TPOT/ { tpot = $4 " / " $6 }
        /^text events per output token/ { ratio = $6 }
        /^errors/ { err = $2 }
        END {
            w = (q == "none") ? "fp16" : "INT4"
            printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
                m, w, t, n, c, p, o, tps, ttft, itl, tpot, ratio, err
        }' "$8" >>"$TABLE"
}

# bench PRESET QUANT TOK N C P O: run one load, keep its report, add its row.
bench() {
    local rep=$OUT/$1-$2-c$5.txt
    echo "-- $1 $2: N $4, concurrency $5, prompt $6, output $7"
    "$BIN/int4serve-bench-serve" --url "http://127.0.0.1:$PORT" -n "$4" -c "$5" -p "$6" -o "$7" \
        >"$rep" 2>&1
    cat "$rep"
    row "$@" "$rep"
}

for preset in $PRESETS; do
    case $preset in
    llama2-7b) tokfile=$TOKCACHE/llama2/tokenizer.json ;;
    llama3-8b) tokfile=$TOKCACHE/llama3_1/tokenizer.json ;;
    *) tokfile= ;;
    esac
    tokargs=()
    tok=synthetic
    if [ -n "$TOKCACHE" ] && [ -s "$tokfile" ]; then
        tokargs=(--tokenizer "$tokfile")
        tok=real
    fi
    M=/tmp/int4serve-bench-$preset
    rm -rf "$M"
    t0=$(ms)
    "$BIN/int4serve-mkmodel" --preset "$preset" "${tokargs[@]}" --out "$M" >/dev/null || exit 1
    echo "== $preset: checkpoint written in $(($(ms) - t0)) ms ($(du -sh "$M" | cut -f1)), tokenizer $tok${tokargs[1]:+ (${tokargs[1]})}"
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
backend = "$BACKEND"
max_batch = 128
[limits]
per_ip_connections = 1024
max_queue = 4096
EOF
        t0=$(ms)
        "$BIN/int4serve" --config "$cfg" >"$OUT/$preset-$quant.log" 2>&1 &
        pid=$!
        up=0
        for _ in $(seq 1 1500); do
            if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" 2>/dev/null; then
                up=1
                break
            fi
            kill -0 $pid 2>/dev/null || break
            sleep 0.2
        done
        if [ $up = 0 ]; then
            echo "== $preset $quant: server did not start"
            tail -5 "$OUT/$preset-$quant.log"
            echo "| $preset | $quant | $tok | server did not start | | | | | | | | | |" >>"$TABLE"
            kill $pid 2>/dev/null
            wait $pid 2>/dev/null
            continue
        fi
        echo "== $preset $quant: loaded in $(($(ms) - t0)) ms"
        grep -E "memory plan|engine ready" "$OUT/$preset-$quant.log" | sed 's/^/   /'
        bench "$preset" "$quant" "$tok" "$N1" 1 128 256
        bench "$preset" "$quant" "$tok" "$N32" 32 256 256
        bench "$preset" "$quant" "$tok" "$N128" 128 256 256
        kill -TERM $pid
        wait $pid
        grep -E " W | E " "$OUT/$preset-$quant.log" | head -5
    done
    rm -rf "$M"
done
echo
echo "TTFT: sent -> first event carrying text. ITL: per text event (the server"
echo "sends no event for a token without text). TPOT: per request, (last event -"
echo "first text event) / (completion_tokens - 1). Output tok/s from usage counts."
echo
cat "$TABLE"
