#!/usr/bin/env bash
# Runs ON the GPU machine (device tool, carry [".devbin"]): Nsight Compute on one decode shape of
# bench_gpu_decode, for the stall reasons per SASS instruction (docs/perf-notes.md, decode h_q 128).
#   SHAPE="B128 s_kv 4096 h_q 128 bf16" KERNEL=wgmma bash scripts/device/profile_decode.sh
# Writes $OUT/ncu_summary.txt (speed of light, warp states, memory) and $OUT/ncu_source.csv (per
# instruction: samples and stall reasons; sum them by address range to place the time).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/mlakit-profile}
SHAPE=${SHAPE:-"B128 s_kv 4096 h_q 128 bf16"}
KERNEL=${KERNEL:-wgmma}
mkdir -p "$OUT"
source scripts/device/devbin_env.sh || exit 2
# --launch-skip 3: past the bench's warm-up launches; clocks left alone (the device notes ask it).
common=(--clock-control none --kernel-name "regex:$KERNEL" --launch-skip 3 --launch-count 1)
timeout 200 ncu "${common[@]}" --section SpeedOfLight --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section SourceCounters --print-details all \
  .devbin/bin/bench_gpu_decode --only "$SHAPE" > "$OUT/ncu_summary.txt" 2>&1
timeout 200 ncu "${common[@]}" --section SourceCounters --section WarpStateStats \
  --page source --print-source sass --csv \
  .devbin/bin/bench_gpu_decode --only "$SHAPE" > "$OUT/ncu_source.csv" 2>&1
grep -E "Duration|Throughput|Stall" "$OUT/ncu_summary.txt" | head -30
