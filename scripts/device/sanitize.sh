#!/usr/bin/env bash
# Runs ON the GPU machine (like check.sh, with .devbin carried): a small subset of the GPU tests
# under compute-sanitizer memcheck and racecheck. Prints one line per run and the sanitizer's
# summary; exit 0 only when every run is clean.
#   device run: command "bash scripts/device/sanitize.sh", carry [".devbin"]
set -uo pipefail
cd "$(dirname "$0")/../.."
LIBDIR=/tmp/mlakit-devlib
rm -rf "$LIBDIR" && mkdir -p "$LIBDIR" && tar -C "$LIBDIR" -xzf .devbin/lib.tar.gz
export LD_LIBRARY_PATH="$LIBDIR/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -f .devbin/programs.tar.gz ] && tar -C .devbin -xzf .devbin/programs.tar.gz  # collect.sh packs them
BIN=.devbin/bin
echo "commit $(cat .devbin/COMMIT 2>/dev/null || echo unknown); $($SANITIZER --version | tail -n 1)"

# Small cases only: the sanitizers slow kernels down by one to two orders of magnitude.
declare -a RUNS=(
  "memcheck cuda_cache_write_test *"
  "memcheck cuda_cache_gather_test *"
  "memcheck cuda_merge_test *"
  "memcheck cuda_prefill_test CudaPrefill.TileBoundaries:CudaPrefill.EmptyRequestsAndRowsPastTheLastRequest:CudaPrefill.BadSeqlens*"
  "memcheck decode_cuda_test MlaDecodeCuda.StridedQueryOutputAndLse:MlaDecodeCuda.EmptyRequestsNeverTouchTheTable:MlaDecodeCuda.BadDeviceIndicesGiveNanRows"
  "memcheck cuda_forward_test CudaForward.ContextInManyChunksAndPaddedDecodes"
  "racecheck cuda_merge_test *"
  "racecheck cuda_prefill_test CudaPrefill.TileBoundaries"
  "racecheck decode_cuda_test MlaDecodeCuda.StridedQueryOutputAndLse"
  "memcheck decode_cuda_test MlaDecodeCuda.SixtyFourRowTilesOverSixteenBitCaches"
  "racecheck decode_cuda_test MlaDecodeCuda.SixtyFourRowTilesOverSixteenBitCaches"
  "racecheck cuda_prefill_test CudaPrefill.EmptyRequestsAndRowsPastTheLastRequest"
)
failed=0
for run in "${RUNS[@]}"; do
  read -r tool test filter <<< "$run"
  start=$SECONDS
  timeout 150 "$SANITIZER" --tool "$tool" --error-exitcode 99 "$BIN/$test" \
    --gtest_filter="$filter" --gtest_brief=1 > "/tmp/san.log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" /tmp/san.log | tail -n 1)
  echo "$([ $rc -eq 0 ] && echo CLEAN || echo FAIL)  $tool $test [$filter] exit $rc, $((SECONDS - start)) s: $summary"
  if [ $rc -ne 0 ]; then
    failed=1
    grep -E "=========|FAILED|Failure" /tmp/san.log | head -n 20
  fi
done
exit $failed
