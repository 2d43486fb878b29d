// Combine of the partial results of split requests (spec C.6 / C.7): per (request, query row)
//   M = max_k lse_k,  w_k = exp(lse_k - M),  out = sum_k w_k o_k / sum_k w_k,
//   lse = M + ln sum_k w_k
// over the request's segments whose lse is not -inf; a row no segment saw gets out 0, lse -inf,
// and a NaN partial LSE (a bad index in the decode kernel) makes the row NaN. The sums run in a
// fixed order for a given segment count, so a request's result depends on its own partials only.
#pragma once

#include <cuda_runtime.h>

#include "cuda/decode/sm90/params.cuh"

namespace mlakit::cuda::decode_sm90 {

// One CTA per (split request, row): two groups of 128 threads, each thread one float4 of the 512
// columns, the groups taking even and odd segments, so that a row with many segments (B = 1, 66
// parts) keeps 256 independent 16-byte loads in flight per step instead of walking them serially.
inline constexpr int kCombineThreads = 256;
inline constexpr int kCombineGroups = 2;

// Launches the combine over grid.x = max_split_requests x rows CTAs (those past the plan's count
// return at once); the launcher checks for errors.
void launch_combine_kernel(const CombineParams& params, dim3 grid, cudaStream_t stream);

}  // namespace mlakit::cuda::decode_sm90
