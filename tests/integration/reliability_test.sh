#!/usr/bin/env bash
# scripts/reliability.py against a fresh daemon (mock backend, a 2 s header
# deadline so that the slow-header case is short), then a clean SIGTERM.
# Usage: reliability_test.sh path/to/int4serve path/to/scripts/reliability.py
set -uo pipefail
bin=$1
script=$2
log=$(mktemp)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" --backend mock --host 127.0.0.1 --port "$port" --set server.header_timeout=2 \
    --set limits.body_limit=4MiB >"$log" 2>&1 &
pid=$!
trap 'kill -KILL "$pid" 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 200); do
    curl -fsS "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1 && break
    sleep 0.05
done
python3 "$script" --url "http://127.0.0.1:$port" --header-timeout 2 --body-limit $((4 << 20))
rc=$?
kill -TERM "$pid"
wait "$pid"
st=$?
[ "$st" -eq 0 ] || { echo "the daemon exited $st"; tail -n 30 "$log"; rc=1; }
exit "$rc"
