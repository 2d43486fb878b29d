// The split-combine kernel of the sm90 decode (combine.cuh): device code, launched by combine.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/grid_dependency.cuh"
#include "cuda/decode/sm90/combine.cuh"
#include "cuda/decode/sm90/params.cuh"
#include "cuda/decode/work_plan.hpp"

namespace mlakit::cuda::decode_sm90 {

inline constexpr int kCombineCols = 512;  // V width
static_assert(kCombineThreads * 4 == 2 * kCombineCols, "one slice: 2 S groups x 128 / S float4s");
static_assert(kMaxRequestSegments <= kCombineThreads, "one thread reads each segment's LSE");

__device__ __forceinline__ void store4_converted(void* base, int64_t offset, RuntimeDType dtype,
                                                 float4 v) {
  switch (dtype) {
    case RuntimeDType::kF32:
      *reinterpret_cast<float4*>(static_cast<float*>(base) + offset) = v;
      break;
    case RuntimeDType::kBF16: {
      auto* d = reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(base) + offset);
      d[0] = __floats2bfloat162_rn(v.x, v.y);
      d[1] = __floats2bfloat162_rn(v.z, v.w);
      break;
    }
    default: {
      auto* d = reinterpret_cast<__half2*>(static_cast<__half*>(base) + offset);
      d[0] = __floats2half2_rn(v.x, v.y);
      d[1] = __floats2half2_rn(v.z, v.w);
      break;
    }
  }
}

// Calls fn(load) with `load(partial_row, c)` returning columns [4 c, 4 c + 4) of a partial row in
// f32, for the partials' dtype (partial_dtype: f32, or out's 16-bit dtype): the switch on the
// dtype stays out of the loops over segments (as kernel_common.cuh's with_pair_store).
template <class Fn>
__device__ __forceinline__ void with_partial_load(const CombineParams& p, Fn&& fn) {
  auto pairs = [&](auto element, auto to_float2) {
    using Element = decltype(element);
    const auto* base = static_cast<const Element*>(p.partial_out);
    fn([=](int64_t partial_row, int c) {
      const Element* v = base + partial_row * kCombineCols + 4 * c;  // 8 bytes
      const float2 a = to_float2(v), b = to_float2(v + 2);
      return make_float4(a.x, a.y, b.x, b.y);
    });
  };
  switch (p.partial_dtype) {
    case RuntimeDType::kF32: {
      const auto* base = static_cast<const float*>(p.partial_out);
      fn([=](int64_t partial_row, int c) {
        return *reinterpret_cast<const float4*>(base + partial_row * kCombineCols + 4 * c);
      });
      break;
    }
    case RuntimeDType::kBF16:
      pairs(__nv_bfloat16{}, [](const __nv_bfloat16* v) {
        return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(v));
      });
      break;
    default:
      pairs(__half{},
            [](const __half* v) { return __half22float2(*reinterpret_cast<const __half2*>(v)); });
      break;
  }
}

// Sum over segments k = group, group + groups, ... < num_segments of weight[k] times float4 column
// `column` of partial row first + k * rows (`load`: with_partial_load's), skipping zero weights
// (-inf segments were not written).
template <class Load>
__device__ __forceinline__ float4 weighted_column_sum(const Load& load, const float* weight,
                                                      int64_t first, int rows, int group,
                                                      int groups, int num_segments, int column) {
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
  for (int k = group; k < num_segments; k += groups) {
    const float wk = weight[k];
    if (wk != 0.0f) {
      const float4 v = load(first + static_cast<int64_t>(k) * rows, column);
      acc.x += wk * v.x;
      acc.y += wk * v.y;
      acc.z += wk * v.z;
      acc.w += wk * v.w;
    }
  }
  return acc;
}

// The merged row `row` of request b from its max partial LSE `m`, weight sum `total` and NaN flag
// (spec C.6): where its values go in out (element offset of column 0), the factor that normalizes
// the weighted sums, and its LSE. A row no segment saw: out 0, lse -inf; a NaN partial: NaN.
struct MergedRow {
  int64_t out_offset;
  float inv;
};
__device__ __forceinline__ MergedRow finish_merged_row(const CombineParams& p, int b, int row,
                                                       float m, float total, bool nan,
                                                       bool write_lse) {
  const int j = row / p.num_heads, n = row % p.num_heads;
  if (write_lse) {
    p.lse[b * p.lse_stride_batch + j * p.lse_stride_query + n * p.lse_stride_head] =
        nan ? NAN : (total > 0.0f ? m + logf(total) : -INFINITY);
  }
  return {b * p.out_stride_batch + j * p.out_stride_query + n * p.out_stride_head,
          nan ? NAN : (total > 0.0f ? 1.0f / total : 0.0f)};
}

// Block-wide max / sum of one value per thread (kCombineThreads threads); every thread gets it.
__device__ __forceinline__ float block_reduce(float v, bool is_max, float* scratch) {
  constexpr int kReduceWarps = kCombineThreads / 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  v = scratch[0];
#pragma unroll
  for (int w = 1; w < kReduceWarps; ++w) v = is_max ? fmaxf(v, scratch[w]) : v + scratch[w];
  __syncthreads();  // scratch is reused by the next reduction
  return v;
}

__global__ void __launch_bounds__(kCombineThreads)
    mla_decode_combine_kernel(const __grid_constant__ CombineParams p) {
  __shared__ float weight[kCombineThreads];  // w_k of segment k
  __shared__ float scratch[kCombineThreads / 32];
  // Groups 1 .. 2 S - 1's sums, added by group 0: (2 S - 1) x 128 / S < 256 float4s.
  __shared__ float4 partial_sum[kCombineThreads];

  wait_for_prior_grids();
  allow_next_grid_launch();
  const int t = threadIdx.x;
  const int slices = p.column_slices;
  const int slice = static_cast<int>(blockIdx.x % slices);
  const int split = static_cast<int>(blockIdx.x / slices / p.rows);
  const int row = static_cast<int>(blockIdx.x / slices % p.rows);
  if (split >= *p.num_split_requests) return;  // the grid is sized for the most split requests
  // One 16-byte load of the record {request, first_slot, num_segments, -} (work_plan.hpp).
  const int4 record = *reinterpret_cast<const int4*>(p.splits + split);
  const int b = record.x, num_segments = record.z;
  // Segment k of this row: partial index (first_slot + k) * rows + row.
  const int64_t first = static_cast<int64_t>(record.y) * p.rows + row;

  const float l =
      t < num_segments ? p.partial_lse[first + static_cast<int64_t>(t) * p.rows] : -INFINITY;
  const bool nan = __syncthreads_or(isnan(l)) != 0;
  const float m = block_reduce(l, /*is_max=*/true, scratch);
  const float w = (l == -INFINITY || m == -INFINITY || nan) ? 0.0f : expf(l - m);
  weight[t] = w;
  const float total = block_reduce(w, /*is_max=*/false, scratch);  // its barrier publishes weight

  const int width = kCombineCols / 4 / slices;  // float4 columns per thread group
  const int groups = 2 * slices;
  const int group = t / width, c = t % width;
  const int column = slice * width + c;  // this thread's float4 of the row
  float4 acc;
  const float* const weights = weight;  // (a capture of the array itself reads as unused to gcc)
  with_partial_load(p, [&](auto load) {
    acc = weighted_column_sum(load, weights, first, p.rows, group, groups, num_segments, column);
  });
  if (group > 0) partial_sum[(group - 1) * width + c] = acc;
  __syncthreads();
  if (group != 0) return;
  for (int g = 1; g < groups; ++g) {  // in group order: the sums' order is fixed
    const float4 other = partial_sum[(g - 1) * width + c];
    acc.x += other.x;
    acc.y += other.y;
    acc.z += other.z;
    acc.w += other.w;
  }
  const MergedRow out = finish_merged_row(p, b, row, m, total, nan, t == 0 && slice == 0);
  store4_converted(p.out, out.out_offset + 4 * column, p.out_dtype,
                   make_float4(acc.x * out.inv, acc.y * out.inv, acc.z * out.inv, acc.w * out.inv));
}

// A warp per (split request, row) (combine.cuh, combine_by_warps): lane i reads the LSEs of
// segments i, i + 32, ... for the row's max and NaN flag; then every lane walks the segments in
// order, recomputing each weight from its LSE (one address for the warp), and accumulates its four
// float4 columns i + 32 j. Same result rules as mla_decode_combine_kernel.
__global__ void __launch_bounds__(kCombineThreads)
    mla_decode_combine_warp_kernel(const __grid_constant__ CombineParams p) {
  constexpr int kColumnsPerLane = kCombineCols / 4 / 32;  // float4 columns per lane
  wait_for_prior_grids();
  allow_next_grid_launch();
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kCombineWarpRows + threadIdx.x / 32;
  const int split = static_cast<int>(item / p.rows), row = static_cast<int>(item % p.rows);
  if (split >= *p.num_split_requests) return;  // a whole warp: the shuffles below stay full
  const int4 record = *reinterpret_cast<const int4*>(p.splits + split);
  const int b = record.x, num_segments = record.z;
  const int64_t first = static_cast<int64_t>(record.y) * p.rows + row;
  auto lse_of = [&](int k) { return p.partial_lse[first + static_cast<int64_t>(k) * p.rows]; };

  float m = -INFINITY, any_nan = 0.0f;
  for (int k = lane; k < num_segments; k += 32) {
    const float l = lse_of(k);
    if (isnan(l)) any_nan = 1.0f;
    m = fmaxf(m, l);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    any_nan = fmaxf(any_nan, __shfl_xor_sync(0xffffffffu, any_nan, offset));
  }
  const bool nan = any_nan != 0.0f;

  float total = 0.0f;
  float4 acc[kColumnsPerLane];
#pragma unroll
  for (int j = 0; j < kColumnsPerLane; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  with_partial_load(p, [&](auto load) {
#pragma unroll 2
    for (int k = 0; k < num_segments; ++k) {
      const float l = lse_of(k);
      const float w = (l == -INFINITY || m == -INFINITY || nan) ? 0.0f : expf(l - m);
      if (w == 0.0f) continue;  // -inf segments were not written; the same for every lane
      total += w;
      const int64_t partial_row = first + static_cast<int64_t>(k) * p.rows;
#pragma unroll
      for (int j = 0; j < kColumnsPerLane; ++j) {
        const float4 x = load(partial_row, lane + 32 * j);
        acc[j].x += w * x.x;
        acc[j].y += w * x.y;
        acc[j].z += w * x.z;
        acc[j].w += w * x.w;
      }
    }
  });
  const MergedRow out = finish_merged_row(p, b, row, m, total, nan, lane == 0);
#pragma unroll
  for (int c = 0; c < kColumnsPerLane; ++c) {
    store4_converted(p.out, out.out_offset + 4 * (lane + 32 * c), p.out_dtype,
                     make_float4(acc[c].x * out.inv, acc[c].y * out.inv, acc[c].z * out.inv,
                                 acc[c].w * out.inv));
  }
}

}  // namespace mlakit::cuda::decode_sm90
