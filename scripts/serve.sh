#!/usr/bin/env bash
# Install what is missing, build a Release int4serve in build/, and start the
# daemon on its default configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
int4serve_install_deps
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
exec ./build/server/int4serve "$@"
