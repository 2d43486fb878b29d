// The CPU backend's worker threads: a pool owned by mlakit whose idle workers sleep on a condition
// variable. Nothing spins, so the library behaves inside a host program whatever that program's
// OpenMP settings (OMP_WAIT_POLICY is not needed; docs/perf-notes.md).
#pragma once

#include <cstdint>

namespace mlakit::cpu {

// Threads the CPU kernels use, the caller's included: MLAKIT_NUM_THREADS, else the first value of
// OMP_NUM_THREADS (the variable engines already set), else the CPUs this process may run on.
// Read once, at the first use.
int num_threads();

// One parallel loop body, type-erased without allocating: body(context, i).
struct LoopBody {
  void (*body)(const void* context, int64_t i);
  const void* context;
};

// Calls body(i) for every i in [begin, end) on the pool's workers and the calling thread, items
// handed out one at a time (dynamic scheduling). Returns when every item has run; rethrows the
// first exception a body threw (items not yet started are then skipped). A call made from inside
// a loop body, or while another host thread holds the pool, runs its items on the calling thread.
void run_on_pool(int64_t begin, int64_t end, LoopBody body);

}  // namespace mlakit::cpu
