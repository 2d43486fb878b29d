#!/usr/bin/env bash
# The libFuzzer targets of tests/fuzz/ (fuzz preset: clang 14, AddressSanitizer +
# UndefinedBehaviorSanitizer, CPU only): builds them, then runs each on one core, starting from
# its seed corpus tests/fuzz/corpus/<target>/ (read only: new inputs go to build/fuzz/corpus/).
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]   each target for SECONDS (default 60)
#   FUZZ_RUNS=N bash scripts/fuzz.sh [TARGET...]  each target for exactly N executions
#
# Targets: capi, planner, cache_indices (all when none is named). A finding (crash, sanitizer
# report, broken invariant, leak, an input slower than 10 s) fails the script; its input is kept in
# build/fuzz/findings/ and can be replayed with build/fuzz/tests/fuzz/fuzz_<target> <file>.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=60
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then
  SECONDS_PER_TARGET=$1
  shift
fi
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(capi planner cache_indices)

cmake --preset fuzz > /dev/null
cmake --build --preset fuzz -j "$(nproc)"

OUT=build/fuzz
mkdir -p "$OUT/findings"
status=0
for target in "${TARGETS[@]}"; do
  binary=$OUT/tests/fuzz/fuzz_$target
  seeds=tests/fuzz/corpus/$target
  work=$OUT/corpus/$target
  mkdir -p "$work"
  if [ -n "${FUZZ_RUNS:-}" ]; then budget=(-runs="$FUZZ_RUNS"); else budget=(-max_total_time="$SECONDS_PER_TARGET"); fi
  log=$OUT/fuzz_$target.log
  # One thread for the library's CPU pool (it reads OMP_NUM_THREADS): one core per fuzzer. -timeout: an input slower
  # than 10 s is a finding (one execution takes about a millisecond); -max_len: every target
  # reads its whole call from fewer bytes.
  if OMP_NUM_THREADS=1 "$binary" "${budget[@]}" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
      -print_final_stats=1 -artifact_prefix="$OUT/findings/$target-" "$work" "$seeds" \
      > "$log" 2>&1; then
    runs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
    echo "[fuzz] $target: ${runs:-?} executions, no finding"
  else
    status=1
    echo "[fuzz] $target: FINDING (log $log, input in $OUT/findings/)"
    grep -E 'ERROR|runtime error|invariant violated' -A2 "$log" | head -20 || true
  fi
done
exit $status
