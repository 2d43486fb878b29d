#!/usr/bin/env bash
# Runs ON the GPU machine (device tool, carry [".devbin"]): the GPU time of each kernel of one
# decode (plan, decode, combine) for a few bench_gpu_decode shapes, from Nsight Compute's
# gpu__time_duration with caches and clocks left alone. Says where a small shape's time goes
# (docs/perf-notes.md): the replay time minus these sums is the graph's launch gaps.
#   SHAPES="B32 s_kv 1024 h_q 16 bf16;B1 s_kv 4096 h_q 128 bf16" bash scripts/device/kernel_times.sh
#   A shape written B,s_kv,h_q,s_q (e.g. "128,64,128,1") runs as bench_gpu_decode --case.
# Writes $OUT/kernel_times.txt (one line per profiled kernel) and prints it.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/mlakit-profile}
SHAPES=${SHAPES:-"B32 s_kv 1024 h_q 16 bf16;B1 s_kv 4096 h_q 128 bf16"}
mkdir -p "$OUT"
source scripts/device/devbin_env.sh || exit 2
: > "$OUT/kernel_times.txt"
IFS=';' read -ra shapes <<< "$SHAPES"
for shape in "${shapes[@]}"; do
  select=(--only "$shape")
  if [[ "$shape" =~ ^[0-9,]+$ ]]; then select=(--case "$shape"); fi
  # The first graph of a row holds plan + decode + combine per input copy: 3 copies' kernels.
  timeout 150 ncu --clock-control none --cache-control none --kernel-name "regex:mla_decode" \
    --launch-count 9 --metrics gpu__time_duration.sum,launch__grid_size --csv \
    .devbin/bin/bench_gpu_decode "${select[@]}" > "$OUT/ncu_times.csv" 2>&1
  echo "== $shape" | tee -a "$OUT/kernel_times.txt"
  python3 - "$OUT/ncu_times.csv" <<'PY' | tee -a "$OUT/kernel_times.txt"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
start = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if start is None:
    print("".join(",".join(r) + "\n" for r in rows[-20:]))
    sys.exit()
head = rows[start]
k, m, u, v = (head.index(x) for x in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
for r in rows[start + 1:]:
    if len(r) > v and r[m] == "gpu__time_duration.sum":
        print(f"{r[k][:60]:60s} {r[v]} {r[u]}")
PY
  grep -E "^B[0-9]" "$OUT/ncu_times.csv" | tee -a "$OUT/kernel_times.txt"
done
