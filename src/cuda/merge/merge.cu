// merge_attn_states on the GPU: one warp per (token, head) row, lanes stride over the head dim.
// Memory-bound: reads 2 rows and 2 LSEs, writes 1 row (and 1 LSE) per (token, head).
#include <cuda_runtime.h>

#include <cmath>

#include "core/check.hpp"
#include "cuda/common/dispatch.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda/merge/launch.hpp"

namespace mlakit::cuda {

namespace {

constexpr const char* kOp = "merge_attn_states";
constexpr int kThreads = 256;  // 8 warps per block: enough warps in flight to hide latency
constexpr int kWarpSize = 32;

struct MergeParams {
  void* out;                // [T, H, D]
  const void* prefix;       // [T, H, D]
  const void* suffix;       // [T, H, D]
  const float* prefix_lse;  // [H, T]
  const float* suffix_lse;  // [H, T]
  float* out_lse;           // [H, T] or nullptr
  int64_t tokens, heads, dim;
  int64_t out_stride[2], prefix_stride[2], suffix_stride[2];              // token, head (elements)
  int64_t prefix_lse_stride[2], suffix_lse_stride[2], out_lse_stride[2];  // head, token
};

// +inf (an empty set in FlashAttention-2's convention) and NaN both mean "no keys" (-inf).
__device__ __forceinline__ float canonical_lse(float x) {
  return (isnan(x) || x == INFINITY) ? -INFINITY : x;
}

template <class OutT, class InT>
__global__ void __launch_bounds__(kThreads) merge_kernel(const MergeParams p) {
  using In = typename InT::Storage;
  using Out = typename OutT::Storage;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = int64_t{gridDim.x} * (kThreads / kWarpSize);
  for (int64_t item = (int64_t{blockIdx.x} * kThreads + threadIdx.x) / kWarpSize;
       item < p.tokens * p.heads; item += warps) {
    const int64_t t = item / p.heads, h = item % p.heads;
    const float pl =
        canonical_lse(p.prefix_lse[h * p.prefix_lse_stride[0] + t * p.prefix_lse_stride[1]]);
    const float sl =
        canonical_lse(p.suffix_lse[h * p.suffix_lse_stride[0] + t * p.suffix_lse_stride[1]]);
    const float m = fmaxf(pl, sl);
    float pw = 0.0f, sw = 0.0f, lse = -INFINITY;  // both empty: out 0, lse -inf
    if (m != -INFINITY) {
      const float pe = expf(pl - m), se = expf(sl - m);  // the larger one is exactly 1
      pw = pe / (pe + se);
      sw = se / (pe + se);
      lse = m + logf(pe + se);
    }
    const In* prefix =
        static_cast<const In*>(p.prefix) + t * p.prefix_stride[0] + h * p.prefix_stride[1];
    const In* suffix =
        static_cast<const In*>(p.suffix) + t * p.suffix_stride[0] + h * p.suffix_stride[1];
    Out* out = static_cast<Out*>(p.out) + t * p.out_stride[0] + h * p.out_stride[1];
    for (int64_t j = lane; j < p.dim; j += kWarpSize) {
      float acc = 0.0f;  // a side of weight 0 is never read (it may hold NaN)
      if (pw != 0.0f) acc += pw * InT::load(prefix[j]);
      if (sw != 0.0f) acc += sw * InT::load(suffix[j]);
      out[j] = OutT::store(acc);
    }
    if (p.out_lse != nullptr) {
      __syncwarp();  // every lane has read the input LSEs (the output may alias one of them)
      if (lane == 0) p.out_lse[h * p.out_lse_stride[0] + t * p.out_lse_stride[1]] = lse;
    }
  }
}

}  // namespace

void merge_attn_states(const TensorView& output,
                       const std::optional<TensorView>& output_lse_heads_tokens,
                       const TensorView& prefix_output, const TensorView& prefix_lse_heads_tokens,
                       const TensorView& suffix_output, const TensorView& suffix_lse_heads_tokens,
                       Stream stream) {
  detail::require(prefix_output.dtype == suffix_output.dtype, ErrorCode::kUnsupported, kOp,
                  ": on CUDA prefix_output and suffix_output must share a dtype, got ",
                  dtype_name(prefix_output.dtype), " and ", dtype_name(suffix_output.dtype));
  MergeParams p{};
  p.out = output.data;
  p.prefix = prefix_output.data;
  p.suffix = suffix_output.data;
  p.prefix_lse = prefix_lse_heads_tokens.data_as<const float>();
  p.suffix_lse = suffix_lse_heads_tokens.data_as<const float>();
  p.out_lse = output_lse_heads_tokens ? output_lse_heads_tokens->data_as<float>() : nullptr;
  p.tokens = output.shape[0];
  p.heads = output.shape[1];
  p.dim = output.shape[2];
  for (int d = 0; d < 2; ++d) {
    p.out_stride[d] = output.strides[d];
    p.prefix_stride[d] = prefix_output.strides[d];
    p.suffix_stride[d] = suffix_output.strides[d];
    p.prefix_lse_stride[d] = prefix_lse_heads_tokens.strides[d];
    p.suffix_lse_stride[d] = suffix_lse_heads_tokens.strides[d];
    p.out_lse_stride[d] = output_lse_heads_tokens ? output_lse_heads_tokens->strides[d] : 0;
  }
  if (p.tokens * p.heads == 0) return;
  DeviceGuard guard(output.device, kOp);
  const int64_t blocks = grid_blocks(p.tokens * p.heads, kThreads / kWarpSize);
  dispatch_float(kOp, output.dtype, [&](auto out_type) {
    dispatch_float(kOp, prefix_output.dtype, [&](auto in_type) {
      merge_kernel<decltype(out_type), decltype(in_type)>
          <<<static_cast<unsigned>(blocks), kThreads, 0, as_cuda_stream(stream)>>>(p);
      check_launch(kOp, "merge_kernel");
    });
  });
}

}  // namespace mlakit::cuda
