#!/usr/bin/env bash
# bench/cpu_decode/vs_llama2c.sh — the CPU backend against llama2.c's run.c on
# the same weights, in one run (docs/PERF.md, "CPU decode").
#
#   bench/cpu_decode/vs_llama2c.sh BIN RUNC OUT NAME=DIR [NAME=DIR ...]
#
# BIN: the build folder (bench/cpu_decode/int4serve-bench-cpu-decode and
# int4serve-to-llama2c in it); RUNC: a run.c binary built by the caller
# (gcc -Ofast -march=native -fopenmp run.c -lm -o run); OUT: a scratch
# folder for the converted checkpoints and the logs; each DIR a checkpoint
# folder from int4serve-mkmodel (presets stories15m, stories110m).
#
# Both start from token 1 at position 0 and decode greedily to position
# 255: run.c counts the 255 tokens after its first step, the bench its 255
# decode steps (each with its argmax). ROUNDS (5) rounds, THREADS ("1 2")
# in each, alternate int4serve (INT4, then INT4 with the lm_head quantized
# too) and run.c. Each run measures how many CPUs other processes used
# while it ran (/proc/stat less its own CPU time); a pair with more than
# MAX_OTHERS (0.3) is run again after a pause, up to 10 times. The table
# gives the medians; OUT/runs.log every run with its 1-minute load average
# and the others' CPUs. Every round also checks that int4serve's fp32
# greedy ids equal run.c's (printed side by side on a mismatch, and the
# script fails).
set -euo pipefail
if [ $# -lt 4 ]; then
    sed -n '2,23p' "$0" >&2
    exit 2
fi
BIN=$1 RUNC=$2 OUT=$3
shift 3
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-"1 2"}
MAX_OTHERS=${MAX_OTHERS:-0.3}
BENCH=$BIN/bench/cpu_decode/int4serve-bench-cpu-decode
CONV=$BIN/bench/cpu_decode/int4serve-to-llama2c
HZ=$(getconf CLK_TCK)
mkdir -p "$OUT"
: > "$OUT/runs.log"

busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
load1() { cut -d' ' -f1 /proc/loadavg; }

# Run "$@" (stdout to $OUT/o.txt, stderr to $OUT/e.txt); OTHERS: the CPUs
# the rest of the machine used meanwhile.
timed() {
    local b0 t0 b1 t1 own
    b0=$(busy)
    t0=$(date +%s%N)
    ("$@" > "$OUT/o.txt" 2> "$OUT/e.txt"; times > "$OUT/t.txt")
    b1=$(busy)
    t1=$(date +%s%N)
    own=$(awk 'NR == 2 {split($1, u, /[ms]/); split($2, s, /[ms]/);
                        print u[1] * 60 + u[2] + s[1] * 60 + s[2]}' "$OUT/t.txt")
    OTHERS=$(awk -v b=$((b1 - b0)) -v hz="$HZ" -v w=$((t1 - t0)) -v own="$own" \
        'BEGIN {o = (b / hz - own) / (w / 1e9); printf "%.2f", o < 0 ? 0 : o}')
}

for spec in "$@"; do
    name=${spec%%=*} dir=${spec#*=}
    [ -f "$OUT/$name.bin" ] || "$CONV" "$dir" "$OUT/$name.bin" "$OUT/$name.tok"
done

fail=0
for r in $(seq 1 "$ROUNDS"); do
    for spec in "$@"; do
        name=${spec%%=*} dir=${spec#*=}
        for t in $THREADS; do
            for try in $(seq 1 10); do
                la=$(load1)
                timed "$BENCH" --model "$name=$dir" --threads "$t" --prompt 1 --tokens 255 \
                    --weights int4,int4-lmhead
                oa=$OTHERS
                cp "$OUT/o.txt" "$OUT/i4s.txt"
                lb=$(load1)
                timed env OMP_NUM_THREADS="$t" "$RUNC" "$OUT/$name.bin" -z "$OUT/$name.tok" \
                    -t 0 -n 256
                ob=$OTHERS
                if awk -v a="$oa" -v b="$ob" -v m="$MAX_OTHERS" 'BEGIN {exit !(a <= m && b <= m)}'
                then
                    break
                fi
                echo "round $r $name $t: others used $oa / $ob CPUs; again in 30 s" >&2
                sleep 30
            done
            for w in int4 int4-lmhead; do
                v=$(awk -F'|' -v w="$w" '$4 ~ " "w" " {gsub(/ /, "", $6); print $6}' "$OUT/i4s.txt")
                echo "$r $name $t $w $v $la $oa" >> "$OUT/runs.log"
            done
            v=$(awk '/achieved tok\/s/ {print $3}' "$OUT/e.txt")
            echo "$r $name $t run.c $v $lb $ob" >> "$OUT/runs.log"
        done
        # greedy ids: int4serve fp32 against run.c (which stops early on id 1)
        "$BENCH" --model "$name=$dir" --threads 1 --prompt 1 --tokens 255 --weights fp32 \
            --print-ids | awk '/^ids / {for (i = 5; i <= NF; i++) printf "%s ", $i; print ""}' \
            > "$OUT/i4s.ids"
        OMP_NUM_THREADS=1 "$RUNC" "$OUT/$name.bin" -z "$OUT/$name.tok" -t 0 -n 256 \
            2> /dev/null > "$OUT/runc.ids"
        a=$(tr -s ' \n' ' ' < "$OUT/runc.ids" | sed 's/^ //; s/ $//')
        b=$(sed 's/ $//' "$OUT/i4s.ids")
        n=$(wc -w <<< "$a")
        if [ "$(cut -d' ' -f1-"$n" <<< "$b")" != "$a" ]; then
            echo "round $r $name: fp32 greedy ids differ" >&2
            echo "run.c:     $a" >&2
            echo "int4serve: $b" >&2
            fail=1
        else
            echo "$r $name ids-equal $n" >> "$OUT/runs.log"
        fi
    done
done

echo "| model | threads | run.c tok/s | INT4 tok/s | INT4 / run.c | INT4, lm_head INT4 tok/s | / run.c |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for spec in "$@"; do
    name=${spec%%=*}
    for t in $THREADS; do
        med() { awk -v n="$name" -v t="$t" -v w="$1" '$2 == n && $3 == t && $4 == w {print $5}' \
                "$OUT/runs.log" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
        c=$(med run.c) i=$(med int4) h=$(med int4-lmhead)
        awk -v n="$name" -v t="$t" -v c="$c" -v i="$i" -v h="$h" \
            'BEGIN {printf "| %s | %d | %.1f | %.1f | %.2fx | %.1f | %.2fx |\n", n, t, c, i, i / c, h, h / c}'
    done
done
awk 'NF == 7 {if (l == "" || $6 < l) l = $6; if ($6 > L) L = $6; if ($7 > o) o = $7}
     END {printf "1-minute load average before the runs %s to %s; other processes used at most %s CPUs during a run kept\n", l, L, o}' \
    "$OUT/runs.log"
grep -c ids-equal "$OUT/runs.log" | xargs printf "fp32 greedy ids equal to run.c's in %s checks\n"
exit $fail
