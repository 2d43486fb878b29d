// Shared-memory mbarriers (PTX mbarrier.*) that track TMA copies: the issuing thread arrives and
// announces the bytes its copies will deliver (expect_tx), without waiting for them; a consumer
// waits for the barrier's current phase to complete. A phase completes when `count` arrivals have
// happened and every announced byte has landed; waiters name the phase by its parity (0, 1, ...).
//
// A classic include guard instead of #pragma once: tests/cuda/decode_emulated_test.cpp defines it
// and supplies host versions, to run the decode kernel source on the CPU.
#ifndef MLAKIT_CUDA_COMMON_MBARRIER_CUH
#define MLAKIT_CUDA_COMMON_MBARRIER_CUH

#include <cstdint>

namespace mlakit::cuda {

// One thread initializes; a CTA barrier must follow before any other thread uses the mbarrier.
__device__ __forceinline__ void mbarrier_init(uint32_t mbar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mbar), "r"(count) : "memory");
}

// Orders this thread's mbarrier_init before the async proxy (TMA copies) completes on them.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrives on `mbar` and announces `bytes` more bytes that TMA copies will deliver to this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t mbar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mbar), "r"(bytes)
               : "memory");
}

// Arrives on `mbar` (one of the `count` arrivals its phase needs), with release semantics: this
// thread's earlier shared-memory writes are visible to whoever waits for the phase.
__device__ __forceinline__ void mbarrier_arrive(uint32_t mbar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(mbar) : "memory");
}

// Waits until the phase of `mbar` with parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(uint32_t mbar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_loop:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_loop;\n"
      "}\n" ::"r"(mbar),
      "r"(parity)
      : "memory");
}

}  // namespace mlakit::cuda

#endif  // MLAKIT_CUDA_COMMON_MBARRIER_CUH
