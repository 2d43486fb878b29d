#!/usr/bin/env bash
# Runs ON the GPU machine (device tool, carry [".devbin"]): issue 10's measurements in one call.
#   1. cuda_prefill_test (the prefill kernels against the fp64 oracle);
#   2. an A/B of the prefill bench (ab.sh BENCH=bench_gpu_prefill: .devbin/bin/bench_gpu_prefill
#      and any bench_gpu_prefill_<label> packed with collect.sh's EXTRA);
#   3. bench/prefill_vs_cudnn.py (mlakit against cuDNN SDPA in one process; needs
#      .devbin/libmlakit_c.so: cmake --build --preset cuda --target mlakit_c before collecting);
#   4. bench_gpu_forward --query-len (the forward prefill path against the sum of its kernels),
#      when packed.
# Writes at most 8 files under $OUT (the device tool returns no more): check.log,
# ab_bench_gpu_prefill.{md,json}, prefill_cudnn.{md,json}, forward.json. About 2 minutes.
#   ONLY="cuda_prefill_test bench_gpu_prefill bench_gpu_forward" bash scripts/device/collect.sh
#   device run: command "bash scripts/device/prefill.sh", carry [".devbin"]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/mlakit-device-prefill}
mkdir -p "$OUT"
TEST_TIMEOUT=${TEST_TIMEOUT:-120} ONLY="cuda_prefill_test" OUT="$OUT" bash scripts/device/check.sh |
  grep -E "^(PASS|FAIL)|all GPU|FAILED"
OUT="$OUT/ab" BENCH=bench_gpu_prefill RUN_TIMEOUT=${RUN_TIMEOUT:-60} bash scripts/device/ab.sh | tail -n 8
mv "$OUT"/ab/ab_bench_gpu_prefill.* "$OUT"/ && rm -rf "$OUT/ab"
source scripts/device/devbin_env.sh || exit 2
commit=$(cat .devbin/COMMIT 2>/dev/null || echo unknown)
if [ -f .devbin/libmlakit_c.so ]; then
  MLAKIT_LIBRARY=$PWD/.devbin/libmlakit_c.so PYTHONPATH=$PWD/python timeout 120 \
    python3 bench/prefill_vs_cudnn.py --commit "$commit" --json "$OUT/prefill_cudnn.json" \
    > "$OUT/prefill_cudnn.md" 2>&1
  grep -E "^\||cuDNN path" "$OUT/prefill_cudnn.md"
fi
if [ -x .devbin/bin/bench_gpu_forward ]; then
  # DeepSeek-V3 dims: every request 1024 new tokens after ~3072 of context (gathered in chunks).
  timeout 120 .devbin/bin/bench_gpu_forward --layers 4 --batch 4 --seq-len 4096 --query-len 1024 \
    --json "$OUT/forward.json" | grep -E "^prefill step|^\| (eager device|kernels)"
fi
