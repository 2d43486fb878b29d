// B.2 workspace sizing and B.6 chunked-context planning (both policies): the spec's worked
// examples, hand-derived plans, the #50613 packing case, bad inputs, and invariants over random
// batches (D.12 chunk_planner).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/test_util.hpp"
#include "mlakit/error.hpp"
#include "mlakit/plan.hpp"
#include "planner/context_chunks.hpp"
#include "planner_chunk_invariants.hpp"

namespace mlakit {
namespace {

using detail::plan_context_chunks;

// Blocks each request may read when its whole sequence is its context.
std::vector<int64_t> blocks_of(const std::vector<int32_t>& contexts, int64_t block_size) {
  std::vector<int64_t> blocks;
  for (int32_t c : contexts) blocks.push_back(test::ceil_div(c, block_size));
  return blocks;
}

// ---- B.2 ------------------------------------------------------------------------------------

TEST(PlannerWorkspace, SpecExamples) {
  EXPECT_EQ(chunked_prefill_workspace_tokens(163840, 256, 64), 65536);     // DeepSeek-V3
  EXPECT_EQ(chunked_prefill_workspace_tokens(4096, 64, 16), 32768);        // 8 * 4096
  EXPECT_EQ(chunked_prefill_workspace_tokens(163840, 1024, 128), 131072);  // page floor > cap
  EXPECT_EQ(chunked_prefill_workspace_tokens(1024, 4, 16), 8192);          // 8 * 1024
  EXPECT_EQ(chunked_prefill_workspace_tokens(16, 8, 16), 512);             // 4 * 8 * 16
}

TEST(PlannerWorkspace, BadInputs) {
  MLAKIT_EXPECT_THROW_MSG(chunked_prefill_workspace_tokens(0, 1, 16),
                          "max_model_len must be > 0, got 0");
  MLAKIT_EXPECT_THROW_MSG(chunked_prefill_workspace_tokens(16, 0, 16),
                          "max_num_seqs must be in [1, 2147483647], got 0");
  MLAKIT_EXPECT_THROW_MSG(chunked_prefill_workspace_tokens(16, 1, -64),
                          "block_size must be in [1, 2147483647], got -64");
  MLAKIT_EXPECT_THROW_MSG(chunked_prefill_workspace_tokens(16, 1 << 20, 1 << 20),
                          "max_num_seqs * block_size must be at most 2147483647 rows");
}

// ---- B.6 kEqualShare ------------------------------------------------------------------------

// Spec B.6 worked example. Empty pieces start at 0 here (vLLM writes i * 32768 there; nothing is
// read either way).
TEST(PlannerChunks, EqualShareWorkedExample) {
  const std::vector<int32_t> contexts = {100000, 0, 5000};
  const auto chunks = plan_context_chunks(contexts, 64, 65536, ChunkPolicy::kEqualShare);
  ASSERT_EQ(chunks.size(), 4u);
  const std::vector<std::vector<int32_t>> lens = {
      {32768, 0, 5000}, {32768, 0, 0}, {32768, 0, 0}, {1696, 0, 0}};
  const std::vector<int64_t> totals = {37768, 32768, 32768, 1696};
  const std::vector<int64_t> max_lens = {32768, 32768, 32768, 1696};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(chunks[i].seq_lens, lens[i]) << "chunk " << i;
    EXPECT_EQ(chunks[i].total_tokens, totals[i]) << "chunk " << i;
    EXPECT_EQ(chunks[i].max_seq_len, max_lens[i]) << "chunk " << i;
    EXPECT_EQ(chunks[i].starts, (std::vector<int32_t>{static_cast<int32_t>(i) * 32768, 0, 0}));
  }
  EXPECT_EQ(chunks[0].cu_seq_lens, (std::vector<int32_t>{0, 32768, 32768, 37768}));
  EXPECT_TRUE(test::chunks_are_valid(contexts, blocks_of(contexts, 64), 64, 65536, chunks));
}

// Fewer pages than requests with context: groups of workspace / block_size = 2 requests, each
// with a one-page share (hand-derived).
TEST(PlannerChunks, EqualShareGroupsWhenWorkspaceHoldsFewerPagesThanRequests) {
  const std::vector<int32_t> contexts = {200, 100, 64, 0, 10};
  const auto chunks = plan_context_chunks(contexts, 64, 128, ChunkPolicy::kEqualShare);
  ASSERT_EQ(chunks.size(), 5u);
  const std::vector<std::vector<int32_t>> starts = {
      {0, 0, 0, 0, 0}, {64, 64, 0, 0, 0}, {128, 0, 0, 0, 0}, {192, 0, 0, 0, 0}, {0, 0, 0, 0, 0}};
  const std::vector<std::vector<int32_t>> lens = {
      {64, 64, 0, 0, 0}, {64, 36, 0, 0, 0}, {64, 0, 0, 0, 0}, {8, 0, 0, 0, 0}, {0, 0, 64, 0, 10}};
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].starts, starts[i]) << "chunk " << i;
    EXPECT_EQ(chunks[i].seq_lens, lens[i]) << "chunk " << i;
  }
  EXPECT_EQ(chunks[4].token_to_seq.size(), 74u);
  EXPECT_EQ(chunks[4].token_to_seq[63], 2);
  EXPECT_EQ(chunks[4].token_to_seq[64], 4);
  EXPECT_TRUE(test::chunks_are_valid(contexts, blocks_of(contexts, 64), 64, 128, chunks));
}

// ---- B.6 kPacked ----------------------------------------------------------------------------

// Hand-derived: request 0 fits whole (300 rows left), request 1 does not (500 > 300) and gives
// its longest page-aligned piece (256), then continues at 256 in the next chunk with request 3.
TEST(PlannerChunks, PackedSplitsTheOverflowingRequestAtAPageBoundary) {
  const std::vector<int32_t> contexts = {700, 500, 0, 130};
  const auto chunks = plan_context_chunks(contexts, 64, 1000, ChunkPolicy::kPacked);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].starts, (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(chunks[0].seq_lens, (std::vector<int32_t>{700, 256, 0, 0}));
  EXPECT_EQ(chunks[0].cu_seq_lens, (std::vector<int32_t>{0, 700, 956, 956, 956}));
  EXPECT_EQ(chunks[0].max_seq_len, 700);
  EXPECT_EQ(chunks[1].starts, (std::vector<int32_t>{0, 256, 0, 0}));
  EXPECT_EQ(chunks[1].seq_lens, (std::vector<int32_t>{0, 244, 0, 130}));
  EXPECT_EQ(chunks[1].total_tokens, 374);
  EXPECT_EQ(chunks[1].max_seq_len, 244);
  EXPECT_TRUE(test::chunks_are_valid(contexts, blocks_of(contexts, 64), 64, 1000, chunks));
}

// vLLM #50613: one 60k context and 31 contexts of 16 tokens. The equal share (65536 / 32 = 2048
// rows per request) needs cdiv(60000, 2048) = 30 chunks; packing fits all in one.
TEST(PlannerChunks, PackedNeedsFarFewerChunksForOneLongAndManyShortContexts) {
  std::vector<int32_t> contexts(32, 16);
  contexts[0] = 60000;
  const auto equal = plan_context_chunks(contexts, 64, 65536, ChunkPolicy::kEqualShare);
  const auto packed = plan_context_chunks(contexts, 64, 65536, ChunkPolicy::kPacked);
  EXPECT_EQ(equal.size(), 30u);
  EXPECT_EQ(packed.size(), 1u);
  EXPECT_EQ(packed[0].total_tokens, 60000 + 31 * 16);
  EXPECT_TRUE(test::chunks_are_valid(contexts, blocks_of(contexts, 64), 64, 65536, equal));
  EXPECT_TRUE(test::chunks_are_valid(contexts, blocks_of(contexts, 64), 64, 65536, packed));
}

// ---- both policies --------------------------------------------------------------------------

TEST(PlannerChunks, NoContextMeansNoChunks) {
  for (ChunkPolicy policy : {ChunkPolicy::kEqualShare, ChunkPolicy::kPacked}) {
    const std::vector<int32_t> zeros = {0, 0, 0}, none;
    EXPECT_TRUE(plan_context_chunks(zeros, 16, 64, policy).empty());
    EXPECT_TRUE(plan_context_chunks(none, 16, 64, policy).empty());
  }
}

TEST(PlannerChunks, BadInputs) {
  const std::vector<int32_t> contexts = {10, 0};
  MLAKIT_EXPECT_THROW_MSG(plan_context_chunks(contexts, 0, 64, ChunkPolicy::kPacked),
                          "plan_context_chunks: block_size must be > 0, got 0");
  MLAKIT_EXPECT_THROW_MSG(plan_context_chunks(contexts, 64, 63, ChunkPolicy::kEqualShare),
                          "workspace_tokens must hold at least one block (block_size 64), got 63");
  MLAKIT_EXPECT_THROW_MSG(plan_context_chunks(contexts, 64, int64_t{1} << 31, ChunkPolicy::kPacked),
                          "workspace_tokens must be <= 2147483647, got 2147483648");
  const std::vector<int32_t> negative = {10, -3};
  MLAKIT_EXPECT_THROW_MSG(plan_context_chunks(negative, 16, 64, ChunkPolicy::kPacked),
                          "context_lens[1] must be >= 0, got -3");
}

// vLLM's equal-share formula, written out: share = round_down(ws / n, page), chunk i reads
// [i * share, min(ctx, (i + 1) * share)) of each request. Valid when ws >= n * page.
std::vector<std::vector<int32_t>> equal_share_lens(const std::vector<int32_t>& contexts,
                                                   int64_t block_size, int64_t workspace) {
  int64_t n = 0, max_context = 0;
  for (int32_t c : contexts) {
    n += c > 0;
    max_context = std::max<int64_t>(max_context, c);
  }
  std::vector<std::vector<int32_t>> lens;
  if (n == 0) return lens;
  const int64_t share = workspace / n / block_size * block_size;
  for (int64_t i = 0; i * share < max_context; ++i) {
    std::vector<int32_t> row;
    for (int32_t c : contexts) {
      row.push_back(static_cast<int32_t>(
          std::max<int64_t>(std::min<int64_t>(c, (i + 1) * share) - i * share, 0)));
    }
    lens.push_back(row);
  }
  return lens;
}

// Random batches: every invariant, plus per policy: equal share equals vLLM's formula whenever
// the workspace holds a page per request; packed chunks are full (fewer than block_size rows
// free, except the last) and visit requests in order.
TEST(PlannerChunks, RandomBatchesKeepEveryInvariant) {
  std::mt19937_64 rng = test::make_rng(601);
  int64_t total_chunks = 0;
  for (int trial = 0; trial < test::kRandomBatches; ++trial) {
    const test::RandomChunkConfig config = test::random_chunk_config(rng);
    const int64_t np = std::uniform_int_distribution<int64_t>(1, 64)(rng);
    const std::vector<int32_t> contexts = test::random_context_lens(rng, np, config);
    const auto chunks =
        plan_context_chunks(contexts, config.block_size, config.workspace_tokens, config.policy);
    total_chunks += static_cast<int64_t>(chunks.size());
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " block_size " << config.block_size << " workspace "
                 << config.workspace_tokens << " policy " << static_cast<int>(config.policy)
                 << " contexts " << ::testing::PrintToString(contexts));
    ASSERT_TRUE(test::chunks_are_valid(contexts, blocks_of(contexts, config.block_size),
                                       config.block_size, config.workspace_tokens, chunks));
    if (config.policy == ChunkPolicy::kEqualShare) {
      const int64_t n =
          std::count_if(contexts.begin(), contexts.end(), [](int32_t c) { return c > 0; });
      if (config.workspace_tokens >= n * config.block_size) {
        const auto expected =
            equal_share_lens(contexts, config.block_size, config.workspace_tokens);
        ASSERT_EQ(chunks.size(), expected.size());
        for (size_t i = 0; i < chunks.size(); ++i) ASSERT_EQ(chunks[i].seq_lens, expected[i]);
      }
    } else {
      for (size_t i = 0; i + 1 < chunks.size(); ++i) {
        ASSERT_LT(config.workspace_tokens - chunks[i].total_tokens, config.block_size)
            << "packed chunk " << i << " is not full";
        int64_t last_in_chunk = 0, first_in_next = np;
        for (int64_t r = 0; r < np; ++r) {
          if (chunks[i].seq_lens[r] > 0) last_in_chunk = r;
          if (chunks[i + 1].seq_lens[r] > 0) first_in_next = std::min(first_in_next, r);
        }
        ASSERT_LE(last_in_chunk, first_in_next) << "packed chunks out of request order";
      }
    }
  }
  EXPECT_GT(total_chunks, test::kRandomBatches) << "the generator rarely makes several chunks";
}

}  // namespace
}  // namespace mlakit
