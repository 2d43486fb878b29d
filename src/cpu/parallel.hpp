// CPU parallelism: one place that decides how work is spread over cores (the library's own thread
// pool, cpu/thread_pool.hpp; no OpenMP threads).
#pragma once

#include <cstdint>

#include "cpu/thread_pool.hpp"

namespace mlakit::cpu {

// Calls fn(i) for every i in [begin, end), spread over the threads one item at a time (dynamic
// scheduling: work items may differ in cost, e.g. decode splits of unequal length).
template <class Fn>
void parallel_for(int64_t begin, int64_t end, const Fn& fn) {
  if (end - begin <= 1) {
    for (int64_t i = begin; i < end; ++i) fn(i);
    return;
  }
  const LoopBody body{[](const void* f, int64_t i) { (*static_cast<const Fn*>(f))(i); }, &fn};
  run_on_pool(begin, end, body);
}

}  // namespace mlakit::cpu
