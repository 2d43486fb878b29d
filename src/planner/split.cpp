// B.4: decode / prefill split of a batch already reordered decodes-first. Classification is
// positional: everything from the first request that cannot be a decode on is a prefill.
#include <algorithm>
#include <cstdint>
#include <span>

#include "core/check.hpp"
#include "mlakit/plan.hpp"

namespace mlakit {

namespace {
constexpr const char* kOp = "split_decodes_and_prefills";

void check_query_start_loc(std::span<const int32_t> query_start_loc, int64_t num_actual_tokens) {
  using detail::require;
  require(!query_start_loc.empty(), ErrorCode::kInvalidArgument, kOp,
          ": query_start_loc must have num_reqs + 1 >= 1 entries, got 0");
  require(query_start_loc[0] == 0, ErrorCode::kInvalidArgument, kOp,
          ": query_start_loc[0] must be 0, got ", query_start_loc[0]);
  for (size_t i = 1; i < query_start_loc.size(); ++i) {
    require(query_start_loc[i] >= query_start_loc[i - 1], ErrorCode::kInvalidArgument, kOp,
            ": query_start_loc must be non-decreasing, got query_start_loc[", i,
            "] = ", query_start_loc[i], " < query_start_loc[", i - 1,
            "] = ", query_start_loc[i - 1]);
  }
  require(query_start_loc.back() <= num_actual_tokens, ErrorCode::kInvalidArgument, kOp,
          ": query_start_loc[num_reqs] (", query_start_loc.back(),
          ") must be <= num_actual_tokens, got num_actual_tokens ", num_actual_tokens);
}

}  // namespace

SplitCounts split_decodes_and_prefills(std::span<const int32_t> query_start_loc,
                                       int64_t num_actual_tokens, int64_t decode_threshold,
                                       bool require_uniform) {
  using detail::require;
  check_query_start_loc(query_start_loc, num_actual_tokens);
  require(decode_threshold >= 1, ErrorCode::kInvalidArgument, kOp,
          ": decode_threshold must be >= 1, got ", decode_threshold);

  const int64_t num_reqs = static_cast<int64_t>(query_start_loc.size()) - 1;
  const int64_t num_tokens = num_actual_tokens;
  auto query_len = [&](int64_t i) -> int64_t {
    return int64_t{query_start_loc[i + 1]} - query_start_loc[i];
  };
  const SplitCounts all_decode{num_reqs, 0, num_tokens, 0};
  const SplitCounts all_prefill{0, num_reqs, 0, num_tokens};

  if (num_reqs == 0) return all_decode;
  int64_t max_query_len = 0;
  for (int64_t i = 0; i < num_reqs; ++i) max_query_len = std::max(max_query_len, query_len(i));
  if (max_query_len <= decode_threshold && (!require_uniform || decode_threshold <= 1)) {
    return all_decode;
  }
  const int64_t first_len = query_len(0);
  if (first_len > decode_threshold) return all_prefill;

  // First request that cannot be a decode: with uniform decodes, any other query length;
  // otherwise, a query longer than the threshold.
  auto first_where = [&](auto is_prefill) {
    for (int64_t i = 0; i < num_reqs; ++i)
      if (is_prefill(query_len(i))) return i;
    return num_reqs;
  };
  if (require_uniform) {
    // Every request has first_len tokens or is CUDA-graph padding (0 tokens).
    const bool padded_uniform =
        first_where([&](int64_t q) { return q != first_len && q != 0; }) == num_reqs;
    if (padded_uniform) {
      // A padded uniform batch: the padding requests own the padded tokens.
      require(num_reqs * first_len == num_tokens, ErrorCode::kInvalidArgument, kOp,
              ": a uniform decode batch of ", num_reqs, " requests with query length ", first_len,
              " must have ", num_reqs * first_len,
              " tokens (padding included), got num_actual_tokens ", num_tokens);
      return all_decode;
    }
  }
  const int64_t first_prefill = require_uniform
                                    ? first_where([&](int64_t q) { return q != first_len; })
                                    : first_where([&](int64_t q) { return q > decode_threshold; });
  if (first_prefill == num_reqs) return all_decode;
  const int64_t decode_tokens = query_start_loc[first_prefill];
  return {first_prefill, num_reqs - first_prefill, decode_tokens, num_tokens - decode_tokens};
}

}  // namespace mlakit
