#!/usr/bin/env bash
# The tests: installs dependencies, then
#   1. Release build with warnings as errors, all tests (GPU tests skip without a GPU), the
#      examples/cpp program built against that build installed and in-tree, then `pip install
#      ./python` (packaging that build's library) into a fresh venv and the package's pytest
#      suite against that wheel;
#   2. AddressSanitizer + UndefinedBehaviorSanitizer build, all CPU tests;
#   3. the libFuzzer targets (clang, ASan + UBSan), 40 s each on their seed corpus (the whole
#      run must stay under 30 min on a 2-core machine: it took ~31 min with 60 s each);
#   4. when nvcc exists: the CUDA backend compiled for sm_90a (and its tests run, which skip
#      cleanly on a machine without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
JOBS=$(nproc)

echo "== release build (-Werror) =="
cmake --preset release > /dev/null
cmake --build --preset release -j "$JOBS"
ctest --preset release -j "$JOBS"

echo "== examples/cpp: find_package(mlakit) of the installed release build, and add_subdirectory =="
JOBS="$JOBS" bash scripts/test_examples.sh

echo "== Python package: fresh venv, pip install ./python, pytest on the installed wheel =="
# The release build's library is packaged (no second compile; without MLAKIT_BUILD_DIR the same
# script compiles it from source, as a user's pip install does); the `mlakit bench` tests run the
# release build's command. This is the whole suite (scripts/test_python.sh runs the same suite
# against the same library in the current Python, for development).
MLAKIT_BUILD_DIR="$PWD/build/release" MLAKIT_CLI="$PWD/build/release/apps/mlakit/mlakit" \
  bash scripts/test_python_wheel.sh

echo "== ASan + UBSan build =="
cmake --preset asan > /dev/null
cmake --build --preset asan -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --preset asan -j "$JOBS"

echo "== libFuzzer smoke runs (40 s per target) =="
bash scripts/fuzz.sh 40

if command -v nvcc > /dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "== CUDA backend (sm_90a) =="
  export PATH="/usr/local/cuda/bin:$PATH"
  export NCCL_NVLS_ENABLE=0  # NVLink multicast off wherever NCCL may run (docs/dcp.md)
  bash scripts/fetch_cutlass.sh
  cmake --preset cuda > /dev/null
  cmake --build --preset cuda -j "$JOBS"
  ctest --preset cuda -j "$JOBS" -L cuda
else
  echo "== CUDA backend: skipped (no nvcc on this machine) =="
fi
