// A CPU forward step that would read a block id outside the cache is refused before it writes
// anything: the cache write of the step's tokens and the prefill output rows used to run before
// the decode (or the gather) found the id (the third CPU audit). The cache and the output are
// poisoned, and after the throw both must be bitwise what they were.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/small_forward.hpp"
#include "common/test_util.hpp"
#include "mlakit/attention.hpp"
#include "mlakit/error.hpp"
#include "mlakit/step.hpp"

namespace mlakit::test {
namespace {

// Two decodes and two prefills (decodes first), small dims, block_size 4:
//   request 0: decode,  seq_len  9, q_len 1 (block columns 0-2: blocks 0, 1, 2)
//   request 1: decode,  seq_len 14, q_len 1 (columns 0-3: blocks 3, 4, 5, 6)
//   request 2: prefill, seq_len 10, q_len 3, context 7 (columns 0-2: blocks 7, 8, 9)
//   request 3: prefill, seq_len  5, q_len 5, no context (columns 0-1: blocks 10, 11)
// Columns past a request's length hold -1: they are never read, so never checked.
class ForwardBlockIds : public SmallForwardTest {
 protected:
  static constexpr int64_t kBlockSize = 4;   // small, so that requests span several blocks
  static constexpr int64_t kNumBlocks = 12;  // exactly the blocks the table uses
  static constexpr int64_t kTokens = 10;     // 1 + 1 + 3 + 5 new tokens

  void SetUp() override {
    auto rng = make_rng(950);
    make_layer(rng, kTokens, kBlockSize);
    clean_cache_ = random_tensor(rng, {kNumBlocks, kBlockSize, dims_.entry_dim()}, DType::kF32);
    cache_ = Tensor::empty({kNumBlocks, kBlockSize, dims_.entry_dim()}, DType::kF32);
    std::copy_n(clean_cache_.data<float>(), cache_.numel(), cache_.data<float>());
    out_ = nan_tensor({kTokens, dims_.num_heads * dims_.v_head_dim}, DType::kF32);
    block_table_ =
        int_tensor({0, 1, 2, -1, 3, 4, 5, 6, 7, 8, 9, -1, 10, 11, -1, -1}, {4, 4}, DType::kI32);
    // Slot = block * 4 + offset of each new token: request 0 position 8, request 1 position 13,
    // request 2 positions 7-9, request 3 positions 0-4.
    slots_ = int_tensor({8, 25, 35, 36, 37, 40, 41, 42, 43, 44}, {kTokens}, DType::kI64);
    batch_.query_start_loc = qsl_;
    batch_.seq_lens = seq_lens_;
    batch_.num_actual_tokens = kTokens;
    batch_.block_table = block_table_;
    batch_.slot_mapping = slots_;
  }

  void set_block(int64_t request, int64_t column, int64_t id) {
    block_table_.data<int32_t>()[request * 4 + column] = static_cast<int32_t>(id);
  }

  // forward must throw kOutOfRange with every one of `parts` in its message, and leave the cache
  // (poisoned here: NaN in every other entry) and the output (NaN) bitwise unchanged.
  template <class Call>
  void expect_refused_before_any_write(Call&& call, const Tensor& cache,
                                       const std::vector<std::string>& parts) {
    float* entries = cache.data<float>();
    for (int64_t i = 0; i < cache.numel(); i += 2) {
      entries[i] = std::numeric_limits<float>::quiet_NaN();
    }
    fill_nan(out_);
    const std::vector<float> cache_before(entries, entries + cache.numel());
    const std::vector<float> out_before(out_.data<float>(), out_.data<float>() + out_.numel());
    try {
      call();
      ADD_FAILURE() << "expected kOutOfRange";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kOutOfRange) << e.what();
      for (const std::string& part : parts) {
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
            << "missing '" << part << "' in: " << e.what();
      }
    }
    EXPECT_EQ(0, std::memcmp(cache_before.data(), entries, cache_before.size() * sizeof(float)))
        << "the refused step wrote the cache";
    EXPECT_EQ(0,
              std::memcmp(out_before.data(), out_.data<float>(), out_before.size() * sizeof(float)))
        << "the refused step wrote the output";
  }

  void run() { attn_->forward(q_, kv_c_, k_pe_, cache_, &batch_, out_); }

  // The step as given is valid: over an unpoisoned cache it runs, writes the new tokens' entries
  // and every output row.
  void expect_valid_step_runs() {
    std::copy_n(clean_cache_.data<float>(), cache_.numel(), cache_.data<float>());
    const std::vector<float> before(cache_.data<float>(), cache_.data<float>() + cache_.numel());
    fill_nan(out_);
    ASSERT_NO_THROW(run());
    EXPECT_NE(0, std::memcmp(before.data(), cache_.data<float>(), before.size() * sizeof(float)));
    for (int64_t i = 0; i < out_.numel(); ++i) ASSERT_FALSE(std::isnan(out_.data<float>()[i])) << i;
  }

  Tensor clean_cache_, cache_, out_, block_table_, slots_;
  std::vector<int32_t> qsl_{0, 1, 2, 5, 10};
  std::vector<int32_t> seq_lens_{9, 14, 10, 5};
  ForwardBatch batch_;
};

TEST_F(ForwardBlockIds, ValidStepRuns) { expect_valid_step_runs(); }

// The last column request 1 reads (positions 12-13 of its 14 keys) holds a bad id: past the
// cache, negative, or at the int32 extremes.
TEST_F(ForwardBlockIds, DecodeBadIdLateInTableWritesNothing) {
  for (const int64_t bad : {kNumBlocks, int64_t{-1}, int64_t{std::numeric_limits<int32_t>::max()},
                            int64_t{std::numeric_limits<int32_t>::min()}}) {
    SCOPED_TRACE(bad);
    set_block(1, 3, bad);
    expect_refused_before_any_write(
        [&] { run(); }, cache_,
        {"MlaAttention::forward: batch.block_table[1, 3] = " + std::to_string(bad) +
         " is not a block id of kv_cache in [0, 12): decode request 1 reads it for positions 12 "
         "to 13 of its 14 keys (columns 0 to 3); the step was refused before anything was "
         "written"});
  }
  set_block(1, 3, 6);
  expect_valid_step_runs();
}

// The context gather of request 2 (7 context keys, columns 0-1) would read a bad id.
TEST_F(ForwardBlockIds, PrefillContextBadIdWritesNothing) {
  set_block(2, 1, kNumBlocks + 3);
  expect_refused_before_any_write(
      [&] { run(); }, cache_,
      {"batch.block_table[2, 1] = 15 is not a block id of kv_cache in [0, 12): prefill request 2 "
       "reads it for context positions 4 to 6 of its 7 context keys (columns 0 to 1)"});
  set_block(2, 1, -7);
  expect_refused_before_any_write([&] { run(); }, cache_,
                                  {"batch.block_table[2, 1] = -7", "prefill request 2"});
}

// A column the step does not read may hold anything: a prefill's column of new tokens only (their
// entries come from slot_mapping) and columns past a request's length.
TEST_F(ForwardBlockIds, ColumnsTheStepDoesNotReadAreNotChecked) {
  set_block(2, 2, -9);  // request 2's new tokens at positions 8-9; its context ends at 6
  set_block(3, 2, -5);  // past request 3's 5 keys
  set_block(0, 3, std::numeric_limits<int32_t>::max());  // past request 0's 9 keys
  expect_valid_step_runs();
}

// One StepPlan serves layers whose caches may differ: each forward checks the plan's ids against
// its own cache. The highest id the step reads is 8 (request 2's context, column 1): a cache of 8
// blocks is refused, one of 12 runs.
TEST_F(ForwardBlockIds, StepPlanChecksEachLayersCache) {
  MlaAttentionConfig limits = cfg_;
  limits.max_num_seqs = 4;
  limits.max_num_batched_tokens = kTokens;
  limits.max_model_len = 16;                            // the table's 4 columns of 4
  limits.workspace_tokens = attn_->workspace_tokens();  // the layer's chunks
  Workspace workspace(limits);
  const StepPlan plan = plan_step(limits, batch_, workspace);
  auto rng = make_rng(951);
  const Tensor small_cache = random_tensor(rng, {8, kBlockSize, dims_.entry_dim()}, DType::kF32);
  expect_refused_before_any_write(
      [&] { attn_->forward(q_, kv_c_, k_pe_, small_cache, plan, out_); }, small_cache,
      {"batch.block_table[2, 1] = 8 is not a block id of kv_cache in [0, 8): prefill request 2"});
  fill_nan(out_);
  ASSERT_NO_THROW(attn_->forward(q_, kv_c_, k_pe_, cache_, plan, out_));
}

}  // namespace
}  // namespace mlakit::test
