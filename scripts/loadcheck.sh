#!/usr/bin/env bash
# Load check (not a test): start int4serve, drive POST /v1/completions with wrk
# (deploy/wrk/completions.lua) over 64 connections for 30 s, and check that
# every response was 2xx, that the daemon is still alive and exits 0 on
# SIGTERM, and how its RSS moved. Prints a summary block for docs/PERF.md.
#
#   scripts/loadcheck.sh                      # the tiny CPU model in models/tiny
#   BACKEND=mock scripts/loadcheck.sh         # the deterministic mock model
#
# Environment: BIN (default build/server/int4serve), BACKEND (cpu), MODEL
# (models/tiny; made with int4serve-mkmodel --preset tiny when missing), CONNS
# (64), THREADS (2), DURATION (30s), MAX_TOKENS (64), TIMEOUT (60s: a request
# slower than this counts as a wrk error), EXTRA (more daemon flags).
# The acceptance run: CONNS=256 DURATION=60s scripts/loadcheck.sh
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-build/server/int4serve}
BACKEND=${BACKEND:-cpu}
MODEL=${MODEL:-models/tiny}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
DURATION=${DURATION:-30s}
MAX_TOKENS=${MAX_TOKENS:-64}
TIMEOUT=${TIMEOUT:-60s}
MKMODEL=${MKMODEL:-build/tools/mkmodel/int4serve-mkmodel}

command -v wrk >/dev/null || { echo "loadcheck: wrk is not installed (apt-get install wrk)"; exit 2; }
[ -x "$BIN" ] || { echo "loadcheck: $BIN not built"; exit 2; }

if [ "$BACKEND" = cpu ] && [ ! -f "$MODEL/config.json" ]; then
    [ -x "$MKMODEL" ] || { echo "loadcheck: no model in $MODEL and no $MKMODEL to make one"; exit 2; }
    mkdir -p "$(dirname "$MODEL")"
    "$MKMODEL" --out "$MODEL" --preset tiny
fi

tmp=$(mktemp -d)
pid=
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

# Port 0: the daemon binds a free port and logs it.
# The default configuration but for the address (and EXTRA, e.g.
# "--set limits.max_queue=512").
# shellcheck disable=SC2086
"$BIN" --backend "$BACKEND" --model "$MODEL" --host 127.0.0.1 --port 0 \
    --log-level info ${EXTRA:-} >"$tmp/server.log" 2>&1 &
pid=$!
port=
for _ in $(seq 1 600); do
    port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/server.log" | head -n1)
    if [ -n "$port" ] && curl -fsS "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1; then
        break
    fi
    kill -0 "$pid" 2>/dev/null || { echo "loadcheck: the server exited:"; cat "$tmp/server.log"; exit 1; }
    sleep 0.1
done
[ -n "$port" ] || { echo "loadcheck: the server did not come up"; cat "$tmp/server.log"; exit 1; }
name=$(curl -fsS "http://127.0.0.1:$port/v1/models" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')

# Warm up, then sample the RSS the load starts from.
for _ in 1 2 3 4; do
    curl -fsS "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\":\"$name\",\"prompt\":\"warm up\",\"max_tokens\":8}" >/dev/null
done
rss_before=$(rss_kib "$pid")
# The RSS every 5 s while the load runs: flat, or growing.
(while kill -0 "$pid" 2>/dev/null; do rss_kib "$pid" >>"$tmp/rss"; sleep 5; done) &
sampler=$!

INT4SERVE_MODEL=$name INT4SERVE_MAX_TOKENS=$MAX_TOKENS \
    wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --timeout "$TIMEOUT" --latency \
    -s deploy/wrk/completions.lua \
    "http://127.0.0.1:$port" | tee "$tmp/wrk.out"
kill "$sampler" 2>/dev/null || true
wait "$sampler" 2>/dev/null || true

alive=yes
kill -0 "$pid" 2>/dev/null || alive=no
rss_after=$( [ "$alive" = yes ] && rss_kib "$pid" || echo 0)
gen=$(curl -fsS "http://127.0.0.1:$port/metrics" | awk '$1=="int4serve_generation_tokens_total" {print $2}')
non2xx=$(sed -n 's/.*Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p' "$tmp/wrk.out")
non2xx=${non2xx:-0}
sockerr=$(grep -c "Socket errors" "$tmp/wrk.out" || true)
kill -TERM "$pid"
set +e
wait "$pid"
exit_status=$?
set -e
pid=

echo
echo "### loadcheck summary"
echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); machine: $(nproc) CPUs, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n1)"
echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); backend: $BACKEND; model: $name"
echo "- wrk: $THREADS threads, $CONNS connections, $DURATION, timeout $TIMEOUT, max_tokens $MAX_TOKENS"
echo "- $(grep -E '^Requests/sec' "$tmp/wrk.out")"
echo "- $(grep -E 'requests in' "$tmp/wrk.out" | sed 's/^ *//')"
echo "- latency p50/p99: $(awk '$1=="50%" {a=$2} $1=="99%" {b=$2} END {print a " / " b}' "$tmp/wrk.out")"
echo "- non-2xx responses: $non2xx; socket error lines: $sockerr; generated tokens (server): $gen"
echo "- RSS before/after: $((rss_before / 1024)) MiB / $((rss_after / 1024)) MiB; during the load (every 5 s, MiB): $(awk '{printf "%s%d", sep, $1 / 1024; sep = " "}' "$tmp/rss" 2>/dev/null)"
echo "- alive after the load: $alive; exit status on SIGTERM: $exit_status"
[ "$non2xx" -eq 0 ] && [ "$sockerr" -eq 0 ] && [ "$alive" = yes ] && [ "$exit_status" -eq 0 ]
