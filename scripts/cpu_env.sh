# Sourced by the run and bench scripts (not by the tests): CPU runtime settings that make the
# CPU backend fast without changing results. Each is set only when the caller has not set it.
#
# OMP_WAIT_POLICY=passive: idle OpenMP workers sleep instead of spinning. The library no longer
#   uses OpenMP threads (its own pool sleeps, docs/perf-notes.md "CPU threads"); the benchmark
#   programs' ceiling loops still do.
# OPENBLAS_CORETYPE=SkylakeX: Debian 12's OpenBLAS 0.3.21 does not recognise newer AVX-512 Xeons
#   and falls back to its SSE3 (Prescott) kernels, 3-4x slower. Set only when the CPU has every
#   AVX-512 subset the SkylakeX kernels use.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
  if [[ $flags == *avx512f* && $flags == *avx512bw* && $flags == *avx512dq* && $flags == *avx512vl* ]]; then
    export OPENBLAS_CORETYPE=SkylakeX
  fi
fi
