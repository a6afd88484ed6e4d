#!/usr/bin/env bash
# Serving benchmark on one GPU: synthetic Llama-shaped checkpoints
# (int4serve-mkmodel presets) served by int4serve (backend cuda), measured by
# int4serve-bench-serve over HTTP. For each model of MODELS the fp16
# checkpoint is written once, then served once per entry of WEIGHTS (int4:
# quantized on load, group 128, embedding and lm_head fp16; int4-lmhead: the
# same with the lm_head INT4 too; fp16: quantization "none"), and each server
# gets three loads, every request ignore_eos, greedy and streamed:
#   (a) batch 1:         N1 requests one at a time, prompt 128, output 256
#   (b) concurrency 32:  N requests, prompt 256, output 256
#   (c) concurrency 128: N requests, prompt 256, output 256
# Reported per load: output tokens/s, TTFT and ITL p50 / p99, TPOT p50 /
# p99, text events per token and errors; per model and weights: the time to
# write the checkpoint, the time from starting the server to /health
# answering, and the server's own line on loading the weights.
#
# Usage: gpu_serving.sh BIN_DIR OUT_DIR
#   BIN_DIR holds int4serve, int4serve-bench-serve and int4serve-mkmodel.
#   OUT_DIR receives, per load, MODEL-WEIGHTS-cC.txt (the bench's report);
#   per server, MODEL-WEIGHTS.toml and .log; and for the whole run
#   table.md (markdown rows ready for docs/PERF.md), startup.md and
#   results.json (one object per load plus the start-up times).
# Environment:
#   MODELS    mkmodel presets, in order (default "llama2-7b llama3-8b")
#   MKARGS    more int4serve-mkmodel arguments for every checkpoint, e.g.
#             "--format gptq-actorder --group-size 128" (an INT4 checkpoint
#             as downloaded: serve it with WEIGHTS=auto)
#   WEIGHTS   "int4 fp16" (default), any of int4, int4-lmhead, fp16 and auto
#             (quantization "auto": the checkpoint's own format), each
#             optionally with "+fp8": the same weights on an fp8 (E4M3) KV
#             cache (engine.kv_cache_dtype = "fp8"), e.g. "int4 int4+fp8 fp16",
#             and "+sm75": on the compute capability 7.5 paths, what a T4
#             runs (engine.cuda_kernels = "sm75"), e.g. "int4 int4+sm75"
#   LOADS     the concurrencies run per server, of "1 32 128" (the default)
#   N         requests at C = 32 and at C = 128 (default 512); N32 and N128
#             override each; N1 requests at batch 1 (default 8)
#   BUDGET_S  seconds this run may take (default 560): a load that would
#             start past it is skipped, and each runs under `timeout` of what
#             is left, so a call's limit is never hit mid-file (a skipped or
#             cut load says so in the table)
#   INT4SERVE_TOKENIZER_CACHE  folder with llama2/tokenizer.json and
#             llama3_1/tokenizer.json (scripts/fetch-tokenizers.sh); each
#             checkpoint then gets its model's real tokenizer, so every
#             generated id has text and ITL is per token. Without it
#             mkmodel's synthetic tokenizer has text for a few hundred ids
#             only (the table says which tokenizer each row used; TPOT, from
#             the usage counts, is per token either way)
#   TP        engine.tp of every server (default 1); on the cuda backend
#             its devices are 0 .. TP-1 unless DEVICES gives the list
#             ("0, 1"); the table's weights column then says "tp N"
#   PORT (18000), BACKEND (cuda; BACKEND=cpu MODELS=tiny N1=2 N=6 tries the
#             script end to end on a machine without a GPU, in about 15 s;
#             there "fp16" is quantization none, fp32 on the CPU backend),
#             MODEL_DIR (where checkpoints are written, default /tmp),
#             MODEL_REUSE (1: a checkpoint already at MODEL_DIR/int4serve-bench-MODEL
#             from an earlier run of the same mkmodel preset is served as it
#             is, and kept)
#
# Time per model, from the rates measured on one H200 (docs/PERF.md,
# "Serving (GPU)": INT4 llama2-7b at 192 tok/s batch 1, 2536 tok/s at C = 32,
# 3282 tok/s at C = 128; checkpoint written in 29.5 s) with N = 512:
#   checkpoint                      ~30 s (llama3-8b, 16 GB: ~35 s)
#   per server: start + load        ~10 s INT4, ~10 s fp16 (estimates)
#     (a) 8 x 256 tokens            ~11 s
#     (b) 512 x 256 at C = 32       ~52 s
#     (c) 512 x 256 at C = 128      ~40 s
#   INT4 ~115 s; fp16 not yet measured (expect it no slower: ~115 s)
#   one model, both weights: ~260 s (llama3-8b: larger vocabulary and MLP,
#   fewer KV heads: assume up to 1.5x, ~390 s)
# So one model per 10-minute call, with BUDGET_S (560 s) as the guard:
#   call 1: MODELS=llama2-7b bench/serve/gpu_serving.sh BIN OUT/llama2-7b
#   call 2: MODELS=llama3-8b bench/serve/gpu_serving.sh BIN OUT/llama3-8b
# If a call comes close to its limit, lower N (N=256 halves (b) and (c)).
set -uo pipefail
if [ $# -ne 2 ]; then
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2
fi
BIN=$1
OUT=$2
MODELS=${MODELS:-llama2-7b llama3-8b}
WEIGHTS=${WEIGHTS:-int4 fp16}
N1=${N1:-8}
N=${N:-512}
N32=${N32:-$N}
N128=${N128:-$N}
BUDGET_S=${BUDGET_S:-560}
LOADS=${LOADS:-1 32 128}
PORT=${PORT:-18000}
BACKEND=${BACKEND:-cuda}
TP=${TP:-1}
DEVICES=${DEVICES:-$(seq -s ', ' 0 $((TP - 1)))}
MODEL_DIR=${MODEL_DIR:-/tmp}
MODEL_REUSE=${MODEL_REUSE:-0}
TOKCACHE=${INT4SERVE_TOKENIZER_CACHE:-}
mkdir -p "$OUT" || exit 1
if ! command -v curl >/dev/null && ! env -u LD_LIBRARY_PATH python3 -c "import urllib.request" 2>/dev/null; then
    echo "gpu_serving.sh: needs curl or python3 to poll /health" >&2
    exit 1
fi
T_START=$(date +%s)
ms() { date +%s%3N; }
left() { echo $((BUDGET_S - ($(date +%s) - T_START))); }

TABLE=$OUT/table.md
STARTUP=$OUT/startup.md
JSON_ROWS=$OUT/.rows.json
: >"$JSON_ROWS"
{
    echo "| model | weights | tokenizer | N | C | P | O | output tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | TPOT p50 / p99 ms | text events / token | errors |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$TABLE"
{
    echo "| model | weights | checkpoint written s | server start to /health s | weights loaded (server log) |"
    echo "| --- | --- | --- | --- | --- |"
} >"$STARTUP"

# json_str TEXT: TEXT as a JSON string.
json_str() {
    printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr -d '\n\r\t')"
}

# emit MODEL WEIGHTS TOK N C P O REPORT STATUS: one table row and one JSON
# object from a bench report (STATUS ok, or why the numbers are missing).
emit() {
    local m=$1 w=$2 tok=$3 n=$4 c=$5 p=$6 o=$7 rep=$8 status=$9
    local vals
    vals=$(awk '
        /^requests/ { n = $2; c = $4 } # as run: the bench caps C at N
        /^duration/ { dur = $2; tps = $NF; toks = $(NF - 3) }
        /^TTFT/ { t50 = $4; t99 = $6 }
        /^ITL/ { i50 = $4; i99 = $6 }
        /^TPOT/ { p50 = $4; p99 = $6 }
        /^text events per output token/ { ratio = $6 }
        /^errors/ { err = $2 }
        END { printf "%s %s %s %s %s %s %s %s %s %s %s %s %s", n, c, dur, toks, tps, t50, t99,
                     i50, i99, p50, p99, ratio, err }' "$rep" 2>/dev/null)
    local rn rc dur toks tps t50 t99 i50 i99 p50 p99 ratio err
    read -r rn rc dur toks tps t50 t99 i50 i99 p50 p99 ratio err <<<"$vals"
    [ -n "${rn:-}" ] && n=$rn && c=$rc
    if [ "$status" != ok ] || [ -z "${tps:-}" ]; then
        [ "$status" = ok ] && status="no report"
        echo "| $m | $w | $tok | $n | $c | $p | $o | $status | | | | | |" >>"$TABLE"
        printf '{"model": %s, "weights": %s, "tokenizer": %s, "n": %s, "c": %s, "p": %s, "o": %s, "status": %s}\n' \
            "$(json_str "$m")" "$(json_str "$w")" "$(json_str "$tok")" "$n" "$c" "$p" "$o" \
            "$(json_str "$status")" >>"$JSON_ROWS"
        return
    fi
    echo "| $m | $w | $tok | $n | $c | $p | $o | $tps | $t50 / $t99 | $i50 / $i99 | $p50 / $p99 | $ratio | $err |" >>"$TABLE"
    num() { case $1 in '' | *[!0-9.e+-]*) echo null ;; *) echo "$1" ;; esac; }
    printf '{"model": %s, "weights": %s, "tokenizer": %s, "n": %s, "c": %s, "p": %s, "o": %s, "status": "ok", "duration_s": %s, "output_tokens": %s, "output_tok_s": %s, "ttft_ms": {"p50": %s, "p99": %s}, "itl_ms": {"p50": %s, "p99": %s}, "tpot_ms": {"p50": %s, "p99": %s}, "text_events_per_token": %s, "errors": %s}\n' \
        "$(json_str "$m")" "$(json_str "$w")" "$(json_str "$tok")" "$n" "$c" "$p" "$o" \
        "$(num "$dur")" "$(num "$toks")" "$(num "$tps")" "$(num "$t50")" "$(num "$t99")" \
        "$(num "$i50")" "$(num "$i99")" "$(num "$p50")" "$(num "$p99")" "$(num "$ratio")" \
        "$(num "$err")" >>"$JSON_ROWS"
}

# load_args C: N C P O of the load at concurrency C.
load_args() {
    case $1 in
    1) echo "$N1 1 128 256" ;;
    32) echo "$N32 32 256 256" ;;
    *) echo "$N128 $1 256 256" ;;
    esac
}

# skip_all MODEL WEIGHTS TOK STATUS: the loads of a server, not run.
skip_all() {
    local c
    for c in $LOADS; do
        # shellcheck disable=SC2046
        emit "$1" "$2" "$3" $(load_args "$c") /dev/null "$4"
    done
}

# bench MODEL WEIGHTS TOK N C P O: one load under the time left, its report
# kept, its row added.
bench() {
    local rep=$OUT/$1-$2-c$5.txt rem
    rem=$(left)
    if [ "$rem" -le 5 ]; then
        echo "-- $1 $2 C $5: skipped, time budget spent"
        emit "$@" "$rep" "skipped (time budget)"
        return
    fi
    echo "-- $1 $2: N $4, concurrency $5, prompt $6, output $7 ($rem s left)"
    timeout "$rem" "$BIN/int4serve-bench-serve" --url "http://127.0.0.1:$PORT" \
        -n "$4" -c "$5" -p "$6" -o "$7" >"$rep" 2>&1
    local rc=$?
    sed 's/^/   /' "$rep"
    if [ $rc = 124 ]; then
        emit "$@" "$rep" "cut at the time budget"
    else
        emit "$@" "$rep" ok
    fi
}

# The system's curl / python3 run without LD_LIBRARY_PATH (which may point at
# the libraries bundled for int4serve: a system curl loading another
# libcurl fails every probe) and without proxies.
healthy() {
    if command -v curl >/dev/null; then
        env -u LD_LIBRARY_PATH curl --noproxy '*' -sf -m 1 "http://127.0.0.1:$PORT/health" \
            >/dev/null 2>&1
    else
        env -u LD_LIBRARY_PATH -u http_proxy -u HTTP_PROXY python3 -c \
            "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" \
            2>/dev/null
    fi
}

for model in $MODELS; do
    case $model in
    llama2-7b) tokfile=$TOKCACHE/llama2/tokenizer.json ;;
    llama3-8b) tokfile=$TOKCACHE/llama3_1/tokenizer.json ;;
    *) tokfile= ;;
    esac
    tokargs=()
    tok=synthetic
    if [ -n "$TOKCACHE" ] && [ -n "$tokfile" ] && [ -s "$tokfile" ]; then
        tokargs=(--tokenizer "$tokfile")
        tok=real
    fi
    M=$MODEL_DIR/int4serve-bench-$model
    t0=$(ms)
    if [ "$MODEL_REUSE" = 1 ] && [ -s "$M/config.json" ]; then
        echo "== $model: the checkpoint at $M, as it is"
    elif ! rm -rf "$M" ||
        # shellcheck disable=SC2086
        ! "$BIN/int4serve-mkmodel" --preset "$model" "${tokargs[@]}" ${MKARGS:-} --out "$M" >"$OUT/$model-mkmodel.log" 2>&1; then
        echo "== $model: mkmodel failed"
        tail -3 "$OUT/$model-mkmodel.log"
        continue
    fi
    t_write=$(awk -v a="$t0" -v b="$(ms)" 'BEGIN { printf "%.1f", (b - a) / 1000 }')
    echo "== $model: checkpoint written in $t_write s ($(du -sh "$M" | cut -f1)), tokenizer $tok${tokargs[1]:+ (${tokargs[1]})}"
    for weights in $WEIGHTS; do
        kvdt=auto kern=auto
        case $weights in
        *+fp8*) kvdt=fp8 ;;
        esac
        case $weights in
        *+sm75*) kern=sm75 ;;
        esac
        weights=${weights%%+*}
        case $weights in
        int4) quant=int4 keep='["embed_tokens", "lm_head"]' ;;
        int4-lmhead) quant=int4 keep='["embed_tokens"]' ;;
        fp16 | none) weights=fp16 quant=none keep='["embed_tokens", "lm_head"]' ;;
        auto) quant=auto keep='["embed_tokens", "lm_head"]' ;;
        *) echo "== unknown weights '$weights' (int4, int4-lmhead, fp16 or auto)" && continue ;;
        esac
        [ "$kvdt" = fp8 ] && weights="$weights+fp8kv"
        [ "$kern" = sm75 ] && weights="$weights+sm75"
        if [ "$(left)" -le 30 ]; then
            echo "== $model $weights: skipped, time budget spent"
            skip_all "$model" "$weights" "$tok" "skipped (time budget)"
            continue
        fi
        [ "$TP" != 1 ] && weights="$weights-tp$TP"
        cfg=$OUT/$model-$weights.toml
        log=$OUT/$model-$weights.log
        cat >"$cfg" <<EOF
[server]
host = "127.0.0.1"
port = $PORT
log_level = "info"
[model]
model = "$M"
quantization = "$quant"
keep_fp16 = $keep
max_model_len = 2048
[engine]
backend = "$BACKEND"
max_batch = 128
kv_cache_dtype = "$kvdt"
cuda_kernels = "$kern"
tp = $TP
$([ "$BACKEND" = cuda ] && echo "devices = [$DEVICES]")
[limits]
per_ip_connections = 1024
max_queue = 4096
EOF
        t0=$(ms)
        "$BIN/int4serve" --config "$cfg" >"$log" 2>&1 &
        pid=$!
        up=0
        while [ "$(left)" -gt 0 ]; do
            if healthy; then
                up=1
                break
            fi
            kill -0 $pid 2>/dev/null || break
            sleep 0.2
        done
        t_up=$(awk -v a="$t0" -v b="$(ms)" 'BEGIN { printf "%.1f", (b - a) / 1000 }')
        loaded=$(grep -m1 -o "weights loaded in .*" "$log" | sed 's/|/\//g')
        if [ $up = 0 ]; then
            why="server did not start"
            [ "$(left)" -le 0 ] && why="server not up within the time budget"
            echo "== $model $weights: $why"
            tail -5 "$log"
            echo "| $model | $weights | $t_write | $why | $loaded |" >>"$STARTUP"
            skip_all "$model" "$weights" "$tok" "$why"
            kill $pid 2>/dev/null
            wait $pid 2>/dev/null
            continue
        fi
        echo "== $model $weights: up in $t_up s"
        grep -E "weights loaded|memory plan|engine ready" "$log" | sed 's/^/   /'
        echo "| $model | $weights | $t_write | $t_up | $loaded |" >>"$STARTUP"
        printf '{"model": %s, "weights": %s, "checkpoint_s": %s, "startup_s": %s, "weights_loaded": %s}\n' \
            "$(json_str "$model")" "$(json_str "$weights")" "$t_write" "$t_up" \
            "$(json_str "$loaded")" >>"$OUT/.startup.json"
        for c in $LOADS; do
            # shellcheck disable=SC2046
            bench "$model" "$weights" "$tok" $(load_args "$c")
        done
        kill -TERM $pid
        wait $pid
        grep -E " W | E " "$log" | head -5
    done
    [ "$MODEL_REUSE" = 1 ] || rm -rf "$M"
done

{
    echo '{"rows": ['
    sed '$!s/$/,/' "$JSON_ROWS"
    echo '], "startup": ['
    [ -f "$OUT/.startup.json" ] && sed '$!s/$/,/' "$OUT/.startup.json"
    printf '], "elapsed_s": %s}\n' "$(($(date +%s) - T_START))"
} >"$OUT/results.json"
rm -f "$JSON_ROWS" "$OUT/.startup.json"
echo
echo "TTFT: sent -> first event carrying text. ITL: per text event (the server"
echo "sends no event for a token without text). TPOT: per request, (last event -"
echo "first text event) / (completion_tokens - 1). Output tok/s from usage counts."
echo
cat "$STARTUP"
echo
cat "$TABLE"
echo
echo "elapsed $(($(date +%s) - T_START)) s; results in $OUT"
