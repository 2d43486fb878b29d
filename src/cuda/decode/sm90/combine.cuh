// Combine of the split partials (spec C.6 / C.7): per (request, query row)
//   M = max_k lse_k,  w_k = exp(lse_k - M),  out = sum_k w_k o_k / sum_k w_k,  lse = M + ln sum_k
//   w_k
// over the splits whose lse is not -inf; a row no split saw gets out 0, lse -inf, and a NaN partial
// LSE (a bad index in the decode kernel) makes the row NaN.
#pragma once

#include <cuda_runtime.h>

#include "cuda/decode/sm90/params.cuh"

namespace mlakit::cuda::decode_sm90 {

// One CTA per (request, row): two groups of 128 threads, each thread one float4 of the 512
// columns, the groups taking even and odd splits, so that a row with many splits (B = 1, S = 64)
// keeps 256 independent 16-byte loads in flight per step instead of walking its splits serially.
inline constexpr int kCombineThreads = 256;
inline constexpr int kCombineGroups = 2;

// Launches the combine over grid.x = B x rows CTAs; the launcher checks for errors.
void launch_combine_kernel(const CombineParams& params, dim3 grid, cudaStream_t stream);

}  // namespace mlakit::cuda::decode_sm90
