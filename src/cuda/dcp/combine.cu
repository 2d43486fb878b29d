// dcp_lse_combine and dcp_lse_correct on the GPU (spec A.9, C.6): one warp per (token, head).
// The warp reduces the W partial LSEs to the combine weights (the formulas of
// core/dcp_weights.hpp) into shared memory, then its lanes stride over the D values. Memory-bound:
// combine reads W rows and writes 1; correct reads 1 row and writes 1.
#include <cuda_runtime.h>

#include <cmath>

#include "core/check.hpp"
#include "cuda/common/dispatch.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda/dcp/launch.hpp"

namespace mlakit::cuda {

namespace {

constexpr const char* kCombineOp = "dcp_lse_combine";
constexpr const char* kCorrectOp = "dcp_lse_correct";
constexpr int kWarpSize = 32;
constexpr int kWarps = 8;  // warps per block: enough in flight to hide latency, small blocks
constexpr int kThreads = kWarps * kWarpSize;

struct CombineParams {
  const void* partial;        // combine: [W, T, H, D]; correct: [T, H, D]
  const float* lse;           // [W, T, H]
  void* out;                  // combine: [T, H, D]; correct: [T, W, H / W, D]
  float* out_lse;             // combine: [T, H] or nullptr
  int64_t partial_stride[4];  // elements; correct uses [0..2] for (t, h, d)
  int64_t lse_stride[3];
  int64_t out_stride[4];  // combine: (t, h, d); correct: (t, k, n, d)
  int64_t out_lse_stride[2];
  int64_t ranks, tokens, heads, dim;
  int64_t rank;            // correct: the rank whose partial this is
  int64_t heads_per_rank;  // correct: H / W
};

__device__ __forceinline__ float canonical_lse(float x) {
  return (isnan(x) || x == INFINITY) ? -INFINITY : x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// weights[k] = exp(l_k - m) / s for the W LSEs of (t, h); returns the combined LSE. All lanes of
// the warp call it; weights is this warp's [W] slice of shared memory.
__device__ float combine_weights(const CombineParams& p, int64_t t, int64_t h, float* weights) {
  const int lane = threadIdx.x % kWarpSize;
  const float* lse = p.lse + t * p.lse_stride[1] + h * p.lse_stride[2];
  float m = -INFINITY;
  for (int64_t k = lane; k < p.ranks; k += kWarpSize)
    m = fmaxf(m, canonical_lse(lse[k * p.lse_stride[0]]));
  m = warp_max(m);
  float s = 0.0f;
  for (int64_t k = lane; k < p.ranks; k += kWarpSize) {
    const float l = canonical_lse(lse[k * p.lse_stride[0]]);
    const float e = (m == -INFINITY || l == -INFINITY) ? 0.0f : expf(l - m);
    weights[k] = e;
    s += e;
  }
  s = warp_sum(s);
  for (int64_t k = lane; k < p.ranks; k += kWarpSize) weights[k] = s > 0.0f ? weights[k] / s : 0.0f;
  __syncwarp();
  return s > 0.0f ? m + logf(s) : -INFINITY;
}

template <class OutT, class InT>
__global__ void __launch_bounds__(kThreads)
    combine_kernel(const __grid_constant__ CombineParams p) {
  extern __shared__ float shared_weights[];  // [kWarps, W]
  using In = typename InT::Storage;
  using Out = typename OutT::Storage;
  const int lane = threadIdx.x % kWarpSize;
  float* weights = shared_weights + (threadIdx.x / kWarpSize) * p.ranks;
  const int64_t warps = int64_t{gridDim.x} * kWarps;
  for (int64_t item = (int64_t{blockIdx.x} * kThreads + threadIdx.x) / kWarpSize;
       item < p.tokens * p.heads; item += warps) {
    const int64_t t = item / p.heads, h = item % p.heads;
    const float lse = combine_weights(p, t, h, weights);
    Out* out = static_cast<Out*>(p.out) + t * p.out_stride[0] + h * p.out_stride[1];
    for (int64_t j = lane; j < p.dim; j += kWarpSize) {
      float acc = 0.0f;
      for (int64_t k = 0; k < p.ranks; ++k) {
        const float f = weights[k];
        if (f == 0.0f) continue;  // an empty rank's partial is never read (it may be NaN)
        const In* row = static_cast<const In*>(p.partial) + k * p.partial_stride[0] +
                        t * p.partial_stride[1] + h * p.partial_stride[2];
        acc += f * InT::load(row[j]);
      }
      out[j] = OutT::store(acc);
    }
    if (p.out_lse != nullptr && lane == 0)
      p.out_lse[t * p.out_lse_stride[0] + h * p.out_lse_stride[1]] = lse;
    __syncwarp();  // the weights are read by every lane before the next item overwrites them
  }
}

template <class OutT, class InT>
__global__ void __launch_bounds__(kThreads)
    correct_kernel(const __grid_constant__ CombineParams p) {
  extern __shared__ float shared_weights[];  // [kWarps, W]
  using In = typename InT::Storage;
  using Out = typename OutT::Storage;
  const int lane = threadIdx.x % kWarpSize;
  float* weights = shared_weights + (threadIdx.x / kWarpSize) * p.ranks;
  const int64_t warps = int64_t{gridDim.x} * kWarps;
  for (int64_t item = (int64_t{blockIdx.x} * kThreads + threadIdx.x) / kWarpSize;
       item < p.tokens * p.heads; item += warps) {
    const int64_t t = item / p.heads, h = item % p.heads;
    combine_weights(p, t, h, weights);
    const float f = weights[p.rank];
    const In* row =
        static_cast<const In*>(p.partial) + t * p.partial_stride[0] + h * p.partial_stride[1];
    Out* out = static_cast<Out*>(p.out) + t * p.out_stride[0] +
               (h / p.heads_per_rank) * p.out_stride[1] + (h % p.heads_per_rank) * p.out_stride[2];
    for (int64_t j = lane; j < p.dim; j += kWarpSize) {
      // Weight 0: this rank holds no key of the request; its partial is not read.
      out[j] = OutT::store(f == 0.0f ? 0.0f : f * InT::load(row[j]));
    }
    __syncwarp();
  }
}

template <class Launch>
void launch(const char* op, const TensorView& in, const TensorView& out, const CombineParams& p,
            Stream stream, const Launch& kernel_for) {
  if (p.tokens * p.heads == 0) return;
  DeviceGuard guard(out.device, op);
  const size_t smem = sizeof(float) * kWarps * static_cast<size_t>(p.ranks);
  // 48 KiB: the dynamic shared memory a kernel gets without opting in; W <= 1536 ranks fit.
  detail::require(smem <= 48 * 1024, ErrorCode::kUnsupported, op, ": at most ",
                  48 * 1024 / (sizeof(float) * kWarps), " ranks on CUDA, got ", p.ranks);
  const int64_t blocks = grid_blocks(p.tokens * p.heads, kWarps);
  dispatch_float(op, out.dtype, [&](auto out_type) {
    dispatch_float(op, in.dtype, [&](auto in_type) {
      kernel_for(
          out_type,
          in_type)<<<static_cast<unsigned>(blocks), kThreads, smem, as_cuda_stream(stream)>>>(p);
      check_launch(op, "dcp combine kernel");
    });
  });
}

}  // namespace

void dcp_lse_combine(const TensorView& partial_out, const TensorView& partial_lse_tokens_heads,
                     const TensorView& out, const std::optional<TensorView>& out_lse_tokens_heads,
                     Stream stream) {
  CombineParams p{};
  p.partial = partial_out.data;
  p.lse = partial_lse_tokens_heads.data_as<const float>();
  p.out = out.data;
  p.out_lse = out_lse_tokens_heads ? out_lse_tokens_heads->data_as<float>() : nullptr;
  for (int d = 0; d < 4; ++d) p.partial_stride[d] = partial_out.strides[d];
  for (int d = 0; d < 3; ++d) p.lse_stride[d] = partial_lse_tokens_heads.strides[d];
  for (int d = 0; d < 3; ++d) p.out_stride[d] = out.strides[d];
  for (int d = 0; d < 2; ++d)
    p.out_lse_stride[d] = out_lse_tokens_heads ? out_lse_tokens_heads->strides[d] : 0;
  p.ranks = partial_out.shape[0];
  p.tokens = out.shape[0];
  p.heads = out.shape[1];
  p.dim = out.shape[2];
  launch(kCombineOp, partial_out, out, p, stream, [](auto out_type, auto in_type) {
    return combine_kernel<decltype(out_type), decltype(in_type)>;
  });
}

void dcp_lse_correct(const TensorView& partial_out, const TensorView& all_lse_tokens_heads,
                     int64_t rank, const TensorView& corrected, Stream stream) {
  CombineParams p{};
  p.partial = partial_out.data;
  p.lse = all_lse_tokens_heads.data_as<const float>();
  p.out = corrected.data;
  for (int d = 0; d < 3; ++d) p.partial_stride[d] = partial_out.strides[d];
  for (int d = 0; d < 3; ++d) p.lse_stride[d] = all_lse_tokens_heads.strides[d];
  for (int d = 0; d < 4; ++d) p.out_stride[d] = corrected.strides[d];
  p.ranks = all_lse_tokens_heads.shape[0];
  p.tokens = partial_out.shape[0];
  p.heads = partial_out.shape[1];
  p.dim = partial_out.shape[2];
  p.rank = rank;
  p.heads_per_rank = corrected.shape[2];
  launch(kCorrectOp, partial_out, corrected, p, stream, [](auto out_type, auto in_type) {
    return correct_kernel<decltype(out_type), decltype(in_type)>;
  });
}

}  // namespace mlakit::cuda
