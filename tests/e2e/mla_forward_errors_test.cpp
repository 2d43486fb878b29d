// Bad input through MlaAttention::forward: each case must raise a clear mlakit::Error (never a
// crash, never an out-of-bounds access) whose message names the problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/small_forward.hpp"
#include "common/test_util.hpp"
#include "mlakit/attention.hpp"
#include "mlakit/error.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"

namespace mlakit::test {
namespace {

// One decode request (seq_len 20, q_len 1) and one prefill (seq_len 8, q_len 8), small dims.
class ForwardErrors : public SmallForwardTest {
 protected:
  void SetUp() override {
    auto rng = make_rng(900);
    make_layer(rng, tokens_, 4);
    cache_ = nan_tensor({num_blocks_, 4, dims_.entry_dim()}, DType::kF32);
    out_ = nan_tensor({tokens_, dims_.num_heads * dims_.v_head_dim}, DType::kF32);
    block_table_ = int_tensor({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {2, 5}, DType::kI32);
    slots_ = int_tensor({23, 36, 37, 38, 39, 40, 41, 42, 43}, {tokens_}, DType::kI64);
    batch_.query_start_loc = qsl_;
    batch_.seq_lens = seq_lens_;
    batch_.num_actual_tokens = tokens_;
    batch_.block_table = block_table_;
    batch_.slot_mapping = slots_;
  }
  void run() { attn_->forward(q_, kv_c_, k_pe_, cache_, &batch_, out_); }
  // The decode's 19 context tokens are whatever the cache holds: writes them.
  void write_context() {
    fill_nan(out_);
    std::vector<int64_t> ctx_slots;
    for (int64_t pos = 0; pos < 19; ++pos) ctx_slots.push_back((1 + pos / 4) * 4 + pos % 4);
    auto rng = make_rng(901);
    Tensor ctx_kv = random_tensor(rng, {19, dims_.kv_lora_rank}, DType::kF32);
    Tensor ctx_pe = random_tensor(rng, {19, dims_.qk_rope_head_dim}, DType::kF32);
    Tensor ctx_slot_t = int_tensor(ctx_slots, {19}, DType::kI64);
    ops::concat_and_cache_mla(ctx_kv, ctx_pe, cache_, ctx_slot_t, KvCacheDType::kAuto, 1.0f);
  }

  static constexpr int64_t tokens_ = 9;
  static constexpr int64_t num_blocks_ = 12;
  Tensor cache_, out_, block_table_, slots_;
  std::vector<int32_t> qsl_{0, 1, 9};
  std::vector<int32_t> seq_lens_{20, 8};
  ForwardBatch batch_;
};

TEST_F(ForwardErrors, ValidBatchRuns) {
  write_context();
  EXPECT_NO_THROW(run());
}

// `call` throws kInvalidArgument with `message` in its text.
template <class Call>
void expect_invalid(Call&& call, const std::string& message) {
  try {
    call();
    ADD_FAILURE() << "expected kInvalidArgument containing '" << message << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

// Stress finding: an output over q, kv_c_normed, k_pe or the cache (or over itself) ran with
// status OK and a wrong result; forward refuses it as every op does (check_outputs_apart).
TEST_F(ForwardErrors, OutputOverlappingAnInputOrTheCache) {
  write_context();
  const int64_t width = dims_.num_heads * dims_.v_head_dim;
  auto out_over = [&](const Tensor& t) {
    return TensorView::contiguous(t.data<float>(), DType::kF32, {tokens_, width});
  };
  auto forward_into = [&](const TensorView& out) {
    return [&, out] { attn_->forward(q_, kv_c_, k_pe_, cache_, &batch_, out); };
  };
  expect_invalid(forward_into(out_over(q_)), "MlaAttention::forward: output must not overlap q");
  expect_invalid(forward_into(out_over(cache_)),
                 "MlaAttention::forward: output must not overlap kv_cache");
  const Tensor wide = Tensor::empty({tokens_, dims_.kv_lora_rank + width}, DType::kF32);
  const TensorView kv_c_in_wide = wide.view().narrow(1, 0, dims_.kv_lora_rank);
  expect_invalid(
      [&] {
        attn_->forward(q_, kv_c_in_wide, k_pe_, cache_, &batch_,
                       wide.view().narrow(1, dims_.kv_lora_rank - 1, width));
      },
      "MlaAttention::forward: output must not overlap kv_c_normed");
  // Rows of the output at stride 0 (every token writes the same row), in a step and in the
  // profile run.
  const TensorView same_row =
      TensorView::strided(out_.data<float>(), DType::kF32, {tokens_, width}, {0, 1});
  const std::string itself =
      "MlaAttention::forward: output must not overlap itself (each output element needs its own "
      "storage), got shape [9, 32] with strides [0, 1]";
  expect_invalid(forward_into(same_row), itself);
  expect_invalid([&] { attn_->forward(q_, kv_c_, k_pe_, cache_, nullptr, same_row); }, itself);
  // The cache is written too: the new tokens must not come from it.
  const TensorView pe_in_cache = TensorView::strided(
      cache_.data<float>(), DType::kF32, {tokens_, dims_.qk_rope_head_dim}, {dims_.entry_dim(), 1});
  expect_invalid([&] { attn_->forward(q_, kv_c_, pe_in_cache, cache_, &batch_, out_); },
                 "MlaAttention::forward: kv_cache must not overlap k_pe");
  // An empty output touches nothing, whatever its strides.
  const TensorView no_rows = TensorView::strided(q_.data<float>(), DType::kF32, {0, width}, {0, 0});
  EXPECT_NO_THROW(attn_->forward(q_, kv_c_, k_pe_, cache_, nullptr, no_rows));
}

// The scales are used with fp8 caches only (step.hpp): an auto cache ignores any value, NaN
// included (a stress finding: it was refused under mla_decode's name), and gives the output of
// the default scales.
TEST_F(ForwardErrors, ScalesIgnoredWithoutAnFp8Cache) {
  write_context();
  const Tensor cache_before = Tensor::empty({num_blocks_, 4, dims_.entry_dim()}, DType::kF32);
  std::copy_n(cache_.data<float>(), cache_.numel(), cache_before.data<float>());
  run();
  const std::vector<float> expected(out_.data<float>(), out_.data<float>() + out_.numel());
  std::copy_n(cache_before.data<float>(), cache_.numel(), cache_.data<float>());
  fill_nan(out_);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ASSERT_NO_THROW(attn_->forward(q_, kv_c_, k_pe_, cache_, &batch_, out_, ForwardScales{nan, -1}));
  EXPECT_EQ(0, std::memcmp(expected.data(), out_.data<float>(), expected.size() * sizeof(float)));
}

TEST_F(ForwardErrors, WrongQueryShape) {
  q_ = Tensor::empty({tokens_, 3, dims_.qk_head_dim()}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(run(), "q.shape[1] must equal 2");
}

TEST_F(ForwardErrors, WrongDtype) {
  kv_c_ = Tensor::empty({tokens_, dims_.kv_lora_rank}, DType::kBF16);
  MLAKIT_EXPECT_THROW_MSG(run(), "kv_c_normed must have dtype f32");
}

TEST_F(ForwardErrors, EntrySizeNot576LikeTheDims) {
  cache_ = Tensor::empty({num_blocks_, 4, dims_.entry_dim() - 1}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(run(), "kv_cache.shape[2] must equal 40");
}

TEST_F(ForwardErrors, BlockIdOutOfRange) {
  block_table_.data<int32_t>()[1] = num_blocks_ + 5;  // decode request, column 1
  MLAKIT_EXPECT_THROW_MSG(run(), "17");
}

TEST_F(ForwardErrors, SlotPastTheCache) {
  slots_.data<int64_t>()[3] = num_blocks_ * 4;
  MLAKIT_EXPECT_THROW_MSG(run(), "slot");
}

TEST_F(ForwardErrors, SeqLenBeyondTheBlockTable) {
  seq_lens_[0] = 21;  // needs 6 blocks, the table has 5 columns
  MLAKIT_EXPECT_THROW_MSG(run(), "block");
}

TEST_F(ForwardErrors, NegativeLength) {
  seq_lens_[1] = -1;
  MLAKIT_EXPECT_THROW_MSG(run(), "seq_len");
}

TEST_F(ForwardErrors, QueryLongerThanSequence) {
  seq_lens_[1] = 7;  // 8 new tokens cannot fit in a 7-token sequence
  MLAKIT_EXPECT_THROW_MSG(run(), "seq_len");
}

TEST_F(ForwardErrors, TooFewRowsForTheTokens) {
  out_ = Tensor::empty({tokens_ - 1, dims_.num_heads * dims_.v_head_dim}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(run(), "output.shape[0] must be >= num_actual_tokens");
}

// The single-call form plans the step itself; its messages still name the call (a fuzz finding).
TEST_F(ForwardErrors, SlotMappingShorterThanTheTokensNamesForward) {
  batch_.slot_mapping = slots_.view().narrow(0, 0, tokens_ - 1);
  MLAKIT_EXPECT_THROW_MSG(run(),
                          "MlaAttention::forward: batch.slot_mapping.shape[0] must be at least");
}

// A gather workspace smaller than one block could never hold a context chunk: the layer refuses
// it (CI's fuzz smoke run found the single-call forward failing later under another op's name).
TEST_F(ForwardErrors, WorkspaceSmallerThanOneBlock) {
  cfg_.workspace_tokens = 2;  // a block is 4 tokens: no page-aligned chunk fits
  MLAKIT_EXPECT_THROW_MSG(MlaAttention(cfg_, weight_),
                          "MlaAttention: workspace_tokens must be 0 (derive from max_model_len) or "
                          ">= block_size (4): a context chunk holds whole blocks, got 2");
}

TEST_F(ForwardErrors, BadConfig) {
  MlaAttentionConfig bad = cfg_;
  bad.scale = 0;
  MLAKIT_EXPECT_THROW_MSG(MlaAttention(bad, weight_), "scale must be finite and > 0");
  bad = cfg_;
  bad.kv_cache_dtype = KvCacheDType::kFp8DsMla;  // needs L 512, R 64, 16-bit activations
  MLAKIT_EXPECT_THROW_MSG(MlaAttention(bad, weight_), "fp8_ds_mla");
  MLAKIT_EXPECT_THROW_MSG(MlaAttention(cfg_, Tensor::empty({5, dims_.kv_lora_rank}, DType::kF32)),
                          "kv_b_proj");
}

}  // namespace
}  // namespace mlakit::test
