// The arguments of one absorbed-MQA decode after ops::mla_decode validated them: a
// backend-neutral description that every backend's kernel takes (cpu/decode.hpp,
// cuda/decode/decode.hpp).
#pragma once

#include <cstdint>

#include "mlakit/config.hpp"
#include "mlakit/types.hpp"

namespace mlakit {

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
};

}  // namespace mlakit
