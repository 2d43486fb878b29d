// make_plan: validation of the batch and the config (by message), plans of hand-built batches
// (mixed, padded CUDA-graph decode batches, spec B.6 example, DCP's decode threshold of one),
// and invariants over random batches, including "no block-table column >= cdiv(seq_len, block_size)
// is ever read".
#include "mlakit/plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "common/test_util.hpp"
#include "mlakit/error.hpp"
#include "planner_chunk_invariants.hpp"

namespace mlakit {
namespace {

// A batch owning its arrays; desc() views them.
struct Batch {
  std::vector<int32_t> query_start_loc{0};  // [R + 1]
  std::vector<int32_t> seq_lens;            // [R]
  int64_t num_actual_tokens = 0;
  int64_t block_table_width = 0;

  Batch& add(int32_t query_len, int32_t seq_len) {
    query_start_loc.push_back(query_start_loc.back() + query_len);
    seq_lens.push_back(seq_len);
    num_actual_tokens = query_start_loc.back();
    return *this;
  }
  BatchDesc desc() const {
    return {query_start_loc, seq_lens, num_actual_tokens, block_table_width};
  }
};

PlannerConfig config_with(int64_t block_size, int64_t workspace, ChunkPolicy policy,
                          QueryLenSupport support = QueryLenSupport::kVarlen,
                          int64_t threshold = 1) {
  PlannerConfig config;
  config.block_size = block_size;
  config.workspace_tokens = workspace;
  config.chunk_policy = policy;
  config.query_len_support = support;
  config.decode_threshold = threshold;
  return config;
}

// Two decodes (contexts 9 and 19: no chunks for them) and three prefills with contexts 0, 100,
// 70; packed into 128 rows with 16-token pages: request 1 fits whole (28 rows left), request 2
// gives a 16-token piece and continues at 16 (hand-derived).
TEST(PlannerPlan, MixedBatchAssemblesEveryPart) {
  Batch batch;
  batch.add(1, 10).add(1, 20).add(5, 5).add(3, 103).add(4, 74);
  batch.block_table_width = 7;  // cdiv(103, 16)
  const Plan plan = make_plan(batch.desc(), config_with(16, 128, ChunkPolicy::kPacked));
  EXPECT_EQ(plan.num_reqs, 5);
  EXPECT_EQ(plan.num_actual_tokens, 14);
  EXPECT_EQ(plan.split.num_decodes, 2);
  EXPECT_EQ(plan.split.num_prefills, 3);
  EXPECT_EQ(plan.split.num_decode_tokens, 2);
  EXPECT_EQ(plan.split.num_prefill_tokens, 12);
  EXPECT_EQ(plan.decode_query_len, 1);
  EXPECT_EQ(plan.max_decode_query_len, 1);
  EXPECT_EQ(plan.decode_schedule.split_offsets.size(), 3u);
  EXPECT_EQ(plan.prefill_query_start_loc, (std::vector<int32_t>{0, 5, 8, 12}));
  EXPECT_EQ(plan.prefill_max_query_len, 5);
  EXPECT_EQ(plan.prefill_context_lens, (std::vector<int32_t>{0, 100, 70}));
  ASSERT_EQ(plan.context_chunks.size(), 2u);
  EXPECT_TRUE(plan.has_context());
  EXPECT_EQ(plan.context_chunks[0].starts, (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(plan.context_chunks[0].seq_lens, (std::vector<int32_t>{0, 100, 16}));
  EXPECT_EQ(plan.context_chunks[1].starts, (std::vector<int32_t>{0, 0, 16}));
  EXPECT_EQ(plan.context_chunks[1].seq_lens, (std::vector<int32_t>{0, 0, 54}));
}

// Spec B.6 worked example through make_plan: prefill contexts [100000, 0, 5000].
TEST(PlannerPlan, EqualShareWorkedExample) {
  Batch batch;
  batch.add(7, 100007).add(3, 3).add(1, 5001);
  batch.block_table_width = 1563;  // cdiv(100007, 64)
  const Plan plan = make_plan(batch.desc(), config_with(64, 65536, ChunkPolicy::kEqualShare));
  EXPECT_EQ(plan.split.num_decodes, 0);
  EXPECT_EQ(plan.prefill_context_lens, (std::vector<int32_t>{100000, 0, 5000}));
  ASSERT_EQ(plan.context_chunks.size(), 4u);
  std::vector<int64_t> totals;
  for (const ContextChunk& c : plan.context_chunks) totals.push_back(c.total_tokens);
  EXPECT_EQ(totals, (std::vector<int64_t>{37768, 32768, 32768, 1696}));
}

// F-42: a CUDA-graph padded uniform decode batch (padding request q_len 0, seq_len 0, its block
// table row all -1): all four requests are decodes of q_len 2, nothing reads the padding row.
TEST(PlannerPlan, PaddedUniformDecodeBatch) {
  Batch batch;
  batch.add(2, 10).add(2, 7).add(2, 3).add(0, 0);
  batch.num_actual_tokens = 8;
  batch.block_table_width = 1;
  const Plan plan = make_plan(
      batch.desc(), config_with(16, 64, ChunkPolicy::kPacked, QueryLenSupport::kUniform, 3));
  EXPECT_EQ(plan.split.num_decodes, 4);
  EXPECT_EQ(plan.split.num_decode_tokens, 8);
  EXPECT_EQ(plan.split.num_prefills, 0);
  EXPECT_EQ(plan.decode_query_len, 2);
  EXPECT_EQ(plan.max_decode_query_len, 2);
  EXPECT_EQ(plan.decode_schedule.split_offsets.size(), 5u);
  EXPECT_EQ(plan.prefill_query_start_loc, (std::vector<int32_t>{0}));
  EXPECT_FALSE(plan.has_context());
}

// Varlen decodes padded with a request but not with tokens: still all decodes, not uniform.
TEST(PlannerPlan, PaddedVarlenDecodeBatchIsNotUniform) {
  Batch batch;
  batch.add(1, 10).add(1, 7).add(0, 0);
  batch.num_actual_tokens = 4;
  batch.block_table_width = 1;
  const Plan plan = make_plan(batch.desc(), config_with(16, 64, ChunkPolicy::kEqualShare));
  EXPECT_EQ(plan.split.num_decodes, 3);
  EXPECT_EQ(plan.split.num_decode_tokens, 4);
  EXPECT_EQ(plan.decode_query_len, 0);
  EXPECT_EQ(plan.max_decode_query_len, 1);
}

// Padding requests inside a prefill batch (q_len 0, seq_len 0) have no context and no chunk.
TEST(PlannerPlan, PaddingRequestsAmongPrefills) {
  Batch batch;
  batch.add(9, 40).add(0, 0).add(0, 0);
  batch.num_actual_tokens = 12;
  batch.block_table_width = 3;
  const Plan plan = make_plan(batch.desc(), config_with(16, 64, ChunkPolicy::kPacked));
  EXPECT_EQ(plan.split.num_prefills, 3);
  EXPECT_EQ(plan.split.num_prefill_tokens, 12);
  EXPECT_EQ(plan.prefill_context_lens, (std::vector<int32_t>{31, 0, 0}));
  ASSERT_EQ(plan.context_chunks.size(), 1u);
  EXPECT_EQ(plan.context_chunks[0].seq_lens, (std::vector<int32_t>{31, 0, 0}));
}

TEST(PlannerPlan, PrefillsWithoutContextHaveNoChunks) {
  Batch batch;
  batch.add(1, 500).add(7, 7).add(3, 3);  // the decode's context never makes a chunk
  batch.block_table_width = 8;
  const Plan plan = make_plan(batch.desc(), config_with(64, 64, ChunkPolicy::kEqualShare));
  EXPECT_EQ(plan.split.num_decodes, 1);
  EXPECT_EQ(plan.prefill_max_query_len, 7);
  EXPECT_FALSE(plan.has_context());
}

TEST(PlannerPlan, BadBatches) {
  const PlannerConfig config = config_with(16, 64, ChunkPolicy::kPacked);
  Batch good;
  good.add(1, 10).add(4, 20);
  good.block_table_width = 2;
  EXPECT_NO_THROW(make_plan(good.desc(), config));

  Batch b = good;
  b.query_start_loc.pop_back();
  MLAKIT_EXPECT_THROW_MSG(make_plan(b.desc(), config),
                          "make_plan: query_start_loc must have num_reqs + 1 = 3 entries");
  b = good;
  b.query_start_loc = {2, 3, 7};
  MLAKIT_EXPECT_THROW_MSG(make_plan(b.desc(), config), "query_start_loc[0] must be 0, got 2");
  b = good;
  b.query_start_loc = {0, 5, 4};
  MLAKIT_EXPECT_THROW_MSG(make_plan(b.desc(), config),
                          "query_start_loc must be non-decreasing, got query_start_loc[2] = 4");
  b = good;
  b.num_actual_tokens = 4;
  MLAKIT_EXPECT_THROW_MSG(make_plan(b.desc(), config),
                          "query_start_loc[num_reqs] (5) must be <= num_actual_tokens, got "
                          "num_actual_tokens 4");
  b = good;
  b.seq_lens[1] = -1;
  MLAKIT_EXPECT_THROW_MSG(make_plan(b.desc(), config), "seq_lens[1] must be >= 0, got -1");
  b = good;
  b.seq_lens[1] = 3;
  MLAKIT_EXPECT_THROW_MSG(make_plan(b.desc(), config),
                          "seq_lens[1] (3) must be >= the query length of request 1 (4)");
  b = good;
  b.seq_lens[1] = 33;
  MLAKIT_EXPECT_THROW_MSG(make_plan(b.desc(), config),
                          "request 1 with seq_len 33 needs 3 blocks of block_size 16, but "
                          "block_table_width is 2");
  b = good;
  b.block_table_width = -1;
  MLAKIT_EXPECT_THROW_MSG(make_plan(b.desc(), config), "block_table_width must be >= 0, got -1");
}

TEST(PlannerPlan, BadConfigs) {
  Batch batch;
  batch.add(1, 10).add(4, 20);
  batch.block_table_width = 2;
  PlannerConfig c = config_with(16, 64, ChunkPolicy::kPacked);
  c.block_size = 0;
  MLAKIT_EXPECT_THROW_MSG(make_plan(batch.desc(), c), "config.block_size must be > 0, got 0");
  c = config_with(16, 0, ChunkPolicy::kPacked);
  MLAKIT_EXPECT_THROW_MSG(make_plan(batch.desc(), c), "config.workspace_tokens must be > 0, got 0");
  c = config_with(16, 15, ChunkPolicy::kPacked);
  MLAKIT_EXPECT_THROW_MSG(make_plan(batch.desc(), c),
                          "config.workspace_tokens must hold at least one block (block_size 16), "
                          "got 15");
  c = config_with(16, int64_t{1} << 31, ChunkPolicy::kPacked);
  MLAKIT_EXPECT_THROW_MSG(make_plan(batch.desc(), c),
                          "config.workspace_tokens must be <= 2147483647");
  c = config_with(16, 64, ChunkPolicy::kPacked, QueryLenSupport::kVarlen, 0);
  MLAKIT_EXPECT_THROW_MSG(make_plan(batch.desc(), c),
                          "config.decode_threshold must be >= 1, got 0");
  c = config_with(16, 64, ChunkPolicy::kPacked, QueryLenSupport::kSingleOnly, 2);
  MLAKIT_EXPECT_THROW_MSG(make_plan(batch.desc(), c),
                          "config.decode_threshold must be 1 when query_len_support is "
                          "single_only, got 2");
  c = config_with(16, 64, ChunkPolicy::kPacked);
  c.num_workers = 0;
  MLAKIT_EXPECT_THROW_MSG(make_plan(batch.desc(), c), "config.num_workers must be >= 1, got 0");
}

// Decode kernels of single_only / uniform support view the decode tokens as [num_decodes, q_len];
// batches that cannot be viewed that way are rejected.
TEST(PlannerPlan, NonUniformDecodesRejectedWhenUniformRequired) {
  Batch unpadded;
  unpadded.add(1, 10).add(1, 7).add(0, 0);  // padding request without its padded token
  unpadded.block_table_width = 1;
  MLAKIT_EXPECT_THROW_MSG(
      make_plan(unpadded.desc(),
                config_with(16, 64, ChunkPolicy::kPacked, QueryLenSupport::kSingleOnly, 1)),
      "query_len_support single_only needs the decode tokens as a [num_decodes, q_len] block");
  Batch middle;
  middle.add(2, 10).add(0, 0).add(2, 7);  // padding between real decodes
  middle.num_actual_tokens = 6;           // 3 requests * q_len 2, as the split requires
  middle.block_table_width = 1;
  MLAKIT_EXPECT_THROW_MSG(make_plan(middle.desc(), config_with(16, 64, ChunkPolicy::kPacked,
                                                               QueryLenSupport::kUniform, 3)),
                          "got num_decodes 3, num_decode_tokens 6 and max decode query length 2");
}

// Spec F-15: under DCP a rank's local causal mask is wrong for q_len > 1, so the plan treats every
// request with new tokens beyond one as a prefill whatever decode_threshold says; without DCP the
// same batch runs as two q_len 2 decodes.
TEST(PlannerPlan, DcpForcesTheDecodeThresholdToOne) {
  Batch batch;
  batch.add(2, 100).add(2, 100);
  batch.block_table_width = 7;  // ceil(100 / 16): the whole table, W = 1 or 2 alike
  PlannerConfig config = config_with(16, 64, ChunkPolicy::kPacked, QueryLenSupport::kUniform, 2);
  const Plan alone = make_plan(batch.desc(), config);
  EXPECT_EQ(alone.split.num_decodes, 2);
  EXPECT_EQ(alone.split.num_prefills, 0);
  config.dcp.world_size = 2;
  for (int64_t rank = 0; rank < 2; ++rank) {
    config.dcp.rank = rank;
    const Plan shared = make_plan(batch.desc(), config);
    EXPECT_EQ(shared.split.num_decodes, 0) << "rank " << rank;
    EXPECT_EQ(shared.split.num_prefills, 2) << "rank " << rank;
  }
}

// ---- random batches -------------------------------------------------------------------------

struct RandomBatch {
  Batch batch;
  PlannerConfig config;
  int64_t expected_decodes = 0;    // real decodes + padding requests
  int64_t expected_query_len = 0;  // decode_query_len the plan must report
  std::vector<int32_t> prefill_contexts;
};

// Decodes (q_len <= threshold; one common q_len unless varlen) then prefills (the first with
// q_len > threshold, so the split point is known); decode-only batches may end in CUDA-graph
// padding requests.
RandomBatch random_batch(std::mt19937_64& rng) {
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  RandomBatch out;
  const test::RandomChunkConfig chunking = test::random_chunk_config(rng);
  PlannerConfig& config = out.config;
  config.block_size = chunking.block_size;
  config.workspace_tokens = chunking.workspace_tokens;
  config.chunk_policy = chunking.policy;
  config.query_len_support = static_cast<QueryLenSupport>(uniform(0, 2));
  config.decode_threshold = config.query_len_support == QueryLenSupport::kSingleOnly
                                ? 1
                                : uniform(1, 4);  // 1 + up to 3 speculative tokens
  config.num_workers = uniform(1, 16);
  const bool varlen = config.query_len_support == QueryLenSupport::kVarlen;
  const int64_t t = config.decode_threshold;

  const int64_t nd = uniform(0, 8);
  const int64_t np = std::bernoulli_distribution(0.1)(rng) ? 0 : uniform(1, 64);
  const int32_t common_q = static_cast<int32_t>(uniform(1, t));
  Batch& batch = out.batch;
  std::vector<int32_t> decode_query_lens;
  for (int64_t i = 0; i < nd; ++i) {
    const int32_t q = varlen ? static_cast<int32_t>(uniform(1, t)) : common_q;
    decode_query_lens.push_back(q);
    batch.add(q, q + static_cast<int32_t>(uniform(0, 5000)));
  }
  const int64_t decode_tokens = batch.query_start_loc.back();
  out.prefill_contexts = test::random_context_lens(rng, np, chunking);
  for (int64_t r = 0; r < np; ++r) {
    const int32_t q = static_cast<int32_t>(r == 0 ? uniform(t + 1, t + 200) : uniform(0, 300));
    batch.add(q, out.prefill_contexts[r] + q);
  }
  out.expected_decodes = nd;
  if (np == 0) {
    const int64_t padding = uniform(0, 3);
    for (int64_t i = 0; i < padding; ++i) batch.add(0, 0);
    out.expected_decodes = nd + padding;
    batch.num_actual_tokens =
        varlen ? decode_tokens + uniform(0, 3) : out.expected_decodes * (nd > 0 ? common_q : 0);
  } else {
    batch.num_actual_tokens = batch.query_start_loc.back() + uniform(0, 3);
  }
  // Uniform: the real decodes share one q_len and all decode tokens form [decodes, q_len].
  const int64_t num_decode_tokens = np == 0 ? batch.num_actual_tokens : decode_tokens;
  const int32_t first_q = nd > 0 ? decode_query_lens[0] : 0;
  const bool reshapeable =
      nd > 0 && std::count(decode_query_lens.begin(), decode_query_lens.end(), first_q) == nd &&
      num_decode_tokens == out.expected_decodes * first_q;
  out.expected_query_len = reshapeable ? first_q : 0;

  int64_t max_blocks = 0;
  for (int32_t s : batch.seq_lens)
    max_blocks = std::max(max_blocks, test::ceil_div(s, config.block_size));
  batch.block_table_width = max_blocks + uniform(0, 2);
  return out;
}

TEST(PlannerPlan, RandomBatchesGiveConsistentSafePlans) {
  std::mt19937_64 rng = test::make_rng(701);
  for (int trial = 0; trial < test::kRandomBatches; ++trial) {
    const RandomBatch rb = random_batch(rng);
    const Batch& batch = rb.batch;
    const PlannerConfig& config = rb.config;
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " query_start_loc "
                 << ::testing::PrintToString(batch.query_start_loc) << " seq_lens "
                 << ::testing::PrintToString(batch.seq_lens) << " T " << batch.num_actual_tokens
                 << " block_size " << config.block_size << " workspace " << config.workspace_tokens
                 << " policy " << static_cast<int>(config.chunk_policy) << " support "
                 << static_cast<int>(config.query_len_support) << " threshold "
                 << config.decode_threshold);
    const Plan plan = make_plan(batch.desc(), config);
    const int64_t num_reqs = static_cast<int64_t>(batch.seq_lens.size());
    const int64_t nd = rb.expected_decodes, np = num_reqs - nd;
    ASSERT_EQ(plan.num_reqs, num_reqs);
    ASSERT_EQ(plan.split.num_decodes, nd);
    ASSERT_EQ(plan.split.num_prefills, np);
    const int64_t decode_tokens = np == 0 ? batch.num_actual_tokens : batch.query_start_loc[nd];
    ASSERT_EQ(plan.split.num_decode_tokens, decode_tokens);
    ASSERT_EQ(plan.split.num_prefill_tokens, batch.num_actual_tokens - decode_tokens);
    ASSERT_EQ(plan.decode_query_len, rb.expected_query_len);
    ASSERT_EQ(plan.decode_schedule.split_offsets.size(), static_cast<size_t>(nd + 1));

    int64_t max_decode_q = 0, max_prefill_q = 0;
    for (int64_t i = 0; i < num_reqs; ++i) {
      const int64_t q = batch.query_start_loc[i + 1] - batch.query_start_loc[i];
      int64_t& max_q = i < nd ? max_decode_q : max_prefill_q;
      max_q = std::max(max_q, q);
    }
    ASSERT_EQ(plan.max_decode_query_len, max_decode_q);
    ASSERT_EQ(plan.prefill_max_query_len, max_prefill_q);
    ASSERT_EQ(plan.prefill_query_start_loc.size(), static_cast<size_t>(np + 1));
    for (int64_t r = 0; r <= np; ++r) {
      ASSERT_EQ(plan.prefill_query_start_loc[r],
                batch.query_start_loc[nd + r] - batch.query_start_loc[nd]);
    }
    if (np > 0) {
      ASSERT_EQ(plan.prefill_context_lens, rb.prefill_contexts);
    }

    // Pieces must stay inside each request's own blocks, which lie inside the table.
    std::vector<int64_t> readable_blocks;
    for (int64_t r = 0; r < np; ++r) {
      readable_blocks.push_back(test::ceil_div(batch.seq_lens[nd + r], config.block_size));
      ASSERT_LE(readable_blocks.back(), batch.block_table_width);
    }
    ASSERT_TRUE(test::chunks_are_valid(plan.prefill_context_lens, readable_blocks,
                                       config.block_size, config.workspace_tokens,
                                       plan.context_chunks));
  }
}

}  // namespace
}  // namespace mlakit
