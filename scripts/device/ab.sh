#!/usr/bin/env bash
# Runs ON the GPU machine (device tool, carry [".devbin"]): an A/B of builds of one GPU bench on one
# GPU in one call, since machines of one kind differ by a few percent (docs/perf-notes.md asks for
# the baseline in the same run). BENCH names the bench (default bench_gpu_decode; bench_gpu_prefill
# works too). The builds: every .devbin/bin/<BENCH>_<label> (packed by collect.sh's EXTRA, builds of
# other commits) and .devbin/bin/<BENCH> as "head". Each runs ROUNDS times (default 2; use an even
# count), the builds in turn within a round (reversed every other round), each run for at most
# RUN_TIMEOUT seconds (default 120).
# bench_gpu_decode runs the rows ROWS selects (its --only: ';'-separated label texts; default:
# issue 8's h_q 128 rows and one h_q 16 row, whose M16 kernel serves as the control) and writes
# JSON rows; bench_gpu_prefill runs all its shapes, read from its printed lines.
#   ROWS="B128 s_kv 4096 h_q 128 bf16" ROUNDS=3 bash scripts/device/ab.sh
#   BENCH=bench_gpu_prefill bash scripts/device/ab.sh
# BENCH_ARGS: more arguments for every run, split at spaces (e.g. the benches' --case shapes:
#   BENCH=bench_gpu_prefill BENCH_ARGS="--case 128,32,512,512 --case 16,8,2048,2048" ...).
# Prints per row the median time of each build and its ratio to the first build in name order, and
# writes $OUT/ab_<BENCH>.md and every run's rows to $OUT/ab_<BENCH>.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/mlakit-ab}
mkdir -p "$OUT"
BENCH=${BENCH:-bench_gpu_decode}
ROUNDS=${ROUNDS:-2}
ROWS=${ROWS:-"B128 s_kv 4096 h_q 128 bf16;B128 s_kv 8192 h_q 128 bf16;B128 s_kv 8192 h_q 128 s_q 2 bf16;B1 s_kv 4096 h_q 128 bf16;B4 s_kv 32768 h_q 128 bf16;U[1,8192] h_q 128 bf16;B64 s_kv 4096 h_q 128 s_q 8 bf16;B128 s_kv 4096 h_q 16 bf16"}
source scripts/device/devbin_env.sh || exit 2
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
builds=()
for binary in ".devbin/bin/${BENCH}_"*; do
  [ -x "$binary" ] && builds+=("${binary##*/${BENCH}_}")
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
    binary=.devbin/bin/$BENCH$([ "$build" = head ] || echo "_$build")
    args=()
    [ "$BENCH" = bench_gpu_decode ] &&
      args=(--only "$ROWS" --commit "$build" --json "$OUT/run-$build-$round.json")
    # shellcheck disable=SC2206  # split on purpose: one argument per word
    args+=(${BENCH_ARGS:-})
    # A hung kernel costs one run, not the call.
    timeout "${RUN_TIMEOUT:-120}" "$binary" "${args[@]}" > "$OUT/run-$build-$round.txt" 2>&1 ||
      echo "ab: $build round $round failed (exit $?)"
    echo "round $round $build: $(grep -c . "$OUT/run-$build-$round.txt") lines"
  done
done
python3 - "$OUT" "$BENCH" "${builds[@]}" <<'PY'
import glob, json, os, re, statistics, sys
out, bench, builds = sys.argv[1], sys.argv[2], sys.argv[3:]
times, records = {}, []


def rows_of(build, rnd):
    """(shape, kv, time) of one run: bench_gpu_decode's JSON, or bench_gpu_prefill's lines
    ("H=128  B=1  sq=4096 ... out bf16    2.418 ms   284.3 TF/s  35.8 %")."""
    json_path = os.path.join(out, f"run-{build}-{rnd}.json")
    if os.path.exists(json_path):
        return [(r["shape"], r["kv"], r["mlakit_us"], r) for r in json.load(open(json_path))]
    rows = []
    for line in open(os.path.join(out, f"run-{build}-{rnd}.txt")):
        m = re.match(r"(H=.*?out \S+)\s+([\d.]+) ms", line)
        if m:
            shape = " ".join(m.group(1).split())
            rows.append((shape, "bf16", float(m.group(2)), {"shape": shape, "ms": float(m.group(2))}))
    return rows


for path in sorted(glob.glob(os.path.join(out, "run-*.txt"))):
    build, rnd = os.path.basename(path)[4:-4].rsplit("-", 1)
    for shape, kv, t, row in rows_of(build, rnd):
        row.update(build=build, round=int(rnd))
        records.append(row)
        times.setdefault((shape, kv), {}).setdefault(build, []).append(t)
json.dump(records, open(os.path.join(out, f"ab_{bench}.json"), "w"), indent=1)
unit, digits = ("µs", 1) if bench == "bench_gpu_decode" else ("ms", 3)
base = builds[0]
lines = ["| shape | kv | " + " | ".join(f"{b} {unit}" for b in builds) + " | " +
         " | ".join(f"{b} / {base}" for b in builds[1:]) + " |",
         "|---|---|" + "---|" * (2 * len(builds) - 1)]
for (shape, kv), per in times.items():
    med = {b: statistics.median(per[b]) for b in builds if b in per}
    cells = [f"{med[b]:.{digits}f}" if b in med else "-" for b in builds]
    ratios = [f"{med[b] / med[base]:.3f}" if b in med and base in med else "-" for b in builds[1:]]
    lines.append(f"| {shape} | {kv} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
open(os.path.join(out, f"ab_{bench}.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
