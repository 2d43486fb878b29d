#!/usr/bin/env bash
# The main job: installs dependencies, builds mlakit (Release) and runs `mlakit run` on its
# default workload. Extra arguments go to `mlakit run` (e.g. --verify, --preset deepseek-v3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
cmake --preset release > /dev/null
cmake --build --preset release --target mlakit_cli
source scripts/cpu_env.sh
exec build/release/apps/mlakit/mlakit run "$@"
