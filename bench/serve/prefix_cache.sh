#!/usr/bin/env bash
# Automatic prefix caching, on against off: one synthetic checkpoint
# (int4serve-mkmodel), served twice by int4serve, once with
# engine.prefix_caching = true and once with false, a fresh server each
# time; each server gets two loads from int4serve-bench-serve, every request
# ignore_eos, greedy and streamed:
#   (a) plain:  N requests at concurrency C, prompts of SHARED + SUFFIX
#               distinct random ids (no prefix in common), output O
#   (b) shared: N requests at concurrency C, every prompt the same SHARED
#               ids then SUFFIX ids of its own, output O
# Reported per load: output tokens/s, TTFT p50 / p99, TPOT p50 and the
# prefix cache's hit rate from /metrics; then the ratios on / off.
#
# Usage: prefix_cache.sh BIN_DIR OUT_DIR
#   BIN_DIR holds int4serve, int4serve-bench-serve and int4serve-mkmodel.
#   OUT_DIR receives each load's report (caching-load.txt), each server's
#   config and log, and table.md.
# Environment:
#   MODEL    mkmodel preset (default llama2-7b; small or tiny on the CPU)
#   BACKEND  cuda (default) or cpu; THREADS for the CPU backend (0: all)
#   N (512), C (32), SHARED (1024), SUFFIX (32), O (64)
#   PORT (18100), MODEL_DIR (where the checkpoint is written, /tmp)
#   BUDGET_S seconds this run may take (560): a load that would start past
#            it is skipped, and each runs under `timeout` of what is left
#
# The issue's acceptance on one H200 (BACKEND=cuda MODEL=llama2-7b, the
# defaults): on (b) TTFT p50 on / off at most 0.25 and output tok/s on / off
# at least 2; on (a) output tok/s on / off within 2%.
set -uo pipefail
if [ $# -ne 2 ]; then
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2
fi
BIN=$1
OUT=$2
MODEL=${MODEL:-llama2-7b}
BACKEND=${BACKEND:-cuda}
THREADS=${THREADS:-0}
N=${N:-512}
C=${C:-32}
SHARED=${SHARED:-1024}
SUFFIX=${SUFFIX:-32}
O=${O:-64}
PORT=${PORT:-18100}
MODEL_DIR=${MODEL_DIR:-/tmp}
BUDGET_S=${BUDGET_S:-560}
mkdir -p "$OUT" || exit 1
T_START=$(date +%s)
left() { echo $((BUDGET_S - ($(date +%s) - T_START))); }

healthy() {
    env -u LD_LIBRARY_PATH curl --noproxy '*' -sf -m 1 "http://127.0.0.1:$PORT/health" \
        >/dev/null 2>&1
}

M=$MODEL_DIR/int4serve-prefix-$MODEL
rm -rf "$M"
if ! "$BIN/int4serve-mkmodel" --preset "$MODEL" --max-pos 4096 --out "$M" >"$OUT/mkmodel.log" 2>&1; then
    echo "mkmodel failed:"
    tail -3 "$OUT/mkmodel.log"
    exit 1
fi

TABLE=$OUT/table.md
{
    echo "| load | prefix caching | N | C | prompt | O | output tok/s | TTFT p50 / p99 ms | TPOT p50 ms | prefix cache hits | errors |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$TABLE"

# field REPORT WHAT: one number of a bench report.
field() {
    awk -v w="$2" '
        /^duration/ && w == "tps" { print $NF }
        /^TTFT/ && w == "t50" { print $4 }
        /^TTFT/ && w == "t99" { print $6 }
        /^TPOT/ && w == "tpot" { print $4 }
        /^prefix cache/ && w == "hit" { for (i = 1; i <= NF; i++) if ($i ~ /%$/) print $i }
        /^errors/ && w == "err" { print $2 }' "$1" 2>/dev/null
}

for caching in true false; do
    cfg=$OUT/server-$caching.toml
    log=$OUT/server-$caching.log
    cat >"$cfg" <<EOF
[server]
host = "127.0.0.1"
port = $PORT
[model]
model = "$M"
max_model_len = 4096
[engine]
backend = "$BACKEND"
threads = $THREADS
prefix_caching = $caching
[limits]
per_ip_connections = 1024
max_queue = 4096
EOF
    "$BIN/int4serve" --config "$cfg" >"$log" 2>&1 &
    pid=$!
    while [ "$(left)" -gt 0 ] && ! healthy; do
        kill -0 $pid 2>/dev/null || break
        sleep 0.2
    done
    if ! healthy; then
        echo "== prefix_caching $caching: the server did not come up"
        tail -5 "$log"
        kill $pid 2>/dev/null
        wait $pid 2>/dev/null
        continue
    fi
    for load in plain shared; do
        rep=$OUT/$caching-$load.txt
        if [ "$(left)" -le 5 ]; then
            echo "== $load, caching $caching: skipped (time budget)"
            echo "| $load | $caching | $N | $C | | $O | skipped (time budget) | | | | |" >>"$TABLE"
            continue
        fi
        if [ $load = plain ]; then
            args=(-p $((SHARED + SUFFIX)))
            prompt="$((SHARED + SUFFIX))"
        else
            args=(--shared-prefix "$SHARED" -p "$SUFFIX")
            prompt="$SHARED shared + $SUFFIX"
        fi
        echo "== $load, caching $caching ($(left) s left)"
        timeout "$(left)" "$BIN/int4serve-bench-serve" --url "http://127.0.0.1:$PORT" -n "$N" \
            -c "$C" -o "$O" "${args[@]}" >"$rep" 2>&1
        sed 's/^/   /' "$rep"
        echo "| $load | $caching | $N | $C | $prompt | $O | $(field "$rep" tps) | $(field "$rep" t50) / $(field "$rep" t99) | $(field "$rep" tpot) | $(field "$rep" hit) | $(field "$rep" err) |" >>"$TABLE"
    done
    kill -TERM $pid
    wait $pid
    grep -E "stats: " "$log" | tail -2 | sed 's/^/   /'
done
rm -rf "$M"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.3f", a / b; else print "-" }'; }
echo
cat "$TABLE"
{
    echo
    echo "shared: TTFT p50 on / off $(ratio "$(field "$OUT/true-shared.txt" t50)" "$(field "$OUT/false-shared.txt" t50)")," \
        "output tok/s on / off $(ratio "$(field "$OUT/true-shared.txt" tps)" "$(field "$OUT/false-shared.txt" tps)");" \
        "plain: output tok/s on / off $(ratio "$(field "$OUT/true-plain.txt" tps)" "$(field "$OUT/false-plain.txt" tps)")"
} | tee -a "$TABLE"
echo "elapsed $(($(date +%s) - T_START)) s; results in $OUT"
