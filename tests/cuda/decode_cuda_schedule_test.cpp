// The schedule of the CUDA decode (cuda/decode/schedule.hpp) and the arithmetic of its work plan
// (cuda/decode/work_plan.hpp), host-only: runs without a GPU. Hand-worked plans, then the plan's
// properties over many random and structured batches: every request's keys are covered once, in
// order; parts never decrease and stay below P; no part carries more than share + one segment's
// fixed cost (balanced) or share + one piece (batch-invariant); the counts stay within the bounds
// the workspace is sized for; batch-invariant pieces depend on the request's own length only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.hpp"
#include "cuda/decode/schedule.hpp"
#include "cuda/decode/work_plan.hpp"
#include "cuda/work_plan_reference.hpp"
#include "mlakit/error.hpp"

namespace mlakit {
namespace {

using decode_test::host_work_plan;
using decode_test::HostWorkPlan;

constexpr int64_t kH200Sms = 132;
constexpr int64_t kF = cuda::kSegmentCostTiles;

bool operator==(const cuda::SegmentRecord& a, const cuda::SegmentRecord& b) {
  return a.request == b.request && a.key_begin == b.key_begin && a.key_end == b.key_end &&
         a.slot == b.slot;
}

TEST(DecodeCudaSchedule, PartsFillTheGpuOnce) {
  auto parts = [](int64_t rows) { return cuda::decode_num_parts(rows, kH200Sms, 128, 4096); };
  EXPECT_EQ(parts(16), 132);      // h_q 16: one 16-row tile
  EXPECT_EQ(parts(8), 132);       // fewer rows: still one tile
  EXPECT_EQ(parts(128), 66);      // h_q 128: two 64-row tiles
  EXPECT_EQ(parts(2 * 128), 33);  // s_q 2: four tiles
  EXPECT_EQ(parts(8 * 128), 8);   // s_q 8: sixteen tiles
  EXPECT_EQ(parts(64 * 200), 1);  // more tiles than SMs
  EXPECT_EQ(cuda::decode_num_parts(16, 1000, 128, 1 << 20), cuda::kMaxDecodeParts);
  MLAKIT_EXPECT_THROW_MSG(cuda::decode_num_parts(16, 0, 1, 64),
                          "rows_per_request and num_sms must be >= 1, got 16 and 0");
  MLAKIT_EXPECT_THROW_MSG(cuda::decode_num_parts(16, 132, -1, 64),
                          "batch and max_seq_len must be >= 0, got -1 and 64");
}

// Small batches: no more parts than give each at least kF units of the largest cost line
// (B * (tiles + kF)), so that a part's key tiles outweigh the partial rows its segment adds.
TEST(DecodeCudaSchedule, SmallBatchesTakeFewerParts) {
  for (int64_t rows : {16, 128, 256}) {
    for (int64_t batch : {0, 1, 2, 3, 7}) {
      for (int64_t len : {0, 1, 64, 65, 4096, 8192, 32768}) {
        const int64_t filling = cuda::decode_num_parts(rows, kH200Sms, 1 << 20, 1 << 20);
        const int64_t total = batch * (cuda::key_tiles(len) + kF);
        const int64_t p = cuda::decode_num_parts(rows, kH200Sms, batch, len);
        EXPECT_EQ(p, std::clamp<int64_t>(total / kF, 1, filling))
            << "rows " << rows << " batch " << batch << " len " << len;
      }
    }
  }
  EXPECT_EQ(cuda::decode_num_parts(128, kH200Sms, 1, 4096), 33);   // 64 tiles: 2 per part
  EXPECT_EQ(cuda::decode_num_parts(128, kH200Sms, 4, 32768), 66);  // 2048 tiles: fills the GPU
  EXPECT_EQ(cuda::decode_num_parts(16, kH200Sms, 1, 64), 1);       // one tile: one part
  EXPECT_EQ(cuda::decode_num_parts(16, kH200Sms, 0, 4096), 1);     // no request
  EXPECT_EQ(cuda::decode_num_parts(16, kH200Sms, 1 << 30, 1 << 30), 132);  // no overflow
}

TEST(DecodeCudaSchedule, DeviceScheduleRecordsTheShape) {
  const DecodeSchedule s = cuda::device_decode_schedule(5, 2, 16, 1000, 7, false);
  EXPECT_EQ(s.kind, DecodeScheduleKind::kDevicePlanned);
  EXPECT_TRUE(s.split_offsets.empty() && s.split_len.empty());
  EXPECT_EQ(s.device.batch, 5);
  EXPECT_EQ(s.device.s_q, 2);
  EXPECT_EQ(s.device.num_heads, 16);
  EXPECT_EQ(s.device.max_seq_len, 1000);
  EXPECT_EQ(s.device.num_parts, 7);
  EXPECT_FALSE(s.device.batch_invariant);
  EXPECT_EQ(s.total_splits, 6 + 5);  // (P - 1) + min(B, P - 1) partials
  EXPECT_EQ(s.max_splits, 7);        // a request is cut at most P - 1 times (16 tiles > 7)
  const DecodeSchedule inv = cuda::device_decode_schedule(5, 1, 16, 5000, 7, true);
  EXPECT_EQ(inv.max_splits, 5);  // 79 tiles: ceil(79 / 16) = 5 pieces
  EXPECT_EQ(inv.total_splits, 25);
  const DecodeSchedule short_inv = cuda::device_decode_schedule(5, 1, 16, 1024, 7, true);
  EXPECT_EQ(short_inv.total_splits, 0) << "requests of <= 16 tiles are never split";
}

TEST(DecodeCudaSchedule, BoundsAndWorkspaceLayout) {
  const cuda::WorkPlanBounds b = cuda::work_plan_bounds(128, 66, false, 8192);
  EXPECT_EQ(b.max_segments, 128 + 65);
  EXPECT_EQ(b.max_split_requests, 65);
  EXPECT_EQ(b.max_partials, 130);
  const cuda::WorkPlanBounds one = cuda::work_plan_bounds(1, 66, false, 4096);
  EXPECT_EQ(one.max_segments, 66);
  EXPECT_EQ(one.max_split_requests, 1);
  EXPECT_EQ(one.max_partials, 66);
  const cuda::WorkPlanBounds inv = cuda::work_plan_bounds(128, 66, true, 8192);
  EXPECT_EQ(inv.max_segments, 128 * 8);  // 128 tiles: 8 pieces of 16
  EXPECT_EQ(inv.max_partials, 128 * 8);
  EXPECT_EQ(cuda::work_plan_bounds(3, 66, true, (1 << 24)).max_segments, 3 * 256)
      << "at most 256 pieces per request";

  // Words: 4 header, 68 part starts (67 rounded up), 4 x 193 records, 196 parts (193 rounded up),
  // 4 x 65 split records, 130 x 16 LSEs, 130 x 16 x 512 rows.
  const cuda::WorkspaceLayout l = cuda::workspace_layout(66, b, 16, 512);
  EXPECT_EQ(l.part_begin, 4);
  EXPECT_EQ(l.segments, 4 + 68);
  EXPECT_EQ(l.segment_part, 72 + 772);
  EXPECT_EQ(l.splits, 844 + 196);
  EXPECT_EQ(l.partial_lse, 1040 + 260);
  EXPECT_EQ(l.partial_out, 1300 + 2080);
  EXPECT_EQ(l.total, 3380 + 130 * 16 * 512);
  for (int64_t offset :
       {l.part_begin, l.segments, l.segment_part, l.splits, l.partial_lse, l.partial_out}) {
    EXPECT_EQ(offset % 4, 0) << "regions start on 16-byte boundaries";
  }
}

// lens {100, 0, 700, 64}: tiles 2, 0, 11, 1; costs 4, 2, 13, 3 = 22; P = 3: share 8. Request 2's
// tiles sit at units 8..18: 8 in part 1, 3 in part 2.
TEST(DecodeCudaSchedule, HandWorkedBalancedPlan) {
  const std::vector<int32_t> lens = {100, 0, 700, 64};
  const HostWorkPlan p = host_work_plan(lens, 1000, 3, false);
  EXPECT_EQ(p.share, 8);
  EXPECT_FALSE(p.whole);  // 2 requests of up to 13 units per part against a share of 8
  const std::vector<cuda::SegmentRecord> want = {
      {0, 0, 100, -1}, {1, 0, 0, -1}, {2, 0, 512, 0}, {2, 512, 700, 1}, {3, 0, 64, -1}};
  ASSERT_EQ(p.segments.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(p.segments[i] == want[i]) << i;
  EXPECT_EQ(p.segment_part, (std::vector<int32_t>{0, 0, 1, 2, 2}));
  EXPECT_EQ(p.part_begin, (std::vector<int32_t>{0, 2, 3, 5}));
  ASSERT_EQ(p.splits.size(), 1u);
  EXPECT_EQ(p.splits[0].request, 2);
  EXPECT_EQ(p.splits[0].first_slot, 0);
  EXPECT_EQ(p.splits[0].num_segments, 2);
}

// Eight requests of 4096 keys (64 tiles, cost 66) over P = 4: share 132, and two whole requests
// per part cost 132 <= 132 + kCombineCostTiles + 16 rows / 16: no request is cut. Over P = 6 the
// share drops to 88 while a part would still hold two requests: the balanced cuts win.
TEST(DecodeCudaSchedule, HandWorkedWholeRequestPlan) {
  const std::vector<int32_t> lens(8, 4096);
  const HostWorkPlan p = host_work_plan(lens, 8192, 4, false);
  EXPECT_TRUE(p.whole);
  ASSERT_EQ(p.segments.size(), 8u);
  for (size_t b = 0; b < 8; ++b)
    EXPECT_TRUE(p.segments[b] == (cuda::SegmentRecord{int32_t(b), 0, 4096, -1}));
  EXPECT_EQ(p.segment_part, (std::vector<int32_t>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(p.part_begin, (std::vector<int32_t>{0, 2, 4, 6, 8}));
  EXPECT_EQ(p.partials, 0);
  EXPECT_FALSE(host_work_plan(lens, 8192, 6, false).whole);
  // The merge of 128-row requests costs more: with P = 6 and 128 rows, 132 <= 88 + 2 + 8 fails too.
  EXPECT_FALSE(host_work_plan(lens, 8192, 6, false, 128).whole);
  EXPECT_FALSE(host_work_plan(lens, 8192, 4, true).whole);  // batch-invariant pieces never merge
}

// lens {1100, 0, 2100}: tiles 18 (2 pieces of 9), 0 (one empty piece), 33 (3 pieces of 11); costs
// 22, 2, 39 = 63; P = 2: share 32. Piece middles: 5, 16 | 22 | 30, 43, 56.
TEST(DecodeCudaSchedule, HandWorkedBatchInvariantPlan) {
  const std::vector<int32_t> lens = {1100, 0, 2100};
  const HostWorkPlan p = host_work_plan(lens, 4096, 2, true);
  EXPECT_EQ(p.share, 32);
  const std::vector<cuda::SegmentRecord> want = {{0, 0, 576, 0},    {0, 576, 1100, 1},
                                                 {1, 0, 0, -1},     {2, 0, 704, 2},
                                                 {2, 704, 1408, 3}, {2, 1408, 2100, 4}};
  ASSERT_EQ(p.segments.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(p.segments[i] == want[i]) << i;
  EXPECT_EQ(p.segment_part, (std::vector<int32_t>{0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(p.part_begin, (std::vector<int32_t>{0, 4, 6}));
  EXPECT_EQ(p.partials, 5);
}

// Every property of a plan of `lens` over `parts` parts; `context` names the case.
void check_plan(const std::vector<int32_t>& lens, int64_t max_seq_len, int64_t parts,
                bool invariant, const std::string& context) {
  SCOPED_TRACE(context);
  const HostWorkPlan p = host_work_plan(lens, max_seq_len, parts, invariant);
  const cuda::WorkPlanBounds bounds =
      cuda::work_plan_bounds(static_cast<int64_t>(lens.size()), parts, invariant, max_seq_len);
  ASSERT_LE(static_cast<int64_t>(p.segments.size()), bounds.max_segments);
  ASSERT_LE(static_cast<int64_t>(p.splits.size()), bounds.max_split_requests);
  ASSERT_LE(p.partials, bounds.max_partials);

  // Coverage: each request's segments are consecutive, cover [0, len) in order, none empty unless
  // the request is (then exactly one); slots consecutive from its split record.
  size_t i = 0, split = 0;
  int64_t slots = 0;
  for (size_t b = 0; b < lens.size(); ++b) {
    const bool valid = lens[b] >= 0 && lens[b] <= max_seq_len;
    const int32_t len = valid ? lens[b] : 0;
    int32_t covered = 0;
    const size_t first = i;
    while (i < p.segments.size() && p.segments[i].request == static_cast<int32_t>(b)) {
      const cuda::SegmentRecord& s = p.segments[i];
      ASSERT_EQ(s.key_begin, covered) << "request " << b << " segment " << i - first;
      ASSERT_EQ(s.key_begin % cuda::kDecodeKeyTile, 0);
      ASSERT_TRUE(s.key_end > s.key_begin || len == 0);
      covered = s.key_end;
      ++i;
    }
    const size_t n = i - first;
    ASSERT_GE(n, 1u) << "request " << b << " has no segment";
    ASSERT_LE(static_cast<int64_t>(n), cuda::kMaxRequestSegments);
    ASSERT_EQ(covered, len) << "request " << b;
    if (n == 1) {
      ASSERT_EQ(p.segments[first].slot, -1);
    } else {
      ASSERT_LT(split, p.splits.size());
      ASSERT_EQ(p.splits[split].request, static_cast<int32_t>(b));
      ASSERT_EQ(p.splits[split].first_slot, slots);
      ASSERT_EQ(p.splits[split].num_segments, static_cast<int32_t>(n));
      for (size_t k = 0; k < n; ++k) ASSERT_EQ(p.segments[first + k].slot, slots + k);
      slots += static_cast<int64_t>(n);
      ++split;
    }
  }
  ASSERT_EQ(i, p.segments.size());
  ASSERT_EQ(split, p.splits.size());

  // Parts: non-decreasing, below P; part_begin delimits them.
  ASSERT_EQ(static_cast<int64_t>(p.part_begin.size()), parts + 1);
  for (size_t k = 0; k < p.segment_part.size(); ++k) {
    ASSERT_GE(p.segment_part[k], 0);
    ASSERT_LT(p.segment_part[k], parts);
    if (k > 0) {
      ASSERT_GE(p.segment_part[k], p.segment_part[k - 1]);
    }
  }
  for (int64_t part = 0; part < parts; ++part) {
    for (int32_t s = p.part_begin[part]; s < p.part_begin[part + 1]; ++s) {
      ASSERT_EQ(p.segment_part[s], part);
    }
  }
  ASSERT_EQ(p.part_begin[parts], static_cast<int32_t>(p.segments.size()));

  // Balance: a part's work (tiles + F per segment) exceeds the share by at most one segment's
  // fixed cost (balanced: the one continued from the part before, or a fixed cost straddling the
  // boundary) or by one piece (batch-invariant: pieces are whole, owned by their middle unit).
  int64_t total = 0;
  for (int32_t len : lens) {
    const bool valid = len >= 0 && len <= max_seq_len;
    total += cuda::request_cost(invariant, cuda::key_tiles(valid ? len : 0));
  }
  ASSERT_EQ(p.share, std::max<int64_t>(1, (total + parts - 1) / parts));
  const int64_t batch = static_cast<int64_t>(lens.size());
  if (p.whole) {  // whole requests: ceil(B / P) of them at most per part, and no partial
    ASSERT_FALSE(invariant);
    ASSERT_EQ(p.partials, 0);
    for (int64_t part = 0; part < parts; ++part)
      ASSERT_LE(p.part_begin[part + 1] - p.part_begin[part], (batch + parts - 1) / parts);
    return;
  }
  const int64_t slack = invariant ? kF + cuda::kInvariantPieceTiles : kF;
  for (int64_t part = 0; part < parts; ++part) {
    int64_t work = 0;
    for (int32_t s = p.part_begin[part]; s < p.part_begin[part + 1]; ++s) {
      work += kF + cuda::key_tiles(p.segments[s].key_end) - p.segments[s].key_begin / 64;
    }
    ASSERT_LE(work, p.share + slack) << "part " << part;
  }
}

// Lengths around tile edges, empty ones, bad ones (negative, beyond max_seq_len).
std::vector<int32_t> structured_lens(std::mt19937_64& rng, int64_t batch, int32_t max_len) {
  const std::vector<int32_t> picks = {0, 1, 63, 64, 65, 127, 128, 129, 1023, 1024, 1025, max_len};
  std::uniform_int_distribution<size_t> pick(0, picks.size() - 1);
  std::vector<int32_t> lens;
  for (int64_t b = 0; b < batch; ++b) lens.push_back(std::min(picks[pick(rng)], max_len));
  return lens;
}

TEST(DecodeCudaSchedule, PlanPropertiesOverManyBatches) {
  auto rng = test::make_rng(100);
  const int64_t parts_grid[] = {1, 2, 3, 7, 33, 66, 132, 256};
  int cases = 0;
  for (bool invariant : {false, true}) {
    for (int64_t parts : parts_grid) {
      for (int64_t batch : {1, 2, 5, 17, 128, 300}) {
        for (int32_t max_len : {1, 64, 1000, 8192, 40000}) {
          std::uniform_int_distribution<int32_t> uniform(0, max_len);
          std::vector<int32_t> random_lens;
          for (int64_t b = 0; b < batch; ++b) random_lens.push_back(uniform(rng));
          const std::string name = std::string(invariant ? "invariant" : "balanced") + " P " +
                                   std::to_string(parts) + " B " + std::to_string(batch) + " max " +
                                   std::to_string(max_len);
          check_plan(random_lens, max_len, parts, invariant, name + " uniform");
          check_plan(structured_lens(rng, batch, max_len), max_len, parts, invariant,
                     name + " structured");
          std::vector<int32_t> long_short(batch, 1);  // one long request among short ones
          long_short[batch / 2] = max_len;
          check_plan(long_short, max_len, parts, invariant, name + " one long");
          cases += 3;
        }
      }
    }
  }
  // Bad lengths are planned as empty requests.
  check_plan({-5, 100, 5000, 0}, 4096, 3, false, "bad lengths");
  check_plan({-5, 100, 5000, 0}, 4096, 3, true, "bad lengths, invariant");
  EXPECT_EQ(cases, 2 * 8 * 6 * 5 * 3);
}

// Batch-invariant pieces of a request are the same alone and in any batch at any position; the
// balanced plan may differ (that is its point).
TEST(DecodeCudaSchedule, InvariantPiecesDependOnTheRequestOnly) {
  auto rng = test::make_rng(200);
  std::uniform_int_distribution<int32_t> len(0, 20000);
  for (int trial = 0; trial < 50; ++trial) {
    const int32_t mine = len(rng);
    const HostWorkPlan alone = host_work_plan(std::vector<int32_t>{mine}, 20000, 7, true);
    std::vector<int32_t> batch;
    const int others = std::uniform_int_distribution<int>(1, 128)(rng);
    for (int i = 0; i < others; ++i) batch.push_back(len(rng));
    const size_t at = std::uniform_int_distribution<size_t>(0, batch.size())(rng);
    batch.insert(batch.begin() + static_cast<std::ptrdiff_t>(at), mine);
    const HostWorkPlan inside = host_work_plan(batch, 20000, 66, true);
    std::vector<std::pair<int32_t, int32_t>> a, b;
    for (const cuda::SegmentRecord& s : alone.segments) a.emplace_back(s.key_begin, s.key_end);
    for (const cuda::SegmentRecord& s : inside.segments) {
      if (s.request == static_cast<int32_t>(at)) b.emplace_back(s.key_begin, s.key_end);
    }
    ASSERT_EQ(a, b) << "length " << mine << " at " << at << " of " << batch.size();
  }
}

TEST(DecodeCudaSchedule, BadArguments) {
  MLAKIT_EXPECT_THROW_MSG(cuda::device_decode_schedule(2, 1, 16, 100, 0, false),
                          "device_decode_schedule: a CUDA decode schedule needs num_parts in [1, "
                          "256], got 0");
  MLAKIT_EXPECT_THROW_MSG(cuda::device_decode_schedule(2, 1, 16, 100, 300, false), "got 300");
  MLAKIT_EXPECT_THROW_MSG(cuda::device_decode_schedule(2, 0, 16, 100, 4, false),
                          "needs batch >= 0, s_q >= 1, num_heads >= 1 and max_seq_len in");
  MLAKIT_EXPECT_THROW_MSG(cuda::device_decode_schedule(-1, 1, 16, 100, 4, false), "got batch -1");
  MLAKIT_EXPECT_THROW_MSG(cuda::device_decode_schedule(2, 1, 16, -1, 4, false), "max_seq_len -1");
  MLAKIT_EXPECT_THROW_MSG(cuda::plan_decode_splits_cuda(2, 1, 16, 100, false, Device::cpu()),
                          "plan_decode_splits_cuda: device must be a CUDA device, got cpu");
  const DecodeSchedule s = cuda::device_decode_schedule(2, 1, 16, 100, 4, false);
  MLAKIT_EXPECT_THROW_MSG(cuda::device_plan_sizes(s, 32, 512, "op"),
                          "op: the schedule was planned for s_q 1 x num_heads 16 = 16 query rows "
                          "per request, got 32");
  MLAKIT_EXPECT_THROW_MSG(
      cuda::device_plan_sizes(plan_decode_splits(std::vector<int32_t>{5}, 16, 1), 16, 512, "op"),
      "op: CUDA tensors need a device-planned schedule");
}

}  // namespace
}  // namespace mlakit
