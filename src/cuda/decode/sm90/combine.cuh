// Combine of the split partials (spec C.6 / C.7): per (request, query row)
//   M = max_k lse_k,  w_k = exp(lse_k - M),  out = sum_k w_k o_k / sum_k w_k,  lse = M + ln sum_k
//   w_k
// over the splits whose lse is not -inf; a row no split saw gets out 0, lse -inf, and a NaN partial
// LSE (a bad index in the decode kernel) makes the row NaN.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/decode/sm90/params.cuh"

namespace mlakit::cuda::decode_sm90 {

inline constexpr int kCombineWarps = 8;               // rows per CTA: one warp per row
inline constexpr int kCombineColsPerLane = 512 / 32;  // 16 columns: four float4 per lane

// Launches the combine over grid.x CTAs of kCombineWarps rows; the launcher checks for errors.
void launch_combine_kernel(const CombineParams& params, dim3 grid, cudaStream_t stream);

}  // namespace mlakit::cuda::decode_sm90
