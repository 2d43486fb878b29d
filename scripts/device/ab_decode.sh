#!/usr/bin/env bash
# Runs ON the GPU machine (device tool, carry [".devbin"]): an A/B of decode builds on one GPU in
# one call, since machines of one kind differ by a few percent (docs/perf-notes.md asks for the
# baseline in the same run). The builds: every .devbin/bin/bench_gpu_decode_<label> (packed by
# collect.sh's EXTRA, builds of other commits) and .devbin/bin/bench_gpu_decode as "head". Each
# runs ROUNDS times (default 2; use an even count), the builds in turn within a round (reversed
# every other round), over the rows ROWS selects
# (bench_gpu_decode --only: ';'-separated label texts; default: issue 8's h_q 128 rows and one h_q
# 16 row, whose M16 kernel serves as the control).
#   ROWS="B128 s_kv 4096 h_q 128 bf16" ROUNDS=3 bash scripts/device/ab_decode.sh
# Prints per row the median µs of each build and its ratio to the first build in name order, and
# writes $OUT/ab_decode.md and every run's JSON rows to $OUT/ab_decode.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/mlakit-ab}
mkdir -p "$OUT"
ROUNDS=${ROUNDS:-2}
ROWS=${ROWS:-"B128 s_kv 4096 h_q 128 bf16;B128 s_kv 8192 h_q 128 bf16;B128 s_kv 8192 h_q 128 s_q 2 bf16;B1 s_kv 4096 h_q 128 bf16;B4 s_kv 32768 h_q 128 bf16;U[1,8192] h_q 128 bf16;B64 s_kv 4096 h_q 128 s_q 8 bf16;B128 s_kv 4096 h_q 16 bf16"}
source scripts/device/devbin_env.sh || exit 2
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
builds=()
for binary in .devbin/bin/bench_gpu_decode_*; do
  [ -x "$binary" ] && builds+=("${binary##*/bench_gpu_decode_}")
done
builds+=(head)
# Odd rounds run the builds in order, even rounds in reverse (A B B A ...): the GPU warms up and
# its clocks drift by a few percent over a call, which a fixed order would charge to later builds.
reversed=()
for ((i = ${#builds[@]} - 1; i >= 0; i--)); do reversed+=("${builds[$i]}"); done
for round in $(seq 1 "$ROUNDS"); do
  order=("${builds[@]}")
  [ $((round % 2)) -eq 0 ] && order=("${reversed[@]}")
  for build in "${order[@]}"; do
    binary=.devbin/bin/bench_gpu_decode$([ "$build" = head ] || echo "_$build")
    "$binary" --only "$ROWS" --commit "$build" --json "$OUT/run-$build-$round.json" > \
      "$OUT/run-$build-$round.txt" 2>&1 || echo "ab: $build round $round failed (exit $?)"
    echo "round $round $build: $(grep -c . "$OUT/run-$build-$round.txt") lines"
  done
done
python3 - "$OUT" "${builds[@]}" <<'PY'
import glob, json, os, statistics, sys
out, builds = sys.argv[1], sys.argv[2:]
times, records = {}, []
for path in sorted(glob.glob(os.path.join(out, "run-*.json"))):
    build, rnd = os.path.basename(path)[4:-5].rsplit("-", 1)
    for row in json.load(open(path)):
        row.update(build=build, round=int(rnd))
        records.append(row)
        times.setdefault((row["shape"], row["kv"]), {}).setdefault(build, []).append(row["mlakit_us"])
json.dump(records, open(os.path.join(out, "ab_decode.json"), "w"), indent=1)
base = builds[0]
lines = ["| shape | kv | " + " | ".join(f"{b} µs" for b in builds) + " | " +
         " | ".join(f"{b} / {base}" for b in builds[1:]) + " |",
         "|---|---|" + "---|" * (2 * len(builds) - 1)]
for (shape, kv), per in times.items():
    med = {b: statistics.median(per[b]) for b in builds if b in per}
    cells = [f"{med[b]:.1f}" if b in med else "-" for b in builds]
    ratios = [f"{med[b] / med[base]:.3f}" if b in med and base in med else "-" for b in builds[1:]]
    lines.append(f"| {shape} | {kv} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
open(os.path.join(out, "ab_decode.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
