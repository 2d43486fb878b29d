#!/usr/bin/env bash
# Runs ON the GPU machine, in the repo root, with .devbin carried (see docs/device.md):
#   device run: command "bash scripts/device/check.sh", carry [".devbin"]
# Prints the GPU, runs every GPU test program in .devbin/bin, then every GPU bench
# (.devbin/bin/bench_gpu_*), and writes the whole log to $OUT/check.log. Short output per step;
# the whole run stays under 9 minutes. Exit status 0 only when every test passed and none was
# skipped (MLAKIT_ALLOW_SKIPS=1 allows skips, for a dry run on a machine without a GPU).
# ONLY="cuda_prefill_test bench_gpu_prefill python" runs just the named programs (a quick
# iteration on one kernel); unset, everything runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
# NVLink SHARP (multicast) stays off on the lent machines (docs/dcp.md).
export NCCL_NVLS_ENABLE=0
# Programs that may skip: they need the machine's libnccl (collect.sh does not carry it).
MAY_SKIP=" dcp_nccl_test dcp_nccl_attention_test bench_gpu_dcp "
OUT=${OUT:-/tmp/mlakit-device-check}
mkdir -p "$OUT"
LOG="$OUT/check.log"
: > "$LOG"
say() { echo "$@" | tee -a "$LOG"; }
selected() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
DEADLINE=$((SECONDS + 530))  # 8 min 50 s in all
TEST_TIMEOUT=${TEST_TIMEOUT:-240} # one test program (seconds)
BENCH_TIMEOUT=${BENCH_TIMEOUT:-120} # one bench program

# The programs and libraries carried in .devbin (collect.sh).
source scripts/device/devbin_env.sh || exit 2

say "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 |
  tee -a "$LOG"
say "commit $(cat .devbin/COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%FT%TZ)"

missing=0
for binary in .devbin/bin/*; do
  if ldd "$binary" | grep -q "not found"; then
    if [[ "$MAY_SKIP" == *" $(basename "$binary") "* ]]; then
      say "check: $(basename "$binary") skipped: misses $(ldd "$binary" | grep 'not found' | awk '{print $1}' | tr '\n' ' ')"
      rm "$binary"
      continue
    fi
    say "check: $(basename "$binary") misses libraries: $(ldd "$binary" | grep 'not found' | tr -s ' \t' ' ' | tr '\n' ';')"
    missing=1
  fi
done
[ "$missing" -eq 0 ] || { say "check: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; exit 3; }

say "== GPU tests"
failed=()
for binary in .devbin/bin/*_test; do
  name=$(basename "$binary")
  selected "$name" || continue
  if [ "$SECONDS" -ge "$DEADLINE" ]; then
    say "SKIP  $name (time budget spent)"
    failed+=("$name")
    continue
  fi
  start=$SECONDS
  timeout "$TEST_TIMEOUT" "$binary" --gtest_brief=1 > "/tmp/$name.log" 2>&1
  rc=$?
  counts=$(grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "/tmp/$name.log" |
    sed -E 's/, listed below://; s/ +/ /g' | tr '\n' ' ')
  # On the GPU machine nothing may skip: a skip means the GPU was not seen.
  skipped=$(grep -oE '^\[ +SKIPPED +\] [0-9]+' "/tmp/$name.log" | grep -oE '[0-9]+$' | head -n 1)
  if [ "$rc" -eq 0 ] && [ "${skipped:-0}" -gt 0 ] && [[ "$MAY_SKIP" == *" $name "* ]]; then
    say "PASS  $name (skipped: $(grep -m 1 -A 1 'Skipped' "/tmp/$name.log" | tail -n 1)) $counts"
  elif [ "$rc" -eq 0 ] && [ "${skipped:-0}" -gt 0 ] && [ "${MLAKIT_ALLOW_SKIPS:-0}" != 1 ]; then
    say "FAIL  $name: $skipped tests skipped (no GPU seen?) $counts"
    grep -m 3 -A 1 'Skipped' "/tmp/$name.log" >> "$LOG"
    failed+=("$name")
  elif [ "$rc" -eq 0 ]; then
    say "PASS  $name ($((SECONDS - start)) s) $counts"
  else
    say "FAIL  $name (exit $rc$([ "$rc" -eq 124 ] && echo ', timed out'), $((SECONDS - start)) s) $counts"
    grep -E 'test seed' "/tmp/$name.log" | head -n 1 | tee -a "$LOG"
    head -n 150 "/tmp/$name.log" | grep -v '^\[ *\(RUN\|OK\) ' >> "$LOG"
    failed+=("$name")
  fi
done

if [ -f .devbin/libmlakit_c.so ] && selected python; then
  say "== Python package (torch CPU and CUDA tensors) over the CUDA build"
  start=$SECONDS
  MLAKIT_LIBRARY=$PWD/.devbin/libmlakit_c.so PYTHONPATH=$PWD/python \
    timeout "$TEST_TIMEOUT" python3 -m pytest -q -p no:cacheprovider -rs python/tests \
    > /tmp/pytest.log 2>&1
  rc=$?
  tail -n 25 /tmp/pytest.log | tee -a "$LOG"
  if [ "$rc" -ne 0 ]; then failed+=("python/tests"); fi
  say "python/tests: exit $rc ($((SECONDS - start)) s)"
fi

if [ -x .devbin/bin/mlakit ] && selected mlakit; then
  say "== mlakit info; mlakit run --device cuda --verify (default workload, deepseek-v3 preset)"
  start=$SECONDS
  { .devbin/bin/mlakit info && OMP_WAIT_POLICY=passive timeout "$TEST_TIMEOUT" \
      .devbin/bin/mlakit run --device cuda --verify --no-progress; } > /tmp/mlakit-run.log 2>&1
  rc=$?
  tail -n 30 /tmp/mlakit-run.log | tee -a "$LOG"
  if [ "$rc" -ne 0 ]; then failed+=("mlakit run"); fi
  say "mlakit run: exit $rc ($((SECONDS - start)) s)"
  # A whole DeepSeek-V3 stack: one plan per step for 61 layers, eager and with decode graphs.
  for graphs in "" "--cuda-graphs"; do
    say "== mlakit run --device cuda --num-layers 61 $graphs --verify (8 requests)"
    start=$SECONDS
    OMP_WAIT_POLICY=passive timeout "$TEST_TIMEOUT" .devbin/bin/mlakit run --device cuda \
      --num-layers 61 --num-requests 8 --prompt-len 64:256 --output-len 32:64 --verify \
      --no-progress $graphs --json "$OUT/mlakit-run-61${graphs:+-graphs}.json" \
      > /tmp/mlakit-run-61.log 2>&1
    rc=$?
    tail -n 14 /tmp/mlakit-run-61.log | tee -a "$LOG"
    if [ "$rc" -ne 0 ]; then failed+=("mlakit run 61 $graphs"); fi
    say "mlakit run 61 layers $graphs: exit $rc ($((SECONDS - start)) s)"
  done
fi

if [ -x .devbin/bin/mlakit ] && selected mlakit_bench; then
  # The roofline grids of `mlakit bench` (docs/cli.md): JSON and CSV into $OUT, and the chart
  # when this machine's Python has the package and matplotlib (else: python -m mlakit.plot
  # $OUT/mlakit-bench.json out.png back home).
  say "== mlakit bench --device cuda --quick"
  start=$SECONDS
  plot=()
  if python3 -c "import mlakit.plot, matplotlib" > /dev/null 2>&1; then
    plot=(--plot "$OUT/mlakit-bench.png")
  fi
  timeout "$BENCH_TIMEOUT" .devbin/bin/mlakit bench --device cuda --quick \
    --json "$OUT/mlakit-bench.json" --csv "$OUT/mlakit-bench.csv" "${plot[@]}" \
    > /tmp/mlakit-bench.log 2>&1
  rc=$?
  tail -n 20 /tmp/mlakit-bench.log | tee -a "$LOG"
  if [ "$rc" -ne 0 ]; then failed+=("mlakit bench"); fi
  say "mlakit bench: exit $rc ($((SECONDS - start)) s)"
fi

benches=(.devbin/bin/bench_gpu_*)
if [ -e "${benches[0]}" ]; then
  say "== GPU benches"
  for binary in "${benches[@]}"; do
    name=$(basename "$binary")
    selected "$name" || continue
    if [ "$SECONDS" -ge "$DEADLINE" ]; then
      say "SKIP  $name (time budget spent)"
      continue
    fi
    json=()  # benches that write machine-readable rows
    # bench_gpu_decode's, bench_gpu_dcp's and bench_gpu_prefill's rows also name the commit the programs were built from
    # (collect.sh): the device copy of the tree has no .git.
    case "$name" in
      bench_gpu_forward) json=(--json "$OUT/$name.json") ;;
      bench_gpu_decode | bench_gpu_dcp | bench_gpu_prefill)
        json=(--json "$OUT/$name.json" --commit "$(cat .devbin/COMMIT 2>/dev/null || echo unknown)")
        ;;
    esac
    timeout "$BENCH_TIMEOUT" "$binary" "${json[@]}" > "/tmp/$name.log" 2>&1
    rc=$?
    say "-- $name (exit $rc)"
    tail -n 60 "/tmp/$name.log" | tee -a "$LOG"
  done
fi

if [ ${#failed[@]} -eq 0 ]; then
  say "== all GPU tests passed ($SECONDS s)"
  exit 0
fi
say "== FAILED: ${failed[*]} ($SECONDS s); full log: $LOG"
exit 1
