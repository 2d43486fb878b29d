// plan_dcp_context_chunks (spec B.7, F-18, D.12 "chunk_planner" DCP variant): on random batches,
// the global chunks satisfy every single-rank invariant with pieces aligned to
// lcm(block_size, W I); simulating the W ranks' local gathers and the all-gather shows every
// context token gathered exactly once across ranks, only from positions below the rank's local
// context length, and gathered_row listing them in global order; the all-gathered rows and the
// reorganised chunk fit the workspace.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "common/test_util.hpp"
#include "mlakit/dcp.hpp"
#include "mlakit/error.hpp"
#include "planner_chunk_invariants.hpp"

namespace mlakit {
namespace {

// Random batches: a tenth of the single-rank property tests (each batch plans W ranks).
constexpr int kBatches = test::kRandomBatches / 10;

// Global position of local position j of `rank` (the inverse of dcp_local_position).
int64_t global_position(int64_t j, int64_t rank, int64_t w, int64_t interleave) {
  return j / interleave * (w * interleave) + rank * interleave + j % interleave;
}

// Plans every rank and checks the chunks against each other and the contexts.
::testing::AssertionResult dcp_plan_is_valid(std::span<const int32_t> contexts, int64_t block_size,
                                             int64_t workspace, ChunkPolicy policy, int64_t w,
                                             int64_t interleave) {
  std::vector<std::vector<DcpContextChunk>> plans;
  for (int64_t rank = 0; rank < w; ++rank) {
    plans.push_back(plan_dcp_context_chunks(
        contexts, block_size, workspace, policy,
        DcpConfig{.world_size = w, .rank = rank, .interleave = interleave}));
  }
  const int64_t alignment = std::lcm(block_size, w * interleave);
  std::vector<ContextChunk> globals;
  for (const DcpContextChunk& c : plans[0]) globals.push_back(c.global);
  std::vector<int64_t> readable(contexts.size());
  for (size_t r = 0; r < contexts.size(); ++r) readable[r] = test::ceil_div(contexts[r], alignment);
  auto valid = test::chunks_are_valid(contexts, readable, alignment, workspace, globals);
  if (!valid) return valid << " (global chunks, alignment " << alignment << ")";

  for (size_t c = 0; c < globals.size(); ++c) {
    auto fail = [&]() { return ::testing::AssertionFailure() << "chunk " << c << ": "; };
    const ContextChunk& global = globals[c];
    const int64_t rows = plans[0][c].rows_per_rank;
    if (w * rows > workspace) return fail() << "W * rows_per_rank " << w * rows << " > workspace";
    // The all-gathered buffer as (request, global position) per row; -1 rows are never written.
    std::vector<std::pair<int64_t, int64_t>> exchange(w * rows, {-1, -1});
    for (int64_t rank = 0; rank < w; ++rank) {
      const DcpContextChunk& mine = plans[rank][c];
      if (mine.rows_per_rank != rows || mine.global.cu_seq_lens != global.cu_seq_lens ||
          mine.gathered_row != plans[0][c].gathered_row) {
        return fail() << "rank " << rank << " disagrees with rank 0 on the shared fields";
      }
      const ContextChunk& local = mine.local;
      if (local.total_tokens > rows) return fail() << "rank " << rank << " gathers > rows";
      for (int64_t i = 0; i < local.total_tokens; ++i) {
        const int64_t r = local.token_to_seq[i];
        const int64_t j = local.starts[r] + i - local.cu_seq_lens[r];
        if (j >= dcp_local_seq_len(contexts[r], w, rank, interleave)) {
          return fail() << "rank " << rank << " reads local position " << j << " of request " << r
                        << ", beyond its local context";
        }
        exchange[rank * rows + i] = {r, global_position(j, rank, w, interleave)};
      }
    }
    if (static_cast<int64_t>(plans[0][c].gathered_row.size()) != global.total_tokens) {
      return fail() << "gathered_row has the wrong size";
    }
    std::vector<int> uses(w * rows, 0);
    for (int64_t t = 0; t < global.total_tokens; ++t) {
      const int64_t r = global.token_to_seq[t];
      const std::pair<int64_t, int64_t> expected = {r,
                                                    global.starts[r] + t - global.cu_seq_lens[r]};
      const int64_t row = plans[0][c].gathered_row[t];
      if (row < 0 || row >= w * rows || exchange[row] != expected) {
        return fail() << "global row " << t << " (request " << r << ", position " << expected.second
                      << ") maps to exchange row " << row;
      }
      ++uses[row];
    }
    int64_t gathered = 0;
    for (int64_t row = 0; row < w * rows; ++row) {
      if (exchange[row].first >= 0 && uses[row] != 1) {
        return fail() << "exchange row " << row << " used " << uses[row] << " times";
      }
      gathered += exchange[row].first >= 0;
    }
    if (gathered != global.total_tokens) {
      return fail() << gathered << " rows gathered for " << global.total_tokens << " tokens";
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(DcpChunks, RandomBatchesGatherEveryTokenOnceInGlobalOrder) {
  auto rng = test::make_rng(1502);
  const int64_t worlds[] = {1, 2, 4, 8}, interleaves[] = {1, 2, 16, 64};
  for (int i = 0; i < kBatches; ++i) {
    test::RandomChunkConfig config = test::random_chunk_config(rng);
    const int64_t w = worlds[std::uniform_int_distribution<int>(0, 3)(rng)];
    const int64_t interleave = interleaves[std::uniform_int_distribution<int>(0, 3)(rng)];
    config.workspace_tokens =
        std::max(config.workspace_tokens, std::lcm(config.block_size, w * interleave));
    const int64_t np = std::uniform_int_distribution<int64_t>(0, 64)(rng);
    const std::vector<int32_t> contexts = test::random_context_lens(rng, np, config);
    ASSERT_TRUE(dcp_plan_is_valid(contexts, config.block_size, config.workspace_tokens,
                                  config.policy, w, interleave))
        << "batch " << i << ": W " << w << " I " << interleave << " block_size "
        << config.block_size << " workspace " << config.workspace_tokens;
  }
}

// Spec F-18: vLLM's plan for this batch overflows its workspace and breaks its reorg assert.
TEST(DcpChunks, InterleaveLargerThanTheChunkShareStillFits) {
  const std::vector<int32_t> contexts = {22000, 23000, 30000};
  for (ChunkPolicy policy : {ChunkPolicy::kEqualShare, ChunkPolicy::kPacked}) {
    EXPECT_TRUE(dcp_plan_is_valid(contexts, 64, 65536, policy, 2, 64));
  }
}

// Spec B.7's worked example (W 2, I 1, contexts [10, 3]) with a 4-row workspace: every token
// once, in global order (not rank-major as in vLLM, F-12).
TEST(DcpChunks, WorkedExampleInGlobalOrder) {
  const std::vector<int32_t> contexts = {10, 3};
  const std::vector<DcpContextChunk> chunks = plan_dcp_context_chunks(
      contexts, 1, 4, ChunkPolicy::kEqualShare, DcpConfig{.world_size = 2, .rank = 1});
  EXPECT_TRUE(dcp_plan_is_valid(contexts, 1, 4, ChunkPolicy::kEqualShare, 2, 1));
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks[0].global.seq_lens, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(chunks[0].local.seq_lens, (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(chunks[0].rows_per_rank, 2);
  // Global rows [req0 p0, req0 p1, req1 p0, req1 p1]: rank 0's rows 0-1, rank 1's rows 2-3.
  EXPECT_EQ(chunks[0].gathered_row, (std::vector<int32_t>{0, 2, 1, 3}));
}

TEST(DcpChunks, BadInputThrows) {
  const std::vector<int32_t> contexts = {5};
  const DcpConfig dcp{.world_size = 4, .rank = 0, .interleave = 16};
  MLAKIT_EXPECT_THROW_MSG(plan_dcp_context_chunks(contexts, 16, 32, ChunkPolicy::kPacked, dcp),
                          "at least lcm(block_size, world_size * interleave) = 64");
  MLAKIT_EXPECT_THROW_MSG(
      plan_dcp_context_chunks(std::vector<int32_t>{-1}, 16, 64, ChunkPolicy::kPacked, dcp),
      "context_lens[0] must be >= 0");
  MLAKIT_EXPECT_THROW_MSG(plan_dcp_context_chunks(contexts, 16, 64, ChunkPolicy::kPacked,
                                                  DcpConfig{.world_size = 2, .rank = 3}),
                          "rank must be in [0, world_size = 2)");
}

}  // namespace
}  // namespace mlakit
