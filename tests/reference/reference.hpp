// The fp64 oracle: naive attention in the non-absorbed (MHA) form, written without the planner,
// the paged cache or the absorbed weights. Inputs are plain dense arrays of doubles that already
// hold the values the kernel sees (rounded to its dtype, dequantized from fp8).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mlakit::ref {

struct AttentionResult {
  std::vector<double> out;  // [sq, heads, dv]
  std::vector<double> lse;  // [sq, heads], natural log; -inf when a query sees no key
};

// Dense softmax attention for one request.
// q: [sq, heads, dqk]; k: [sk, kv_heads, dqk]; v: [sk, kv_heads, dv], kv_heads 1 (MQA: every
// head reads the same K and V) or `heads`. Causal masking is bottom-right: query i sees keys
// [0, sk - sq + i].
AttentionResult attention(std::span<const double> q, std::span<const double> k,
                          std::span<const double> v, int64_t sq, int64_t sk, int64_t heads,
                          int64_t kv_heads, int64_t dqk, int64_t dv, double scale, bool causal);

// The weights of one MLA layer in the checkpoint layout.
struct MlaWeights {
  int64_t num_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
  std::vector<double> kv_b_proj;  // [N * (P + V), L] (out x in)
};

// MLA for one request in the MHA form: k_nope/v = kv_b_proj(kv_c), k = [k_nope | k_pe],
// bottom-right causal attention of the request's sq queries (the last sq of its sk tokens).
// q: [sq, N, P + R]; kv_c: [sk, L]; k_pe: [sk, R]. Returns out [sq, N, V] and lse [sq, N].
AttentionResult mla_mha(const MlaWeights& w, std::span<const double> q,
                        std::span<const double> kv_c, std::span<const double> k_pe, int64_t sq,
                        int64_t sk, double scale);

// Two disjoint key sets combined (spec C.6): returns {out [tokens, heads, d], lse [heads, tokens]}.
// LSE +inf is read as -inf; both sides -inf gives out 0, lse -inf.
struct MergeResult {
  std::vector<double> out;
  std::vector<double> lse;
};
MergeResult merge(std::span<const double> prefix_out, std::span<const double> prefix_lse,
                  std::span<const double> suffix_out, std::span<const double> suffix_lse,
                  int64_t tokens, int64_t heads, int64_t d);

}  // namespace mlakit::ref
