#!/usr/bin/env bash
# The int4serve binary's exit statuses and messages: 0 for --help, --version
# and --print-config; 2 for bad flags or configuration and for what a
# restart cannot fix at start-up (a model folder missing, not a folder or
# not matching its config.json, a KV budget too small for one sequence, an
# address that cannot be bound), each message naming the key, its value and
# where it was set, and the model folder. The address is bound before the
# model loads: a port in use fails before any loading.
# Usage: main_test.sh path/to/int4serve path/to/int4serve-mkmodel
set -uo pipefail
bin=$1
mkmodel=$2
tmp=$(mktemp -d)
blocker=
trap '[ -n "$blocker" ] && kill "$blocker" 2>/dev/null; rm -rf "$tmp"' EXIT
failures=0

fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}

# expect STATUS NEEDLE STREAM -- ARGS...: run, check the status and that the
# stream (out|err) contains NEEDLE.
expect() {
    local want=$1 needle=$2 stream=$3
    shift 4
    "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    [ "$rc" -eq "$want" ] || fail "int4serve $* exited $rc, want $want: $(head -c 300 "$tmp/err")"
    grep -qF -- "$needle" "$tmp/$stream" || fail "int4serve $*: $stream lacks '$needle'"
}

# A port nobody listens on (the test binds it only to read it back).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)

expect 0 "max_batch = 128" out -- --help
expect 0 "--set KEY=VALUE" out -- -h --bogus
expect 0 "int4serve 0.1.0" out -- --version
expect 2 "unknown flag '--bogus' (see --help)" err -- --bogus
expect 2 "--max-batch: must be in [1, 1024], got 0" err -- --max-batch 0

printf '[engine]\nkv_cache_dtype = "fp8_e5m2"\n' >"$tmp/kv.toml"
expect 2 "$tmp/kv.toml:2: key 'engine.kv_cache_dtype': must be one of \"auto\", \"fp16\", \"fp8\", got \"fp8_e5m2\"" err -- --config "$tmp/kv.toml"
expect 2 "--set engine.kv_cache_dtype: must be one of \"auto\", \"fp16\", \"fp8\", got \"int8\"" err -- --set engine.kv_cache_dtype=int8
expect 2 "--set engine.cuda_kernels: must be one of \"auto\", \"sm75\", got \"sm70\"" err -- --set engine.cuda_kernels=sm70

printf '[engine]\nmax_batch = 0\n' >"$tmp/bad.toml"
expect 2 "$tmp/bad.toml:2: key 'engine.max_batch': must be in [1, 1024], got 0" err -- --config "$tmp/bad.toml"

# No model in the test's folder: the key, the path and where it was set.
cd "$tmp"
expect 2 'int4serve: model.model = "models/kjv-demo" (default): the model folder cannot be opened: No such file or directory' err --
expect 2 "config engine.max_batch = 128 (default)" err --
expect 2 "config server.port = $port (--port)" err -- --port "$port"
expect 2 "model.model = \"$tmp/none\" (--model): the model folder cannot be opened" err -- --model "$tmp/none"
printf 'x' >"$tmp/file"
expect 2 "model.model = \"$tmp/file\" (--model): is not a folder" err -- --model "$tmp/file"
mkdir -p "$tmp/empty"
expect 2 "model.model = \"$tmp/empty\" (--model): config.json: cannot open: No such file or directory" err -- --model "$tmp/empty" --port "$port"

# A checkpoint that does not match its config.json.
"$mkmodel" --out "$tmp/m" --preset tiny >/dev/null || fail "mkmodel failed"
cp -r "$tmp/m" "$tmp/mismatch"
sed -i 's/"intermediate_size": [0-9]*/"intermediate_size": 512/' "$tmp/mismatch/config.json"
expect 2 "model.model = \"$tmp/mismatch\" (--model): model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape" err -- --model "$tmp/mismatch" --port "$port"
# A KV budget too small for one sequence.
expect 2 "engine.kv_cache_tokens = 16 (--set engine.kv_cache_tokens): 16 tokens cannot hold one sequence of max_model_len" err -- --model "$tmp/m" --port "$port" --set engine.kv_cache_tokens=16
grep -qF "for model.model = \"$tmp/m\" (--model)" "$tmp/err" || fail "the KV budget message does not name the model folder"
expect 2 "engine.backend = \"cuda\" (--backend)" err -- --model "$tmp/m" --port "$port" --backend cuda --log-level error

# The address before the model: a bad host, a port in use, each named.
expect 2 'server.host = "nosuch.invalid" (--host): cannot resolve' err -- --model "$tmp/m" --host nosuch.invalid
"$bin" --backend mock --port "$port" --log-level error >/dev/null 2>&1 &
blocker=$!
for _ in $(seq 1 100); do
    grep -q ":$(printf '%04X' "$port") " /proc/net/tcp 2>/dev/null && break
    sleep 0.05
done
expect 2 "server.port = $port (--port): cannot listen on 127.0.0.1:$port: Address already in use" err -- --model "$tmp/m" --port "$port"
grep -q " eng " "$tmp/err" && fail "the model was loaded before the port was found in use"
kill "$blocker"
wait "$blocker" 2>/dev/null
blocker=

# The API key never reaches the log.
INT4SERVE_API_KEY=topsecret-value "$bin" >"$tmp/out" 2>"$tmp/err"
grep -q "topsecret-value" "$tmp/err" && fail "the API key appears in the log"
grep -qF 'config server.api_key = "****" (INT4SERVE_API_KEY)' "$tmp/err" || fail "api_key is not logged masked"

# --print-config writes a file the daemon reads back; log_level applies.
"$bin" --print-config --max-batch 7 >"$tmp/printed.toml" || fail "--print-config failed"
expect 2 "config engine.max_batch = 7 ($tmp/printed.toml:" err -- --config "$tmp/printed.toml"
expect 2 "int4serve: " err -- --log-level error
grep -q " I srv " "$tmp/err" && fail "--log-level error still writes INFO lines"

[ "$failures" -eq 0 ] && echo "OK" || exit 1
