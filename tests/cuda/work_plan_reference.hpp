// The CUDA decode's work plan (cuda/decode/work_plan.hpp) assembled on the host with plain loops
// over the per-request functions the plan kernel uses. The schedule test checks its properties
// (coverage, balance, bounds, batch invariance) and hand-worked cases; the emulation test compares
// the plan kernel's scans, chunking and part search against it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "cuda/decode/work_plan.hpp"

namespace mlakit::decode_test {

struct HostWorkPlan {
  int64_t share = 0;                          // units per part
  std::vector<cuda::SegmentRecord> segments;  // in plan order
  std::vector<int32_t> segment_part;          // [segments]
  std::vector<cuda::SplitRecord> splits;      // requests with more than one segment
  std::vector<int32_t> part_begin;            // [parts + 1]
  int64_t partials = 0;                       // partial slots used
  bool whole = false;                         // every request kept whole (whole_requests)
};

// seq_lens outside [0, max_seq_len] are planned as empty, as on the device. rows: query rows per
// request (s_q * N), which the choice of whole requests weighs.
inline HostWorkPlan host_work_plan(std::span<const int32_t> seq_lens, int64_t max_seq_len,
                                   int64_t parts, bool batch_invariant, int64_t rows = 16) {
  std::vector<int64_t> lens;
  for (int32_t raw : seq_lens) lens.push_back(cuda::seq_len_is_valid(raw, max_seq_len) ? raw : 0);
  int64_t total = 0, max_cost = 0;
  for (int64_t len : lens) {
    const int64_t cost = cuda::request_cost(batch_invariant, cuda::key_tiles(len));
    total += cost;
    max_cost = std::max(max_cost, cost);
  }
  const int64_t batch = static_cast<int64_t>(lens.size());
  HostWorkPlan plan;
  plan.share = cuda::part_share(total, parts);
  plan.whole = cuda::whole_requests(batch_invariant, batch, parts, total, max_cost, rows);
  int64_t start = 0;
  for (size_t b = 0; b < lens.size(); ++b) {
    const int64_t tiles = cuda::key_tiles(lens[b]);
    if (plan.whole) {
      plan.segments.push_back({static_cast<int32_t>(b), 0, static_cast<int32_t>(lens[b]), -1});
      plan.segment_part.push_back(
          static_cast<int32_t>(cuda::whole_request_part(static_cast<int64_t>(b), batch, parts)));
      continue;
    }
    const int64_t n = cuda::request_segment_count(batch_invariant, start, tiles, plan.share);
    if (n > 1) {
      plan.splits.push_back({static_cast<int32_t>(b), static_cast<int32_t>(plan.partials),
                             static_cast<int32_t>(n), 0});
    }
    for (int64_t k = 0; k < n; ++k) {
      const cuda::SegmentRange r =
          cuda::request_segment(batch_invariant, start, tiles, plan.share, k);
      plan.segments.push_back(
          {static_cast<int32_t>(b),
           static_cast<int32_t>(std::min(r.tile_begin * cuda::kDecodeKeyTile, lens[b])),
           static_cast<int32_t>(std::min(r.tile_end * cuda::kDecodeKeyTile, lens[b])),
           static_cast<int32_t>(n > 1 ? plan.partials + k : -1)});
      plan.segment_part.push_back(static_cast<int32_t>(r.part));
    }
    if (n > 1) plan.partials += n;
    start += cuda::request_cost(batch_invariant, tiles);
  }
  for (int64_t p = 0; p <= parts; ++p) {
    plan.part_begin.push_back(static_cast<int32_t>(
        std::lower_bound(plan.segment_part.begin(), plan.segment_part.end(), p) -
        plan.segment_part.begin()));
  }
  return plan;
}

}  // namespace mlakit::decode_test
