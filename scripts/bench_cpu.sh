#!/usr/bin/env bash
# CPU benchmarks (decode vs measured bandwidth / FMA peak, prefill vs measured sgemm), each with
# its ceilings measured in the same process. Needs the release build (scripts/test.sh or
# cmake --preset release && cmake --build --preset release).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cpu_env.sh
echo "commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "OMP_WAIT_POLICY=$OMP_WAIT_POLICY OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
build/release/bench/bench_cpu_decode
build/release/bench/bench_cpu_prefill
