// Named CTA barriers (PTX bar.sync / bar.arrive) for producer-consumer hand-offs between warp
// groups: the producer arrives without waiting, the consumer waits until `threads` threads (both
// sides together) have arrived. Id 0 is __syncthreads'; kernels number theirs from 1 (16 exist).
#pragma once

#include <cstdint>

namespace mlakit::cuda {

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// bar.sync that also returns, to every participant, the or of their `predicate`s (bar.red.or).
__device__ __forceinline__ bool named_barrier_or(int id, int threads, bool predicate) {
  uint32_t any;
  asm volatile(
      "{\n"
      ".reg .pred p, q;\n"
      "setp.ne.u32 p, %1, 0;\n"
      "bar.red.or.pred q, %2, %3, p;\n"
      "selp.u32 %0, 1, 0, q;\n"
      "}\n"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(predicate)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

}  // namespace mlakit::cuda
