// The fixture base of the forward tests that check refusals (mla_forward_errors_test,
// forward_block_ids_test): a small f32 MlaAttention layer with random weights and random inputs.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>

#include "common/test_util.hpp"
#include "mlakit/attention.hpp"

namespace mlakit::test {

class SmallForwardTest : public ::testing::Test {
 protected:
  // Dims {N 2, L 32, R 8, P 16, V 16} (small: a test's work stays tiny), scale 0.25, f32
  // activations, `block_size`; the weight, then q, kv_c and k_pe of `tokens` tokens from `rng`.
  void make_layer(std::mt19937_64& rng, int64_t tokens, int64_t block_size) {
    dims_ = MlaDims{2, 32, 8, 16, 16};
    cfg_.dims = dims_;
    cfg_.scale = 0.25f;  // any positive scale: these tests compare refusals and bytes
    cfg_.act_dtype = DType::kF32;
    cfg_.block_size = block_size;
    weight_ = random_tensor(rng, {dims_.num_heads * dims_.kv_b_out_dim(), dims_.kv_lora_rank},
                            DType::kF32);
    attn_ = std::make_unique<MlaAttention>(cfg_, weight_);
    q_ = random_tensor(rng, {tokens, dims_.num_heads, dims_.qk_head_dim()}, DType::kF32);
    kv_c_ = random_tensor(rng, {tokens, dims_.kv_lora_rank}, DType::kF32);
    k_pe_ = random_tensor(rng, {tokens, dims_.qk_rope_head_dim}, DType::kF32);
  }

  MlaDims dims_;
  MlaAttentionConfig cfg_;
  Tensor weight_;  // f32 [N (P + V), L]
  Tensor q_;       // f32 [tokens, N, P + R]
  Tensor kv_c_;    // f32 [tokens, L]
  Tensor k_pe_;    // f32 [tokens, R]
  std::unique_ptr<MlaAttention> attn_;
};

}  // namespace mlakit::test
