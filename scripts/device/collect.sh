#!/usr/bin/env bash
# Copies the GPU test and bench programs built by build_here.sh, and the shared libraries they
# need that the GPU machine may lack (OpenBLAS, gfortran, quadmath, gomp, ...), into .devbin/
# (git-ignored), to be carried to the GPU machine. Not copied: the C/C++ runtime (the machine's
# newer glibc and libstdc++ serve), the CUDA driver, runtime and cuBLAS (the machine has CUDA 13).
#   bash scripts/device/collect.sh        -> .devbin/programs.tar.gz (bin/*, libmlakit_c.so), .devbin/lib.tar.gz
#   ONLY="decode_cuda_test bench_gpu_decode" bash scripts/device/collect.sh   -> just those programs
#   (the ones check.sh's ONLY will run; build them with cmake --build --preset cuda --target ...)
#   EXTRA="/tmp/ab/bench_gpu_decode_base ..." also packs those programs as they are (builds of other
#   commits for an A/B run: scripts/device/ab.sh)
#   TESTS_ONLY=1 packs the GPU test programs alone (no bench, no CLI, no C library): what
#   sanitize.sh runs. The ones that need two GPUs (dcp_nccl_*) stay out unless ONLY names them:
#   on the one-GPU kinds they only skip, and with them the set is over the carry limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/cuda}
# The device tool carries at most 64 MiB with the working tree.
LIMIT_BYTES=$((56 * 1024 * 1024))

rm -rf .devbin
mkdir -p .devbin/bin .devbin/lib

found=0
sources=(tests/cuda/*_test.cpp)
[ "${TESTS_ONLY:-0}" = 1 ] || sources+=(bench/bench_gpu_*.cpp bench/bench_gpu_*.cu)
for source in "${sources[@]}"; do
  [ -e "$source" ] || continue
  name=$(basename "$source")
  name=${name%.*}
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then continue; fi
  if [ -z "${ONLY:-}" ] && [ "${TESTS_ONLY:-0}" = 1 ] && [[ "$name" == dcp_nccl_* ]]; then continue; fi
  binary=""
  for dir in "$BUILD/tests" "$BUILD/bench"; do
    if [ -x "$dir/$name" ]; then binary="$dir/$name"; fi
  done
  if [ -z "$binary" ]; then
    echo "collect: $name was not built (run scripts/device/build_here.sh)"
    exit 1
  fi
  cp "$binary" .devbin/bin/
  strip --strip-unneeded ".devbin/bin/$name"
  found=$((found + 1))
done
[ "$found" -gt 0 ] || { echo "collect: nothing to collect"; exit 1; }
for binary in ${EXTRA:-}; do
  cp "$binary" .devbin/bin/
  strip --strip-unneeded ".devbin/bin/$(basename "$binary")"
done
# The CLI, for `mlakit info` and `mlakit run --device cuda --verify` (check.sh), when built.
if [ "${TESTS_ONLY:-0}" != 1 ] && [ -x "$BUILD/apps/mlakit/mlakit" ]; then
  cp "$BUILD/apps/mlakit/mlakit" .devbin/bin/mlakit
  strip --strip-unneeded .devbin/bin/mlakit
fi

# The C library of the Python package (its torch tests run on the device too), when built:
#   cmake --build --preset cuda --target mlakit_c
if [ "${TESTS_ONLY:-0}" != 1 ] && [ -f "$BUILD/src/capi/libmlakit_c.so" ]; then
  cp -L "$BUILD/src/capi/libmlakit_c.so" .devbin/libmlakit_c.so
  strip --strip-unneeded .devbin/libmlakit_c.so
fi

# Libraries: everything ldd resolves except the system C/C++ runtime and CUDA's own.
# libnccl (~200 MiB, over the carry limit) comes from the GPU machine's CUDA or torch wheels.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libcublasLt|libnvidia|libnccl)'
for binary in .devbin/bin/* .devbin/libmlakit_c.so; do
  [ -e "$binary" ] || continue
  ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r soname path; do
  if [[ "$soname" =~ $skip ]]; then continue; fi
  cp -L "$path" ".devbin/lib/$soname"
done
tar -C .devbin -czf .devbin/lib.tar.gz lib
# The device copy of the tree has no .git: record what was built.
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ":(exclude).devbin" || echo "+uncommitted")" > .devbin/COMMIT
rm -rf .devbin/lib
# Programs and the C library packed too (about 3.5x smaller): the carry limit is 64 MiB.
tar -C .devbin -czf .devbin/programs.tar.gz bin $([ -f .devbin/libmlakit_c.so ] && echo libmlakit_c.so)
rm -rf .devbin/bin .devbin/libmlakit_c.so

bytes=$(du -sb .devbin | cut -f1)
echo "collect: $found programs; libraries: $(tar -tzf .devbin/lib.tar.gz | grep -c '\.so') ($(du -h .devbin/lib.tar.gz | cut -f1) packed); .devbin is $((bytes / 1024 / 1024)) MiB"
if [ "$bytes" -gt "$LIMIT_BYTES" ]; then
  echo "collect: warning: .devbin is over $((LIMIT_BYTES / 1024 / 1024)) MiB; the device tool may refuse to carry it"
fi
