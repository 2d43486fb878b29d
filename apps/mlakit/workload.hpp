// The requests of a serving simulation: prompt lengths, output lengths and a shared prefix.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace mlakit::sim {

// An inclusive range of token counts, written "min:max" or "n" on the command line.
struct LenRange {
  int64_t min = 1;
  int64_t max = 1;
};
// Parses "128:1024" or "256"; throws mlakit::Error naming `flag` unless 1 <= min <= max.
LenRange parse_len_range(std::string_view text, std::string_view flag);

struct Request {
  int32_t id = 0;
  int64_t prompt_len = 1;  // prompt tokens (prefill)
  int64_t output_len = 1;  // generated tokens; the last one never enters the cache
  int32_t prefix_id = -1;  // the shared prefix this prompt starts with, -1 for none
  // Leading prompt tokens equal to the shared prefix; always < prompt_len, so at least one prompt
  // token is computed even when the whole prefix hits the cache.
  int64_t shared_prefix_len = 0;

  // Tokens that pass through forward and occupy cache slots: the prompt, then every generated
  // token but the last (it is sampled and never fed back).
  int64_t total_len() const { return prompt_len + output_len - 1; }
};

struct WorkloadConfig {
  int64_t num_requests = 16;
  LenRange prompt_len{64, 512};
  LenRange output_len{16, 64};
  int64_t shared_prefix_len = 256;      // tokens of the common prefix (0: no sharing)
  double shared_prefix_fraction = 0.5;  // share of requests whose prompt starts with it
  uint64_t seed = 0;
};

// Lengths are uniform in their ranges; round(fraction * num_requests) requests, chosen at random,
// start with the common prefix (prefix_id 0), truncated to prompt_len - 1 for short prompts.
// Deterministic for a given config.
std::vector<Request> make_workload(const WorkloadConfig& config);

}  // namespace mlakit::sim
