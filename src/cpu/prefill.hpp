// CPU kernel of ops::mla_prefill (spec A.5, C.5): varlen multi-head attention with a shared rope
// key, computed block by block with an online softmax (flash-attention style) on top of sgemm.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "mlakit/types.hpp"

namespace mlakit::cpu {

// Largest P + R and V the kernel takes: its per-thread scratch grows with the head sizes (256
// query rows of each), and 4096 is far above every MLA model (192 / 128).
inline constexpr int64_t kPrefillMaxHeadDim = 4096;

// Arguments validated by ops::mla_prefill: shapes and dtypes consistent, sequence offsets
// non-decreasing from 0 and within T resp. S.
struct PrefillArgs {
  TensorView q;       // [T, N, P + R]  f32, f16 or bf16 (all float tensors share this dtype)
  TensorView k_nope;  // [S, N, P]
  TensorView k_pe;    // [S, R]  shared by all heads
  TensorView v;       // [S, N, V]
  TensorView out;     // [T, N, V]
  std::optional<TensorView> lse_heads_tokens;  // f32 [N, T], natural log
  std::span<const int64_t> cu_seqlens_q;       // [B + 1]
  std::span<const int64_t> cu_seqlens_k;       // [B + 1]
  float scale = 0.0f;                          // softmax scale
  bool causal = false;                         // bottom-right causal mask
};

// Writes every row of out (and of lse): query rows outside all requests, and queries that see
// no key, get out 0 and lse -inf.
void mla_prefill(const PrefillArgs& args);

}  // namespace mlakit::cpu
