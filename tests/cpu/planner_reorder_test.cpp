// B.5 decodes-first reorder: the reference table of spec B.5 (vLLM
// tests/v1/attention/test_batch_reordering.py), ported verbatim, plus properties and bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "common/test_util.hpp"
#include "mlakit/error.hpp"
#include "mlakit/plan.hpp"

namespace mlakit {
namespace {

struct Request {
  int32_t scheduled;
  int32_t computed;
};

std::vector<int32_t> reorder(const std::vector<Request>& requests, int64_t threshold) {
  std::vector<int32_t> scheduled, computed;
  for (const Request& r : requests) {
    scheduled.push_back(r.scheduled);
    computed.push_back(r.computed);
  }
  return reorder_decodes_first(scheduled, computed, threshold);
}

struct ReorderCase {
  std::vector<Request> requests;
  int64_t threshold;
  std::vector<int32_t> expected_order;
};

TEST(PlannerReorder, ReferenceTable) {
  const std::vector<ReorderCase> cases = {
      {{{100, 100}, {1, 10}, {200, 200}, {1, 20}}, 1, {3, 1, 2, 0}},
      {{{100, 100}, {200, 200}, {1, 10}, {1, 20}}, 1, {2, 3, 0, 1}},
      {{{100, 0}, {10, 50}, {1, 10}}, 1, {2, 1, 0}},
      {{{100, 0}, {10, 50}, {200, 0}, {20, 75}}, 1, {3, 1, 2, 0}},
      {{{1, 20}, {1, 50}, {374, 0}, {300, 20}, {1, 20}, {256, 0}, {1, 5}, {27, 0}, {1, 4}},
       1,
       {0, 1, 6, 8, 4, 3, 2, 7, 5}},
      {{{100, 0}, {1, 0}, {50, 100}, {1, 10}}, 1, {3, 2, 0, 1}},  // a new 1-token request
      {{{1, 0}, {1, 0}, {1, 50}, {200, 0}}, 1, {2, 1, 0, 3}},
      {{{2, 10}, {3, 20}, {5, 30}, {6, 40}}, 4, {0, 1, 2, 3}},
  };
  for (const ReorderCase& c : cases) {
    EXPECT_EQ(reorder(c.requests, c.threshold), c.expected_order)
        << "case with " << c.requests.size() << " requests, threshold " << c.threshold;
  }
}

// Random batches: the order is a permutation, regions come out decode -> extend -> prefill, and
// requests already in their target region keep their position.
TEST(PlannerReorder, RandomBatchesArePartitionedWithMinimalMoves) {
  std::mt19937_64 rng = test::make_rng(501);
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t threshold = std::uniform_int_distribution<int64_t>(1, 4)(rng);
    const int n = std::uniform_int_distribution<int>(0, 24)(rng);
    std::vector<Request> requests(n);
    std::vector<int> region(n);  // 0 decode, 1 extend, 2 prefill, computed here independently
    for (int i = 0; i < n; ++i) {
      requests[i].scheduled = std::uniform_int_distribution<int32_t>(1, 8)(rng);
      requests[i].computed = std::bernoulli_distribution(0.3)(rng)
                                 ? 0
                                 : std::uniform_int_distribution<int32_t>(1, 100)(rng);
      region[i] = requests[i].computed == 0 ? 2 : (requests[i].scheduled <= threshold ? 0 : 1);
    }
    const std::vector<int32_t> order = reorder(requests, threshold);
    ASSERT_EQ(static_cast<int>(order.size()), n);
    std::vector<int32_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i) << "not a permutation";
    std::vector<int> target(region);
    std::sort(target.begin(), target.end());
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(region[order[i]], target[i]) << "trial " << trial << " position " << i;
      if (region[i] == target[i]) {
        ASSERT_EQ(order[i], i) << "a well-placed request moved";
      }
    }
  }
}

TEST(PlannerReorder, BadInputs) {
  const std::vector<int32_t> two = {1, 1}, one = {1}, negative = {-1, 1};
  MLAKIT_EXPECT_THROW_MSG(reorder_decodes_first(two, one, 1),
                          "num_scheduled and num_computed must have the same length, got 2 and 1");
  MLAKIT_EXPECT_THROW_MSG(reorder_decodes_first(two, two, 0),
                          "decode_threshold must be >= 1, got 0");
  MLAKIT_EXPECT_THROW_MSG(reorder_decodes_first(negative, two, 1),
                          "num_scheduled[0] must be >= 0, got -1");
  MLAKIT_EXPECT_THROW_MSG(reorder_decodes_first(two, negative, 1),
                          "num_computed[0] must be >= 0, got -1");
}

}  // namespace
}  // namespace mlakit
