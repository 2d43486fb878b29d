#!/usr/bin/env bash
# Runs ON the GPU machine (like check.sh, with .devbin carried): every GPU test program that
# collect.sh packed (the tests/cuda/*_test.cpp programs, .devbin/bin/*_test) under each of
# compute-sanitizer's tools: memcheck, racecheck, synccheck and initcheck. Prints one line per run
# and a summary table (program x tool), writes the table to $OUT/sanitize.md and every run's output
# to $OUT/sanitize.log. Exit 0 only when every run finished clean, ran at least one test and
# skipped none (MLAKIT_ALLOW_SKIPS=1 allows skips, for a dry run without a GPU; MAY_SKIP programs,
# as in check.sh, may skip on a one-GPU machine or without libnccl).
#   build here: TESTS_ONLY=1 bash scripts/device/collect.sh (every GPU test program but the two-GPU
#   ones, under the carry limit); device run: command "bash scripts/device/sanitize.sh", carry
#   [".devbin"]. The four tools over every program took ~7 min on an H100 (2026-12-06; two calls:
#   memcheck + synccheck + initcheck 125 s, racecheck 289 s).
#   TOOLS="memcheck racecheck" / ONLY="decode_cuda_test cuda_prefill_test" narrow the runs (e.g.
#   to split them over two device calls).
#
# Verdicts: CLEAN; NO GPU WORK (the program's tests passed and it made no CUDA call, e.g. host-only
# planners and the CPU emulation of kernel source); ALLOWED SKIPS; anything else fails the run.
# racecheck: a run whose hazards are all inside cuBLAS's kernels (nvjet*) is CUBLAS ONLY, which
# passes; reports are capped at 20 per run (--print-limit), so only the printed ones are checked.
#
# Time: the whole run must fit one device call (10 min), so it stops starting runs after 8 min and
# reports the rest as NOT RUN (a failure). The sanitizers slow kernels down 10-100x; programs that
# take more than a few seconds natively run a gtest filter (FILTERS below) that still reaches every
# kernel family they launch; the others run whole.
set -uo pipefail
cd "$(dirname "$0")/../.."
# NVLink SHARP (multicast) stays off on the lent machines (docs/dcp.md).
export NCCL_NVLS_ENABLE=0
# Programs that may skip, as in check.sh: they need >= 2 GPUs, or the machine's libnccl.
MAY_SKIP=" dcp_nccl_test dcp_nccl_attention_test "
OUT=${OUT:-/tmp/mlakit-device-sanitize}
mkdir -p "$OUT"
LOG="$OUT/sanitize.log"
TABLE="$OUT/sanitize.md"
: > "$LOG"
# Starts no run after SANITIZE_BUDGET_S (default 8 min); one run may take RUN_TIMEOUT more.
DEADLINE=$((SECONDS + ${SANITIZE_BUDGET_S:-480}))
RUN_TIMEOUT=${RUN_TIMEOUT:-150}
TOOLS=${TOOLS:-memcheck racecheck synccheck initcheck}

# Programs run with a filter under the sanitizers (native run times from check.sh on the H200):
declare -A FILTERS=(
  # 15 s natively: chunked context + padded decodes (gather, prefill, merge, decode, cuBLAS) and
  # the 128-head layer (the wgmma decode and prefill paths).
  [cuda_forward_test]="CudaForward.ContextInManyChunksAndPaddedDecodes:CudaForward.OneHundredTwentyEightHeads"
  # Both decode kernels (16-row mma.sync, 64-row wgmma), every cache format (bf16, f16, fp8 e4m3,
  # fp8_ds_mla; the wgmma kernel's convert warpgroup over both fp8 formats, NaN tile scales), q
  # tiles by TMA and by threads, strided outputs, bad device indices, empty requests, errors.
  # The plan kernel runs in every one of them; the planned-ahead case adds the plan written once
  # for several decodes.
  [decode_cuda_test]="MlaDecodeCuda.StridedQueryOutputAndLse:MlaDecodeCuda.EmptyRequestsNeverTouchTheTable:MlaDecodeCuda.BadDeviceIndicesGiveNanRows:MlaDecodeCuda.SixtyFourRowTilesOverSixteenBitCaches:MlaDecodeCuda.SixtyFourRowTilesOverEveryPageShape:MlaDecodeCuda.SixtyFourRowTilesOverFp8E4m3Caches:MlaDecodeCuda.SixtyFourRowTilesOverFp8DsMlaCaches:MlaDecodeCuda.NanDsMlaTileScalesPropagate:MlaDecodeCuda.SixteenRowTilesOverFp8PageShapes:MlaDecodeCuda.QTilesByTmaAndByThreads:MlaDecodeCuda.NanCacheValuesPropagate:MlaDecodeCuda.ManyHeads:MlaDecodeCuda.CacheFormatsScalesAndOutputDtypes:MlaDecodeCuda.PlannedAheadScheduleServesSeveralDecodes:MlaDecodeCudaErrors.*"
  # 26 s natively, most of it the 16384-token request's host reference rows: every other case
  # (varlen batches, tile boundaries, NaN isolation, 16 / 128 heads, empty requests, f32 out, the
  # mma.sync path, device-side bad seqlens).
  [cuda_prefill_test]="*-CudaPrefill.LongVarlenRequestsAgainstSampledReferenceRows"
  # 7 s natively and no kernel at all (the decode kernels emulated on the host): one case.
  [decode_emulated_test]="MlaDecodeEmulated.Bf16SixteenRows"
)

# Narrower filters under initcheck, which tracks every byte's initialization: cuda_forward_test's
# two cases ran past 150 s under it (2026-12-03); one of them still covers the gather, prefill,
# merge, decode and cuBLAS paths.
declare -A INITCHECK_FILTERS=(
  [cuda_forward_test]="CudaForward.ContextInManyChunksAndPaddedDecodes"
)

say() { echo "$@" | tee -a "$LOG"; }
selected() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }

# The programs and libraries carried in .devbin (collect.sh).
source scripts/device/devbin_env.sh || exit 2
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ ! -x "$SANITIZER" ]; then
  say "sanitize: compute-sanitizer not found"
  exit 2
fi

say "commit $(cat .devbin/COMMIT 2>/dev/null || echo unknown); $("$SANITIZER" --version | tail -n 1)"
say "device $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n 1)"

programs=()
for binary in .devbin/bin/*_test; do
  [ -x "$binary" ] || continue
  name=$(basename "$binary")
  selected "$name" && programs+=("$name")
done
[ ${#programs[@]} -gt 0 ] || { say "sanitize: no test program selected"; exit 2; }

declare -A RESULT
failed=0
for tool in $TOOLS; do
  for name in "${programs[@]}"; do
    filter=${FILTERS[$name]:-*}
    [ "$tool" = initcheck ] && filter=${INITCHECK_FILTERS[$name]:-$filter}
    if [[ "$MAY_SKIP" == *" $name "* ]] && ldd ".devbin/bin/$name" | grep -q "not found"; then
      RESULT[$name,$tool]="ALLOWED SKIP (misses libraries)"
      say "SKIP     $tool $name (misses $(ldd ".devbin/bin/$name" | awk '/not found/ {print $1}' |
        tr '\n' ' ')- allowed for this program)"
      continue
    fi
    if [ "$SECONDS" -ge "$DEADLINE" ]; then
      RESULT[$name,$tool]="NOT RUN"
      say "NOT RUN  $tool $name (time budget spent)"
      failed=1
      continue
    fi
    start=$SECONDS
    run_log=/tmp/sanitize-$tool-$name.log
    timeout "$RUN_TIMEOUT" "$SANITIZER" --tool "$tool" --error-exitcode 99 --print-limit 20 \
      ".devbin/bin/$name" --gtest_filter="$filter" --gtest_brief=1 > "$run_log" 2>&1
    rc=$?
    seconds=$((SECONDS - start))
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$run_log" | tail -n 1 | sed 's/^=* *//')
    passed=$(grep -oE '^\[ +PASSED +\] [0-9]+' "$run_log" | grep -oE '[0-9]+$' | head -n 1)
    skipped=$(grep -oE '^\[ +SKIPPED +\] [0-9]+' "$run_log" | grep -oE '[0-9]+$' | head -n 1)
    verdict=CLEAN
    if [ "$rc" -eq 124 ]; then
      verdict="TIMEOUT"
    elif [ "$rc" -eq 99 ] && [ "$tool" = racecheck ] && ! grep -q FAILED "$run_log" &&
      ! grep "Race reported" "$run_log" | grep -qv "nvjet"; then
      # Every hazard inside cuBLAS's own GEMM kernels (nvjet*: their TMA / mbarrier pipelines),
      # none in ours. (--kernel-name-exclude kns=nvjet made compute-sanitizer 2025.3 fail with
      # "Internal Sanitizer Error" on the programs that call cuBLAS, 2026-12-03.)
      verdict="CUBLAS ONLY"
    elif [ "$rc" -eq 99 ]; then
      verdict="ERRORS"
    elif [ "$rc" -eq 255 ] && [ "${passed:-0}" -gt 0 ] && ! grep -q "FAILED" "$run_log" &&
      grep -q "terminated before first instrumented API call" "$run_log"; then
      verdict="NO GPU WORK"  # the program's tests passed without one CUDA call: nothing to check
    elif [ "$rc" -ne 0 ]; then
      verdict="FAIL (exit $rc)"
    elif [ "${skipped:-0}" -gt 0 ] && [[ "$MAY_SKIP" == *" $name "* ]]; then
      verdict="ALLOWED SKIPS $skipped"  # e.g. fewer than 2 GPUs; the tests that ran were clean
    elif [ "${passed:-0}" -eq 0 ]; then
      verdict="NO TESTS"  # a filter that matched nothing must not pass as clean
    elif [ "${skipped:-0}" -gt 0 ] && [ "${MLAKIT_ALLOW_SKIPS:-0}" != 1 ]; then
      verdict="SKIPPED $skipped"
    fi
    RESULT[$name,$tool]="$verdict, ${seconds} s"
    say "$(printf '%-8s %-10s %-28s %4d s  %s tests  %s' "${verdict%% *}" "$tool" "$name" \
      "$seconds" "${passed:-0}" "$summary") $([ "$filter" != "*" ] && echo "[filtered]")"
    { echo "===== $tool $name [$filter]: $verdict"; cat "$run_log"; } >> "$LOG"
    if [ "$verdict" != CLEAN ] && [ "$verdict" != "NO GPU WORK" ] && [ "$verdict" != "CUBLAS ONLY" ] &&
      [[ "$verdict" != "ALLOWED SKIPS"* ]]; then
      failed=1
      grep -E "^========= (Invalid|Race|Barrier|Uninitialized|Error|Program hit)|FAILED|Failure" \
        "$run_log" | head -n 10
    fi
  done
done

{
  echo "| program | filter | $(echo $TOOLS | sed 's/ / | /g') |"
  echo "|---|---|$(for _ in $TOOLS; do printf -- '---|'; done)"
  for name in "${programs[@]}"; do
    row="| $name | ${FILTERS[$name]:-all tests} |"
    for tool in $TOOLS; do row="$row ${RESULT[$name,$tool]:-NOT RUN} |"; done
    echo "$row"
  done
} > "$TABLE"
say ""
cat "$TABLE" | tee -a "$LOG"
say "== $([ $failed -eq 0 ] && echo "every run clean" || echo "NOT CLEAN") ($SECONDS s); log $LOG"
exit $failed
