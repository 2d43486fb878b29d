#!/usr/bin/env bash
# A CPU decode step inside a process with and without OMP_WAIT_POLICY=passive, on a loaded
# machine (a busy loop runs beside it on one core), for each `mlakit` binary given: the
# measurement of bench/results/*-cpu-threads.md. Prints one JSON object per run:
#   {"binary": LABEL, "policy": "passive"|"unset", "round": K, "decode_us_per_step": X}
# Usage: scripts/bench_cpu_threads.sh LABEL=PATH/TO/mlakit [LABEL=PATH ...]   (ROUNDS, default 5)
# Workload: 1 layer, 4 requests of 256 prompt tokens and 33 output tokens (32 decode-only steps
# of 4 requests with 256-288 keys), deepseek-v2-lite bf16.
set -euo pipefail
ROUNDS=${ROUNDS:-5}
( while :; do :; done ) &
BUSY=$!
trap 'kill "$BUSY"' EXIT
for round in $(seq 1 "$ROUNDS"); do
  for spec in "$@"; do
    label=${spec%%=*}
    binary=${spec#*=}
    for policy in passive unset; do
      if [ "$policy" = passive ]; then export OMP_WAIT_POLICY=passive; else unset OMP_WAIT_POLICY; fi
      us=$("$binary" run --num-layers 1 --num-requests 4 --max-num-seqs 4 --prompt-len 256 \
             --output-len 33 --shared-prefix-len 0 --no-progress |
           sed -n 's/.*in prefill steps, \([0-9.]*\) us in decode-only.*/\1/p')
      echo "{\"binary\": \"$label\", \"policy\": \"$policy\", \"round\": $round, \"decode_us_per_step\": $us}"
    done
  done
done
