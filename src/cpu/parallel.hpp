// CPU parallelism through OpenMP: one place that decides how work is spread over cores.
#pragma once

#include <omp.h>

#include <cstdint>

namespace mlakit::cpu {

// Threads the CPU kernels use (OMP_NUM_THREADS, else the cores of this machine).
inline int num_threads() { return omp_get_max_threads(); }

// Calls fn(i) for every i in [begin, end), spread over the threads in contiguous chunks with
// dynamic scheduling (work items may differ in cost, e.g. decode splits of unequal length).
template <class Fn>
void parallel_for(int64_t begin, int64_t end, const Fn& fn) {
  if (end - begin <= 1) {
    for (int64_t i = begin; i < end; ++i) fn(i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = begin; i < end; ++i) fn(i);
}

}  // namespace mlakit::cpu
