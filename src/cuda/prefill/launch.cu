// Host side of the CUDA prefill: what the kernel needs beyond ops::mla_prefill's validation
// (16-bit inputs, the DeepSeek head sizes, grid limits), the parameter block, and the dispatch
// on the input type. No synchronization, no allocation.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "core/check.hpp"
#include "cuda/common/alignment.hpp"
#include "cuda/common/device_errors.hpp"
#include "cuda/common/dispatch.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda/prefill/entry.cuh"
#include "cuda/prefill/launch.hpp"
#include "cuda/prefill/traits.cuh"

namespace mlakit::cuda {

namespace {

using prefill::kPrefillOp;

// Largest grid y / z dimension of a CUDA launch.
constexpr int64_t kMaxGridYZ = 65535;
constexpr float kLog2e = 1.44269504088896340736f;  // scores are kept in log2 units

// True when t's innermost dimension is contiguous and every chunk of `bytes` bytes that starts at
// a multiple of `bytes` within a row starts `bytes`-aligned in memory: the base address and the
// row/head strides (in bytes) are multiples of `bytes` (a power of two, at most 16).
bool rows_are_chunks_of(const TensorView& t, int64_t bytes) {
  if (t.strides[t.ndim - 1] != 1) return false;
  const int64_t elem = t.element_size();
  uint64_t outer = 0;
  for (int d = 0; d + 1 < t.ndim; ++d) outer |= static_cast<uint64_t>(t.strides[d] * elem);
  return common_alignment({address(t.data), outer}) >= bytes;
}

// The kernels copy q / K / V rows in 16-byte chunks (TMA or cp.async) when this holds.
bool rows_are_16_byte_chunks(const TensorView& t) { return rows_are_chunks_of(t, 16); }

}  // namespace

void mla_prefill(const TensorView& q, const TensorView& k_nope, const TensorView& k_pe,
                 const TensorView& v, const TensorView& cu_seqlens_q,
                 const TensorView& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                 float scale, bool causal, const TensorView& out,
                 const std::optional<TensorView>& lse_heads_tokens, Stream stream,
                 int heads_per_block) {
  using detail::require;
  require(heads_per_block >= 0, ErrorCode::kInvalidArgument, kPrefillOp,
          ": heads_per_block must be >= 0 (0: the launcher's choice), got ", heads_per_block);
  require(q.dtype == DType::kF16 || q.dtype == DType::kBF16, ErrorCode::kUnsupported, kPrefillOp,
          ": the CUDA kernel takes f16 or bf16 q, k_nope, k_pe and v (tensor-core MMA), got ",
          dtype_name(q.dtype), "; convert the inputs or run on CPU tensors");
  require(k_nope.shape[2] == prefill::kNope && k_pe.shape[1] == prefill::kRope &&
              v.shape[2] == prefill::kHeadDimV,
          ErrorCode::kUnsupported, kPrefillOp,
          ": the CUDA kernel takes k_nope.shape[2] = ", prefill::kNope,
          ", k_pe.shape[1] = ", prefill::kRope, " and v.shape[2] = ", prefill::kHeadDimV,
          " (MLA head sizes), got ", k_nope.shape[2], ", ", k_pe.shape[1], " and ", v.shape[2]);
  require(max_seqlen_q >= 0 && max_seqlen_k >= 0, ErrorCode::kInvalidArgument, kPrefillOp,
          ": max_seqlen_q and max_seqlen_k must be >= 0, got ", max_seqlen_q, " and ",
          max_seqlen_k);
  const int64_t heads = q.shape[1], batch = cu_seqlens_q.shape[0] - 1;
  require(heads <= kMaxGridYZ && batch + 1 <= kMaxGridYZ, ErrorCode::kUnsupported, kPrefillOp,
          ": the CUDA kernel takes at most ", kMaxGridYZ, " heads and ", kMaxGridYZ - 1,
          " requests, got ", heads, " and ", batch);
  require(max_seqlen_q <= (int64_t{1} << 31) - 1, ErrorCode::kUnsupported, kPrefillOp,
          ": max_seqlen_q must fit in i32, got ", max_seqlen_q);
  if (q.shape[0] == 0 || heads == 0) return;  // nothing to write

  prefill::PrefillParams p{};
  p.q = q.data;
  p.k_nope = k_nope.data;
  p.k_pe = k_pe.data;
  p.v = v.data;
  p.out = out.data;
  p.lse = lse_heads_tokens ? lse_heads_tokens->data_as<float>() : nullptr;
  p.cu_seqlens_q = cu_seqlens_q.data_as<const int32_t>();
  p.cu_seqlens_k = cu_seqlens_k.data_as<const int32_t>();
  for (int d = 0; d < 3; ++d) {
    p.q_stride[d] = q.strides[d];
    p.k_nope_stride[d] = k_nope.strides[d];
    p.v_stride[d] = v.strides[d];
    p.out_stride[d] = out.strides[d];
  }
  for (int d = 0; d < 2; ++d) {
    p.k_pe_stride[d] = k_pe.strides[d];
    p.lse_stride[d] = lse_heads_tokens ? lse_heads_tokens->strides[d] : 0;
  }
  p.cu_seqlens_q_stride = cu_seqlens_q.strides[0];
  p.cu_seqlens_k_stride = cu_seqlens_k.strides[0];
  p.tokens = q.shape[0];
  p.keys = k_nope.shape[0];
  p.max_seqlen_q = max_seqlen_q;
  p.max_seqlen_k = max_seqlen_k;
  p.heads = static_cast<int>(heads);
  // 0: launch_prefill_kernel chooses; more than the heads is one block of all of them (and keeps
  // the grid's head-group count from overflowing int).
  p.heads_per_block = static_cast<int>(std::min<int64_t>(heads_per_block, heads));
  p.batch = static_cast<int>(batch);
  p.scale_log2 = scale * kLog2e;
  p.causal = causal;
  p.vector_loads = rows_are_16_byte_chunks(q) && rows_are_16_byte_chunks(k_nope) &&
                   rows_are_16_byte_chunks(k_pe) && rows_are_16_byte_chunks(v);
  // The epilogue writes a thread's two adjacent output columns (even first column) with one store.
  p.out_pairs = rows_are_chunks_of(out, 2 * out.element_size());

  DeviceGuard guard(q.device, kPrefillOp);
  p.error_word = device_error_word(kPrefillOp);
  const cudaStream_t s = as_cuda_stream(stream);
  dispatch_float16(kPrefillOp, q.dtype, [&](auto in_type) {
    prefill::launch_prefill_kernel<decltype(in_type)>(p, out.dtype, s);
  });
}

}  // namespace mlakit::cuda
