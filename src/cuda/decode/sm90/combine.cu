// The split-combine kernel of the sm90 decode (combine.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/decode/sm90/combine.cuh"

namespace mlakit::cuda::decode_sm90 {

namespace {

__device__ __forceinline__ void store4(void* base, int64_t offset, RuntimeDType dtype, float4 v) {
  switch (dtype) {
    case RuntimeDType::kF32:
      *reinterpret_cast<float4*>(static_cast<float*>(base) + offset) = v;
      break;
    case RuntimeDType::kBF16: {
      __nv_bfloat162* d =
          reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(base) + offset);
      d[0] = __floats2bfloat162_rn(v.x, v.y);
      d[1] = __floats2bfloat162_rn(v.z, v.w);
      break;
    }
    default: {
      __half2* d = reinterpret_cast<__half2*>(static_cast<__half*>(base) + offset);
      d[0] = __floats2half2_rn(v.x, v.y);
      d[1] = __floats2half2_rn(v.z, v.w);
      break;
    }
  }
}

__global__ void __launch_bounds__(kCombineWarps * 32)
    mla_decode_combine_kernel(const __grid_constant__ CombineParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row_id = static_cast<int64_t>(blockIdx.x) * kCombineWarps + (threadIdx.x >> 5);
  if (row_id >= static_cast<int64_t>(p.batch) * p.rows) return;
  const int b = static_cast<int>(row_id / p.rows), row = static_cast<int>(row_id % p.rows);
  // Split k of this row: partial index (b * S + k) * rows + row.
  const int64_t first = static_cast<int64_t>(b) * p.num_splits * p.rows + row;

  float m = -INFINITY;
  bool nan = false;
  for (int k = lane; k < p.num_splits; k += 32) {
    const float l = p.partial_lse[first + static_cast<int64_t>(k) * p.rows];
    nan |= isnan(l);
    m = fmaxf(m, l);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  }
  nan = __any_sync(0xffffffffu, nan);

  float4 acc[kCombineColsPerLane / 4];
#pragma unroll
  for (int i = 0; i < kCombineColsPerLane / 4; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  float total = 0.0f;
  if (!nan && m != -INFINITY) {
    for (int k = 0; k < p.num_splits; ++k) {
      const int64_t at = first + static_cast<int64_t>(k) * p.rows;
      const float l = p.partial_lse[at];
      if (l == -INFINITY) continue;  // an empty split: its partial row was not written
      const float weight = expf(l - m);
      total += weight;
      const float4* o = reinterpret_cast<const float4*>(p.partial_out + at * 512);
#pragma unroll
      for (int i = 0; i < kCombineColsPerLane / 4; ++i) {
        const float4 v = o[lane + 32 * i];
        acc[i].x += weight * v.x;
        acc[i].y += weight * v.y;
        acc[i].z += weight * v.z;
        acc[i].w += weight * v.w;
      }
    }
  }
  const float inv = nan ? NAN : (total > 0.0f ? 1.0f / total : 0.0f);
  const float lse = nan ? NAN : (total > 0.0f ? m + logf(total) : -INFINITY);

  const int j = row / p.num_heads, n = row % p.num_heads;
  const int64_t out_row = b * p.out_stride_batch + j * p.out_stride_query + n * p.out_stride_head;
#pragma unroll
  for (int i = 0; i < kCombineColsPerLane / 4; ++i) {
    const float4 v = make_float4(acc[i].x * inv, acc[i].y * inv, acc[i].z * inv, acc[i].w * inv);
    store4(p.out, out_row + 4 * (lane + 32 * i), p.out_dtype, v);
  }
  if (lane == 0) {
    p.lse[b * p.lse_stride_batch + j * p.lse_stride_query + n * p.lse_stride_head] = lse;
  }
}

}  // namespace

void launch_combine_kernel(const CombineParams& params, dim3 grid, cudaStream_t stream) {
  mla_decode_combine_kernel<<<grid, kCombineWarps * 32, 0, stream>>>(params);
}

}  // namespace mlakit::cuda::decode_sm90
