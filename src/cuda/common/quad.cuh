// Reductions over the 4 lanes of a quad (lanes 4i .. 4i + 3): in the m16n8 mma.sync and the wgmma
// accumulator layouts they hold the same rows, so these finish a row max or sum within a warp.
#pragma once

namespace mlakit::cuda {

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace mlakit::cuda
