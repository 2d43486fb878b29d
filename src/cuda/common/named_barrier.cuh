// Named CTA barriers (PTX bar.sync / bar.arrive) for producer-consumer hand-offs between warp
// groups: the producer arrives without waiting, the consumer waits until `threads` threads (both
// sides together) have arrived. Id 0 is __syncthreads'; kernels number theirs from 1 (16 exist).
#pragma once

namespace mlakit::cuda {

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace mlakit::cuda
