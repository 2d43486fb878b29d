#!/usr/bin/env bash
# Builds, on THIS machine (which has every dependency), the GPU test and GPU bench programs that
# scripts/device/check.sh runs on the GPU machine: Release, sm_90a, in build/cuda
# (cmake --preset cuda). Only those targets are built (nvcc is slow). Then run collect.sh.
#   JOBS=2 bash scripts/device/build_here.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
JOBS=${JOBS:-$(nproc)}

# One target per tests/cuda/*_test.cpp and bench/bench_gpu_*.cpp (the CMake target is the name).
targets=()
for source in tests/cuda/*_test.cpp bench/bench_gpu_*.cpp bench/bench_gpu_*.cu; do
  [ -e "$source" ] || continue
  name=$(basename "$source")
  name=${name%.*}
  targets+=("$name")
done
[ ${#targets[@]} -gt 0 ] || { echo "build_here: no GPU tests or benches found"; exit 1; }

apps=OFF
if compgen -G "bench/bench_gpu_*" > /dev/null; then apps=ON; fi  # benches need the apps dir
if [ -d apps/mlakit ]; then apps=ON; targets+=(mlakit_cli); fi   # `mlakit run --device cuda`
bash scripts/fetch_cutlass.sh
cmake --preset cuda -DMLAKIT_BUILD_APPS=$apps > /dev/null
echo "build_here: building ${targets[*]} (-j $JOBS)"
cmake --build --preset cuda -j "$JOBS" --target "${targets[@]}"
echo "build_here: done; now: bash scripts/device/collect.sh"
