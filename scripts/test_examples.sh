#!/usr/bin/env bash
# Builds examples/cpp the two ways an engine consumes mlakit, and runs its programs:
#   1. find_package(mlakit) against the release build tree installed into a temporary prefix
#      (also runs the installed `mlakit` command);
#   2. add_subdirectory of this source tree, configured whole but only engine_step built (the
#      static library is compiled again, CPU only: the CUDA backend has its own build step in
#      scripts/test.sh; the C ABI program was built and run against the installed package).
# Needs the release build first: cmake --preset release && cmake --build --preset release
# (MLAKIT_BUILD_DIR names another build directory). Exit status: non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${MLAKIT_BUILD_DIR:-$PWD/build/release}
JOBS=${JOBS:-$(nproc)}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT


echo "-- examples/cpp against the installed package"
cmake --install "$BUILD_DIR" --prefix "$WORK/prefix" > /dev/null
cmake -S examples/cpp -B "$WORK/installed" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$WORK/prefix" > /dev/null
cmake --build "$WORK/installed" -j "$JOBS"
"$WORK/installed/engine_step"
"$WORK/installed/c_abi_version"
"$WORK/prefix/bin/mlakit" info > /dev/null

echo "-- examples/cpp with add_subdirectory of the source tree"
cmake -S examples/cpp -B "$WORK/in_tree" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMLAKIT_SOURCE_DIR="$PWD" -DMLAKIT_WERROR=ON -DMLAKIT_WITH_CUDA=OFF > /dev/null
cmake --build "$WORK/in_tree" -j "$JOBS" --target engine_step
"$WORK/in_tree/engine_step"
