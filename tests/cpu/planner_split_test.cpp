// B.4 decode / prefill split: the reference table of spec B.4 (vLLM
// tests/v1/attention/test_attention_splitting.py), ported verbatim, plus bad inputs.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/test_util.hpp"
#include "mlakit/error.hpp"
#include "mlakit/plan.hpp"

namespace mlakit {
namespace {

std::vector<int32_t> cumulative(const std::vector<int32_t>& query_lens) {
  std::vector<int32_t> qsl{0};
  for (int32_t q : query_lens) qsl.push_back(qsl.back() + q);
  return qsl;
}

struct SplitCase {
  std::vector<int32_t> query_lens;
  int64_t threshold;
  bool require_uniform;
  int64_t num_actual_tokens;  // -1: the sum of query_lens (no padding)
  SplitCounts expected;
};

TEST(PlannerSplit, ReferenceTable) {
  const std::vector<SplitCase> cases = {
      {{1, 1, 1}, 1, false, -1, {3, 0, 3, 0}},
      {{1, 2, 1, 3, 2, 1, 2}, 3, false, -1, {7, 0, 12, 0}},
      {{4, 5, 6, 7}, 3, false, -1, {0, 4, 0, 22}},
      {{2, 1, 3, 4, 5, 6, 7, 8}, 4, false, -1, {4, 4, 10, 26}},
      {{1, 1, 1}, 1, true, -1, {3, 0, 3, 0}},
      {{2, 2, 1, 3, 2, 1, 2}, 3, true, -1, {2, 5, 4, 9}},
      {{4, 5, 6, 7}, 3, true, -1, {0, 4, 0, 22}},
      {{2, 2, 2, 4, 5, 6, 7, 8}, 4, true, -1, {3, 5, 6, 30}},
      {{2, 1, 2, 4, 5, 6, 7, 8}, 4, true, -1, {1, 7, 2, 33}},
      // CUDA-graph padded uniform batch: a padding request (q_len 0) and T padded to 4 * 2.
      {{2, 2, 2, 0}, 3, true, 8, {4, 0, 8, 0}},
  };
  for (const SplitCase& c : cases) {
    const std::vector<int32_t> qsl = cumulative(c.query_lens);
    const int64_t tokens = c.num_actual_tokens < 0 ? qsl.back() : c.num_actual_tokens;
    const SplitCounts got = split_decodes_and_prefills(qsl, tokens, c.threshold, c.require_uniform);
    SCOPED_TRACE(::testing::Message()
                 << "query_lens " << ::testing::PrintToString(c.query_lens) << " threshold "
                 << c.threshold << " uniform " << c.require_uniform);
    EXPECT_EQ(got.num_decodes, c.expected.num_decodes);
    EXPECT_EQ(got.num_prefills, c.expected.num_prefills);
    EXPECT_EQ(got.num_decode_tokens, c.expected.num_decode_tokens);
    EXPECT_EQ(got.num_prefill_tokens, c.expected.num_prefill_tokens);
  }
}

// Classification is positional: a short request after the first prefill stays a prefill, and the
// padded tokens beyond query_start_loc[R] belong to the prefill part.
TEST(PlannerSplit, PositionalAndPaddedTokens) {
  const std::vector<int32_t> qsl = cumulative({1, 1, 9, 1});
  const SplitCounts got = split_decodes_and_prefills(qsl, 15, 1, false);
  EXPECT_EQ(got.num_decodes, 2);
  EXPECT_EQ(got.num_prefills, 2);
  EXPECT_EQ(got.num_decode_tokens, 2);
  EXPECT_EQ(got.num_prefill_tokens, 13);
}

TEST(PlannerSplit, EmptyBatchIsAllDecode) {
  const std::vector<int32_t> qsl = {0};
  const SplitCounts got = split_decodes_and_prefills(qsl, 0, 1, true);
  EXPECT_EQ(got.num_decodes, 0);
  EXPECT_EQ(got.num_prefills, 0);
  EXPECT_EQ(got.num_decode_tokens, 0);
  EXPECT_EQ(got.num_prefill_tokens, 0);
}

TEST(PlannerSplit, BadInputs) {
  const std::vector<int32_t> empty;
  MLAKIT_EXPECT_THROW_MSG(split_decodes_and_prefills(empty, 0, 1, false),
                          "query_start_loc must have num_reqs + 1 >= 1 entries");
  const std::vector<int32_t> not_zero = {1, 2};
  MLAKIT_EXPECT_THROW_MSG(split_decodes_and_prefills(not_zero, 2, 1, false),
                          "query_start_loc[0] must be 0, got 1");
  const std::vector<int32_t> decreasing = {0, 3, 2};
  MLAKIT_EXPECT_THROW_MSG(split_decodes_and_prefills(decreasing, 3, 1, false),
                          "query_start_loc must be non-decreasing, got query_start_loc[2] = 2");
  const std::vector<int32_t> qsl = {0, 1, 2};
  MLAKIT_EXPECT_THROW_MSG(split_decodes_and_prefills(qsl, 1, 1, false),
                          "query_start_loc[num_reqs] (2) must be <= num_actual_tokens, got "
                          "num_actual_tokens 1");
  MLAKIT_EXPECT_THROW_MSG(split_decodes_and_prefills(qsl, 2, 0, false),
                          "decode_threshold must be >= 1, got 0");
  // Uniform decodes padded with a q_len-0 request but without the padded tokens.
  const std::vector<int32_t> unpadded = cumulative({2, 2, 2, 0});
  MLAKIT_EXPECT_THROW_MSG(split_decodes_and_prefills(unpadded, 6, 3, true),
                          "a uniform decode batch of 4 requests with query length 2 must have 8 "
                          "tokens (padding included), got num_actual_tokens 6");
}

}  // namespace
}  // namespace mlakit
