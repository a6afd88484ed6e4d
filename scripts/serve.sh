#!/usr/bin/env bash
# Install what is missing, build a Release int4serve in build/ (only what
# changed), check the default model (models/kjv-demo, trained by
# tools/demo-model and committed) against its SHA256SUMS, and start the
# daemon. Arguments go to int4serve; without any, the daemon reads
# ./config.toml when there is one, and its defaults otherwise.
#   ./scripts/serve.sh --model /models/llama-3-8b --backend cuda --port 8000
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
int4serve_install_deps
if [ -f build/CMakeCache.txt ]; then
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
else
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build build -j "${JOBS:-$(nproc)}" --target int4serve
if ! (cd models/kjv-demo && sha256sum --quiet -c SHA256SUMS); then
    echo "serve.sh: models/kjv-demo does not match its SHA256SUMS (a partial clone?)" >&2
    exit 1
fi
if [ "$#" -eq 0 ] && [ -f config.toml ]; then
    set -- --config config.toml
fi
exec ./build/server/int4serve "$@"
