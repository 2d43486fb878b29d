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

}  // namespace mlakit::cuda
