// POD argument block of the CUDA prefill kernel, passed as a __grid_constant__ parameter.
// Strides are in elements. Validated on the host by ops::mla_prefill (shapes, dtypes, devices)
// and cuda::mla_prefill (head sizes, grid limits, alignment); the values of cu_seqlens are
// checked by the kernel itself (they live on the device).
#pragma once

#include <cstdint>

namespace mlakit::cuda::prefill {

struct PrefillParams {
  const void* q;                // [T, N, 192]  f16 / bf16, last dim contiguous in the vector path
  const void* k_nope;           // [S, N, 128]
  const void* k_pe;             // [S, 64]  shared by all heads
  const void* v;                // [S, N, 128]
  void* out;                    // [T, N, 128]  f32 / f16 / bf16 (its own dtype)
  float* lse;                   // [N, T]  f32 natural log, or nullptr
  const int32_t* cu_seqlens_q;  // [B + 1]
  const int32_t* cu_seqlens_k;  // [B + 1]
  uint32_t* error_word;         // per-device error word (cuda/common/device_errors.hpp)
  int64_t q_stride[3];          // token, head, dim
  int64_t k_nope_stride[3];     // key, head, dim
  int64_t k_pe_stride[2];       // key, dim
  int64_t v_stride[3];          // key, head, dim
  int64_t out_stride[3];        // token, head, dim
  int64_t lse_stride[2];        // head, token
  int64_t cu_seqlens_q_stride;
  int64_t cu_seqlens_k_stride;
  int64_t tokens;        // T
  int64_t keys;          // S
  int64_t max_seqlen_q;  // the grid covers this many query rows per request
  int64_t max_seqlen_k;  // checked against every request's key count
  int heads;             // N
  int heads_per_block;   // heads a block computes one after the other (0 until the launcher picks)
  int batch;             // B (blockIdx.z == B writes the rows past the last request)
  float scale_log2;      // softmax scale * log2(e): scores are kept in log2 units (exp2 is cheap)
  bool causal;           // bottom-right causal mask
  bool vector_loads;     // rows 16-byte aligned, dims contiguous: TMA, or 16-byte cp.async
  bool out_pairs;        // out's dim contiguous, its column pairs aligned: one store per pair
};

}  // namespace mlakit::cuda::prefill
