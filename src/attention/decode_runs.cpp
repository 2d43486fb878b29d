#include "attention/decode_runs.hpp"

#include "core/check.hpp"

namespace mlakit::detail {

DecodeRuns decode_runs(const Plan& plan, std::span<const int32_t> query_start_loc,
                       std::span<const int32_t> seq_lens, const DecodeScheduler& scheduler) {
  DecodeRuns result;
  const int64_t nd = plan.split.num_decodes, td = plan.split.num_decode_tokens;
  if (nd == 0) return result;
  auto q_len = [&](int64_t b) { return int64_t{query_start_loc[b + 1] - query_start_loc[b]}; };

  // Uniform: one q_len s for every decode, padding requests (q_len 0, seq_len 0) included, and
  // request b's tokens at rows [b s, b s + s) (the decode reads q as [num_decodes, s]): a padding
  // request before a real one would shift it, so only trailing ones keep the block.
  const int64_t s = q_len(0);
  bool uniform = s > 0 && nd * s == td;
  for (int64_t b = 0; b < nd && uniform; ++b) {
    uniform = (q_len(b) == s && query_start_loc[b] == b * s) || (q_len(b) == 0 && seq_lens[b] == 0);
  }
  if (uniform) {
    DecodeRun run{0, nd, 0, s, scheduler(seq_lens.subspan(0, nd), s)};
    result.runs.push_back(std::move(run));
    result.first_padding_token = td;
    return result;
  }

  for (int64_t b = 0; b < nd;) {
    const int64_t len = q_len(b);
    int64_t e = b + 1;
    while (e < nd && q_len(e) == len) ++e;
    if (len > 0) {
      DecodeRun run{b, e - b, query_start_loc[b], len, {}};
      run.schedule = scheduler(seq_lens.subspan(b, e - b), len);
      result.runs.push_back(std::move(run));
    }
    b = e;
  }
  result.first_padding_token = query_start_loc[nd];
  require(result.first_padding_token <= td, ErrorCode::kInternal,
          "decode_runs: decode requests hold ", result.first_padding_token,
          " tokens but the split counted ", td);
  return result;
}

}  // namespace mlakit::detail
