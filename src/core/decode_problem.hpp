// The arguments of one absorbed-MQA decode after ops::mla_decode validated them: a
// backend-neutral description that every backend's kernel takes (cpu/decode.hpp,
// cuda/decode/decode.hpp).
#pragma once

#include <cstdint>

#include "mlakit/config.hpp"
#include "mlakit/types.hpp"

namespace mlakit {

// A decode scale given as a tensor (mla_decode's q_scale / k_scale tensors), read where the decode
// runs: request b's value is data[b * stride] (stride 0: one value for every request).
struct DecodeScaleTensor {
  const float* data = nullptr;  // f32 [1] or [B] on the decode's device; nullptr: a host float
  int64_t stride = 0;           // elements between two requests' values
};

struct DecodeProblem {
  TensorView q;                // [B, s_q, N, D]  D = L + R, last dim contiguous
  TensorView kv_cache;         // [num_blocks, block_size, entry_width], entry contiguous
  TensorView block_table;      // i32 [B, max_blocks]; every id the keys of seq_lens reach is valid
  TensorView seq_lens;         // i32 [B]; 0 <= seq_len <= max_blocks * block_size
  TensorView out;              // [B, s_q, N, L]  f32/f16/bf16, last dim contiguous
  TensorView lse;              // f32 [B, s_q, N]  (natural log)
  float* workspace = nullptr;  // f32 [total_splits, s_q, N, L + 1]: partial out and lse per split
  KvCacheDType kv_dtype = KvCacheDType::kAuto;
  DType rope_dtype = DType::kBF16;  // fp8_ds_mla: 16-bit dtype of the stored rope values
  int64_t kv_lora_rank = 0;         // L: V = entry[0:L]
  int64_t entry_dim = 0;            // D = L + R: K = entry[0:D]
  float score_scale = 0.0f;         // softmax scale * q_scale (fp8 q) * k_scale (fp8_e4m3 cache)
  float value_scale = 1.0f;  // k_scale for fp8_e4m3 caches (values are stored / k_scale), else 1
  // The tensor form (either tensor set): score_scale and value_scale above do not apply; request
  // b's are request_scales(*this, b), from these, softmax_scale and the host value of a scale
  // given as a float. A tensor value that is not finite and > 0 makes the rows of the requests it
  // scales NaN (the CPU op checks host tensors before the kernel runs).
  DecodeScaleTensor q_scales, k_scales;
  float softmax_scale = 0.0f;    // the model's softmax scale
  float q_scale = 1.0f;          // host q_scale (used without q_scales)
  float k_scale = 1.0f;          // host k_scale (used without k_scales)
  bool q_scale_applies = false;  // q is fp8: scores are multiplied by q_scale
  bool k_scale_applies = false;  // kFp8E4m3 cache: scores and values are multiplied by k_scale

  bool has_scale_tensors() const { return q_scales.data != nullptr || k_scales.data != nullptr; }
};

// Request b's score factor (softmax scale * q_scale * k_scale where they apply, multiplied in
// that order, as the float form's score_scale) and value factor, for host-readable scale tensors.
struct RequestScales {
  float score_scale;
  float value_scale;
};
inline RequestScales request_scales(const DecodeProblem& p, int64_t b) {
  if (!p.has_scale_tensors()) return {p.score_scale, p.value_scale};
  const float q = p.q_scales.data != nullptr ? p.q_scales.data[b * p.q_scales.stride] : p.q_scale;
  const float k = p.k_scales.data != nullptr ? p.k_scales.data[b * p.k_scales.stride] : p.k_scale;
  return {p.softmax_scale * (p.q_scale_applies ? q : 1.0f) * (p.k_scale_applies ? k : 1.0f),
          p.k_scale_applies ? k : 1.0f};
}

}  // namespace mlakit
