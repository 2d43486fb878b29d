// plan_decode_splits: coverage invariants on random batches, the worked examples of the brief,
// and input validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "common/test_util.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/plan.hpp"

namespace mlakit {
namespace {

// Every request's keys are covered exactly by its splits, in whole blocks.
void expect_valid(const DecodeSchedule& s, const std::vector<int32_t>& lens, int64_t bs) {
  const int64_t batch = static_cast<int64_t>(lens.size());
  ASSERT_EQ(static_cast<int64_t>(s.split_offsets.size()), batch + 1);
  ASSERT_EQ(static_cast<int64_t>(s.split_len.size()), batch);
  EXPECT_EQ(s.split_offsets[0], 0);
  int64_t max_splits = 0;
  for (int64_t b = 0; b < batch; ++b) {
    SCOPED_TRACE(testing::Message() << "request " << b << " seq_len " << lens[b]);
    const int64_t n = s.num_splits(b), len = s.split_len[b];
    max_splits = std::max(max_splits, n);
    if (lens[b] == 0) {
      EXPECT_EQ(n, 0);
      continue;
    }
    EXPECT_GT(len, 0);
    EXPECT_EQ(len % bs, 0);
    EXPECT_GE(n * len, lens[b]);        // the splits reach the last key
    EXPECT_LT((n - 1) * len, lens[b]);  // and none of them is empty
  }
  EXPECT_EQ(s.total_splits, s.split_offsets[batch]);
  EXPECT_EQ(s.max_splits, max_splits);
}

TEST(PlanDecodeSplits, ManyRequestsGetOneSplitEach) {
  const std::vector<int32_t> lens(32, 4096);
  const DecodeSchedule s = plan_decode_splits(lens, 64, 2);
  expect_valid(s, lens, 64);
  EXPECT_EQ(s.total_splits, 32);
  EXPECT_EQ(s.max_splits, 1);
  for (int32_t len : s.split_len) EXPECT_EQ(len, 4096);
}

TEST(PlanDecodeSplits, OneLongRequestIsSplitForTheWorkers) {
  const std::vector<int32_t> lens = {4096};
  const DecodeSchedule s = plan_decode_splits(lens, 64, 2);
  expect_valid(s, lens, 64);
  EXPECT_GE(s.total_splits, 4);  // at least 2 pieces per worker
  EXPECT_LE(s.total_splits, 16);
  // Equal pieces: every split of the request has the same length except possibly the last.
  EXPECT_EQ(4096 % s.split_len[0], 0);
}

TEST(PlanDecodeSplits, EmptyRequestsHaveNoSplit) {
  const std::vector<int32_t> lens = {0, 100, 0};
  const DecodeSchedule s = plan_decode_splits(lens, 16, 8);
  expect_valid(s, lens, 16);
  EXPECT_EQ(s.num_splits(0), 0);
  EXPECT_EQ(s.num_splits(2), 0);
  const DecodeSchedule none = plan_decode_splits(std::vector<int32_t>{0, 0}, 16, 8);
  EXPECT_EQ(none.total_splits, 0);
  EXPECT_EQ(none.max_splits, 0);
  const DecodeSchedule empty_batch = plan_decode_splits(std::vector<int32_t>{}, 16, 8);
  EXPECT_EQ(empty_batch.total_splits, 0);
  EXPECT_EQ(empty_batch.split_offsets, std::vector<int32_t>{0});
}

TEST(PlanDecodeSplits, PiecesStayLongWithManyWorkers) {
  // Far more workers than keys: at most one piece per 64 keys (rounded up), each >= one block.
  for (int64_t bs : {1, 16, 128}) {
    const std::vector<int32_t> lens = {1000, 3};
    const DecodeSchedule s = plan_decode_splits(lens, bs, 4096);
    expect_valid(s, lens, bs);
    EXPECT_LE(s.num_splits(0), (1000 + 63) / 64) << bs;
    EXPECT_GE(s.split_len[0], bs);
    EXPECT_EQ(s.num_splits(1), 1);
  }
}

TEST(PlanDecodeSplits, UnevenBatchSplitsTheLongRequest) {
  const std::vector<int32_t> lens = {100000, 10, 20};
  const DecodeSchedule s = plan_decode_splits(lens, 64, 4);
  expect_valid(s, lens, 64);
  EXPECT_GE(s.num_splits(0), 8);
  EXPECT_EQ(s.num_splits(1), 1);
  EXPECT_EQ(s.num_splits(2), 1);
}

TEST(PlanDecodeSplits, RandomBatchesAreCoveredAndBounded) {
  auto rng = test::make_rng(1);
  std::uniform_int_distribution<int> batch_dist(1, 40), len_dist(0, 20000), workers_dist(1, 64);
  const int64_t block_sizes[] = {1, 16, 64, 128};
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<int32_t> lens(batch_dist(rng));
    for (int32_t& len : lens) len = (rng() % 5 == 0) ? 0 : len_dist(rng);
    const int64_t bs = block_sizes[rng() % 4];
    const int64_t workers = workers_dist(rng);
    SCOPED_TRACE(testing::Message()
                 << "iteration " << iter << " bs " << bs << " workers " << workers);
    const DecodeSchedule s = plan_decode_splits(lens, bs, workers);
    expect_valid(s, lens, bs);
    // About 4 pieces per worker: at most that many plus one partial piece per request.
    EXPECT_LE(s.total_splits, 4 * workers + static_cast<int64_t>(lens.size()));
  }
}

// Batch-invariant schedules: a request's split length and count depend on its own length only
// (1024 keys rounded up to whole blocks, re-divided evenly), whatever the batch and the workers.
TEST(PlanDecodeSplits, BatchInvariantSplitsDependOnTheRequestOnly) {
  auto rng = test::make_rng(2);
  std::uniform_int_distribution<int> batch_dist(1, 128), len_dist(0, 20000), workers_dist(1, 64);
  for (int64_t bs : {1, 16, 64, 100}) {
    for (int iter = 0; iter < 50; ++iter) {
      const int32_t mine = len_dist(rng);
      const DecodeSchedule alone =
          plan_decode_splits(std::vector<int32_t>{mine}, bs, workers_dist(rng), true);
      std::vector<int32_t> lens(batch_dist(rng));
      for (int32_t& len : lens) len = len_dist(rng);
      const size_t at = rng() % (lens.size() + 1);
      lens.insert(lens.begin() + static_cast<std::ptrdiff_t>(at), mine);
      const DecodeSchedule inside = plan_decode_splits(lens, bs, workers_dist(rng), true);
      SCOPED_TRACE(testing::Message() << "bs " << bs << " seq_len " << mine);
      expect_valid(inside, lens, bs);
      EXPECT_EQ(inside.num_splits(static_cast<int64_t>(at)), alone.num_splits(0));
      if (mine > 0) {
        EXPECT_EQ(inside.split_len[at], alone.split_len[0]);
        // Pieces of at most max(1024, ceil(len / 16)) keys rounded up to a block: at most 16.
        const int64_t piece = std::max<int64_t>(1024, (mine + 15) / 16);
        EXPECT_LE(alone.split_len[0], (piece + bs - 1) / bs * bs);
        EXPECT_LE(alone.num_splits(0), 16);
      }
    }
  }
}

// max_decode_splits bounds every schedule of at most `batch` requests of at most max_seq_len keys
// (the workspace of an engine's worst step is sized with it).
TEST(PlanDecodeSplits, MaxDecodeSplitsBoundsEverySchedule) {
  auto rng = test::make_rng(3);
  std::uniform_int_distribution<int> batch_dist(1, 64), workers_dist(1, 64), coin(0, 1);
  for (int iter = 0; iter < 2000; ++iter) {
    const int64_t bs = std::vector<int64_t>{1, 16, 64, 100}[iter % 4];
    const int32_t max_len = std::uniform_int_distribution<int32_t>(1, 40000)(rng);
    const int64_t workers = workers_dist(rng);
    const bool invariant = coin(rng);
    std::vector<int32_t> lens(batch_dist(rng));
    const bool all_max = coin(rng);  // the extreme batch, or random lengths
    for (int32_t& len : lens)
      len = all_max ? max_len : std::uniform_int_distribution<int32_t>(0, max_len)(rng);
    const DecodeSchedule s = plan_decode_splits(lens, bs, workers, invariant);
    EXPECT_LE(s.total_splits,
              max_decode_splits(static_cast<int64_t>(lens.size()), max_len, bs, workers, invariant))
        << "bs " << bs << " max_len " << max_len << " workers " << workers << " invariant "
        << invariant;
  }
}

TEST(PlanDecodeSplits, RejectsBadInput) {
  const std::vector<int32_t> lens = {10, 20};
  MLAKIT_EXPECT_THROW_MSG(plan_decode_splits(lens, 0, 2),
                          "plan_decode_splits: block_size must be in [1, 2^31 - 1], got 0");
  MLAKIT_EXPECT_THROW_MSG(plan_decode_splits(lens, 16, 0),
                          "plan_decode_splits: num_workers must be in [1, 1048576], got 0");
  MLAKIT_EXPECT_THROW_MSG(plan_decode_splits(std::vector<int32_t>{5, -1}, 16, 2),
                          "plan_decode_splits: seq_lens[1] must be >= 0, got -1");
}

// shape.max_seq_len bounds every seq_len (ops.hpp). The GPU meets a longer one when the kernel
// runs (a bad index); the CPU plans from the lengths and refuses it at the call (a stress
// finding: it was accepted). A length equal to the bound is fine.
TEST(PlanMlaDecode, CpuRefusesASeqLenAboveMaxSeqLen) {
  const ops::DecodePlanShape shape{.device = Device::cpu(),
                                   .batch = 3,
                                   .s_q = 1,
                                   .num_heads = 4,
                                   .block_size = 16,
                                   .max_seq_len = 64};
  EXPECT_NO_THROW(ops::plan_mla_decode(shape, std::vector<int32_t>{64, 0, 10}));
  try {
    ops::plan_mla_decode(shape, std::vector<int32_t>{64, 0, 65});
    ADD_FAILURE() << "a seq_len above max_seq_len was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_STREQ(e.what(), "plan_mla_decode: seq_lens[2] (65) exceeds shape.max_seq_len (64)");
  }
}

}  // namespace
}  // namespace mlakit
