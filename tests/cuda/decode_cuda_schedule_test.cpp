// The uniform split-KV schedule of the CUDA decode (cuda/decode/schedule.hpp): host-only, runs
// without a GPU. The split counts for the PERF.md decode grid are worked out by hand from the
// documented cost model, in tiles (72 KiB per SM-share of bandwidth): waves x (tiles per split + 1
// + partial write) + (S > 1) 1 + partial read; a partial row is 2052 bytes.
#include <gtest/gtest.h>

#include <vector>

#include "common/test_util.hpp"
#include "cuda/decode/schedule.hpp"
#include "mlakit/error.hpp"

namespace mlakit {
namespace {

constexpr int64_t kH200Sms = 132;

TEST(DecodeCudaSchedule, SplitCountsForThePerfGrid) {
  // B = 128, 4096 keys (64 tiles), 16 rows: 128 CTAs fill one wave: 65; S = 2 needs two waves.
  EXPECT_EQ(cuda::decode_num_splits(128, 16, 4096, kH200Sms), 1);
  // 128 rows = two row tiles: 256 CTAs already make two waves.
  EXPECT_EQ(cuda::decode_num_splits(128, 128, 8192, kH200Sms), 1);
  // B = 64, 16 tiles: S = 2 gives one wave of 128 CTAs, 8 + 1 + 0.45 + 1 + 0.2 = 10.6 < 17.
  EXPECT_EQ(cuda::decode_num_splits(64, 16, 1024, kH200Sms), 2);
  // B = 32, 16 tiles: S = 4 gives one wave of 128 CTAs, 4 + 1 + 0.45 + 1 + 0.2 = 6.6.
  EXPECT_EQ(cuda::decode_num_splits(32, 16, 1024, kH200Sms), 4);
  // B = 32, 64 tiles, 128 rows: S = 2 gives 128 CTAs, 32 + 1 + 1.8 + 1 + 0.9 = 36.7 < 65.
  EXPECT_EQ(cuda::decode_num_splits(32, 128, 4096, kH200Sms), 2);
  // B = 1, 64 tiles, 128 rows: one tile per split, 128 CTAs: 1 + 1 + 1.8 + 1 + 1.7 = 6.5, just
  // under S = 32 (2 + 1 + 1.8 + 1 + 0.9 = 6.6).
  EXPECT_EQ(cuda::decode_num_splits(1, 128, 4096, kH200Sms), 64);
  // Never more splits than tiles, never more than kMaxDecodeSplits.
  EXPECT_EQ(cuda::decode_num_splits(1, 16, 1000, kH200Sms), 16);  // 16 tiles: one per split
  EXPECT_EQ(cuda::decode_num_splits(1, 16, 100, kH200Sms), 1);    // 2 tiles: 3 vs 3.45 for S = 2
  EXPECT_LE(cuda::decode_num_splits(1, 1, 1 << 24, 100000), cuda::kMaxDecodeSplits);
  EXPECT_EQ(cuda::decode_num_splits(0, 16, 4096, kH200Sms), 1);
  EXPECT_EQ(cuda::decode_num_splits(4, 16, 0, kH200Sms), 1);
}

TEST(DecodeCudaSchedule, UniformScheduleShape) {
  const DecodeSchedule s = cuda::uniform_decode_schedule(3, 4, 1000);
  EXPECT_EQ(s.max_splits, 4);
  EXPECT_EQ(s.total_splits, 12);
  EXPECT_EQ(s.split_offsets, (std::vector<int32_t>{0, 4, 8, 12}));
  EXPECT_EQ(s.split_len, (std::vector<int32_t>{256, 256, 256}));  // ceil(1000 / 4) up to 64
  for (int64_t b = 0; b < 3; ++b) EXPECT_EQ(s.num_splits(b), 4);
  const DecodeSchedule empty = cuda::uniform_decode_schedule(0, 1, 0);
  EXPECT_EQ(empty.split_offsets, (std::vector<int32_t>{0}));
  EXPECT_EQ(empty.total_splits, 0);
}

TEST(DecodeCudaSchedule, BadArguments) {
  MLAKIT_EXPECT_THROW_MSG(cuda::uniform_decode_schedule(2, 0, 100),
                          "uniform_decode_schedule: num_splits must be in [1, 256], got 0");
  MLAKIT_EXPECT_THROW_MSG(cuda::uniform_decode_schedule(2, 300, 100), "got 300");
  MLAKIT_EXPECT_THROW_MSG(cuda::uniform_decode_schedule(2, 2, -1), "max_seq_len must be in");
  MLAKIT_EXPECT_THROW_MSG(cuda::decode_num_splits(2, 16, 100, 0), "num_sms must be > 0, got 0");
  MLAKIT_EXPECT_THROW_MSG(cuda::decode_num_splits(-1, 16, 100, 132), "sizes must be >= 0");
  MLAKIT_EXPECT_THROW_MSG(cuda::plan_decode_splits_cuda(2, 1, 16, 100, Device::cpu()),
                          "plan_decode_splits_cuda: device must be a CUDA device, got cpu");
}

}  // namespace
}  // namespace mlakit
