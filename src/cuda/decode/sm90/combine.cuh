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

// One CTA per (split request, row, column slice): a row's 512 columns are cut into
// CombineParams::column_slices slices S (1, 2 or 4) of 128 / S float4s; the 256 threads are 2 S
// segment groups of 128 / S threads, each thread one float4 column, group g taking segments g, g +
// 2 S, ... So a row with many segments (B = 1, 64 one-tile segments) keeps 256 independent 16-byte
// loads in flight per CTA and step, and when the split rows are few (B = 1: 128 rows) S = 4 puts
// four times as many CTAs on the SMs.
inline constexpr int kCombineThreads = 256;
inline constexpr int kMaxCombineSlices = 4;
// Column slices for `row_ctas` (split request, row) CTAs beside a decode of `decode_ctas` CTAs (one
// per SM it uses): the most slices that keep the grid within 4 combine CTAs per such SM, half of
// what fits at once (2048 threads per SM / 256), so slicing only fills idle SMs. Measured: B1 h_q
// 128 (128 rows, 132 decode CTAs) 9.6 -> 6.5 µs with 4 slices; B32 h_q 16 (512 rows, 4-5 segments
// each) 4.3 -> 4.7 µs with 2 (more CTAs, no more loads in flight per row), hence the limit.
inline int combine_column_slices(int64_t row_ctas, int64_t decode_ctas) {
  int slices = kMaxCombineSlices;
  while (slices > 1 && row_ctas * slices > 4 * decode_ctas) slices /= 2;
  return slices;
}

// Many split rows (B128 with varied lengths and h_q 128: ~8,000), each with a few segments (a cut
// request has 2-3): a CTA per row would leave most of its 256 threads idle and run the grid in
// waves, so one warp merges one row instead (kCombineWarpRows rows per CTA; lane i holds float4
// columns i + 32 j). Chosen when the rows exceed 4 combine CTAs per decode CTA, outside
// batch-invariant mode (the two shapes add a row's segments in different orders).
inline constexpr int kCombineWarpRows = kCombineThreads / 32;
inline bool combine_by_warps(int64_t row_ctas, int64_t decode_ctas, bool batch_invariant) {
  return !batch_invariant && row_ctas > 4 * decode_ctas;
}

// Launches the combine: a CTA per (split request, row, column slice), grid.x = max_split_requests
// x rows x column_slices, or with `by_warps` a warp per (split request, row), grid.x =
// ceil(max_split_requests x rows / kCombineWarpRows); rows past the plan's count of split requests
// return at once.
void launch_combine_kernel(const CombineParams& params, bool by_warps, dim3 grid,
                           cudaStream_t stream);

}  // namespace mlakit::cuda::decode_sm90
