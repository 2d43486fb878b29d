// B.5: decodes-first batch reorder. Each request belongs to a region (decode, extend, prefill);
// requests already in their target region stay put, the others move to the mismatched positions
// in stable region order, so the permutation touches as few requests as possible.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "core/check.hpp"
#include "mlakit/plan.hpp"

namespace mlakit {

namespace {
constexpr const char* kOp = "reorder_decodes_first";

enum Region : int { kDecode = 0, kExtend = 1, kPrefill = 2, kNumRegions = 3 };

Region region_of(int32_t scheduled, int32_t computed, int64_t threshold) {
  if (computed == 0) return kPrefill;  // a new request is a prefill even with 1 token (F-41)
  return scheduled <= threshold ? kDecode : kExtend;
}
}  // namespace

std::vector<int32_t> reorder_decodes_first(std::span<const int32_t> num_scheduled,
                                           std::span<const int32_t> num_computed,
                                           int64_t decode_threshold) {
  using detail::require;
  require(num_scheduled.size() == num_computed.size(), ErrorCode::kInvalidArgument, kOp,
          ": num_scheduled and num_computed must have the same length, got ", num_scheduled.size(),
          " and ", num_computed.size());
  require(num_scheduled.size() <= size_t{std::numeric_limits<int32_t>::max()},
          ErrorCode::kInvalidArgument, kOp, ": at most 2147483647 requests, got ",
          num_scheduled.size());
  require(decode_threshold >= 1, ErrorCode::kInvalidArgument, kOp,
          ": decode_threshold must be >= 1, got ", decode_threshold);
  const int32_t num_reqs = static_cast<int32_t>(num_scheduled.size());

  std::vector<Region> region(num_reqs);
  int64_t region_count[kNumRegions] = {};
  for (int32_t i = 0; i < num_reqs; ++i) {
    require(num_scheduled[i] >= 0, ErrorCode::kInvalidArgument, kOp, ": num_scheduled[", i,
            "] must be >= 0, got ", num_scheduled[i]);
    require(num_computed[i] >= 0, ErrorCode::kInvalidArgument, kOp, ": num_computed[", i,
            "] must be >= 0, got ", num_computed[i]);
    region[i] = region_of(num_scheduled[i], num_computed[i], decode_threshold);
    ++region_count[region[i]];
  }
  auto target_region = [&](int32_t position) {
    if (position < region_count[kDecode]) return kDecode;
    return position < region_count[kDecode] + region_count[kExtend] ? kExtend : kPrefill;
  };

  std::vector<int32_t> misplaced;  // positions whose request is in the wrong region
  for (int32_t i = 0; i < num_reqs; ++i)
    if (region[i] != target_region(i)) misplaced.push_back(i);
  // The misplaced requests, stably sorted by region, fill the misplaced positions in order.
  std::vector<int32_t> sources = misplaced;
  std::stable_sort(sources.begin(), sources.end(),
                   [&](int32_t a, int32_t b) { return region[a] < region[b]; });

  std::vector<int32_t> order(num_reqs);
  std::iota(order.begin(), order.end(), 0);
  for (size_t k = 0; k < misplaced.size(); ++k) order[misplaced[k]] = sources[k];
  return order;
}

}  // namespace mlakit
