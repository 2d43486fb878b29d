// TMA (the Hopper tensor memory accelerator): one instruction copies a box of a tensor described
// by a CUtensorMap (built on the host, passed as a __grid_constant__ kernel argument) into shared
// memory, swizzled as the map says, and signals the bytes' arrival on an mbarrier
// (cuda/common/mbarrier.cuh: the issuing side announces them with mbarrier_arrive_expect_tx).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace mlakit::cuda {

// Copies the box at coordinates (c0, c1, c2) (innermost first, in elements) of the 3-D tensor
// `map` to shared address `dst`; its bytes complete a transaction on `mbar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t mbar,
                                            int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(mbar)
      : "memory");
}

// Bulk copy (no tensor map) of `bytes` contiguous bytes from shared address `src` to global `dst`
// (both 16-byte aligned, bytes a multiple of 16), added to this thread's current bulk group.
// Shared-memory writes of other threads must be made visible to the async proxy first
// (fence.proxy.async.shared::cta, then a barrier).
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}

// Closes this thread's current bulk group.
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Waits until this thread's committed bulk groups have read their shared-memory sources (which
// may then be overwritten).
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// Waits until this thread's committed bulk groups have completed (their global writes done).
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// The 4-D form: the box at (c0, c1, c2, c3), innermost first.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t mbar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(mbar)
      : "memory");
}

}  // namespace mlakit::cuda
