#include "workload.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "mlakit/error.hpp"

namespace mlakit::sim {

namespace {

[[noreturn]] void bad_range(std::string_view text, std::string_view flag, const char* why) {
  throw Error(ErrorCode::kInvalidArgument,
              std::string(flag) + ": expected a token count \"n\" " +
                  "or a range \"min:max\" with 1 <= min <= max, got \"" + std::string(text) +
                  "\" (" + why + ")");
}

int64_t parse_count(std::string_view part, std::string_view text, std::string_view flag) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
  if (ec != std::errc() || end != part.data() + part.size() || part.empty()) {
    bad_range(text, flag, "not an integer");
  }
  return value;
}

// Uniform integer in [lo, hi] from the engine's raw output (libstdc++-independent of
// distributions, so a seed gives the same workload everywhere).
int64_t uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(rng() % span);
}

}  // namespace

LenRange parse_len_range(std::string_view text, std::string_view flag) {
  const size_t colon = text.find(':');
  LenRange r;
  if (colon == std::string_view::npos) {
    r.min = r.max = parse_count(text, text, flag);
  } else {
    r.min = parse_count(text.substr(0, colon), text, flag);
    r.max = parse_count(text.substr(colon + 1), text, flag);
  }
  if (r.min < 1) bad_range(text, flag, "min must be >= 1");
  if (r.max < r.min) bad_range(text, flag, "max must be >= min");
  return r;
}

std::vector<Request> make_workload(const WorkloadConfig& config) {
  if (config.num_requests < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "--num-requests must be >= 1, got " + std::to_string(config.num_requests));
  }
  if (!(config.shared_prefix_fraction >= 0.0 && config.shared_prefix_fraction <= 1.0)) {
    throw Error(ErrorCode::kInvalidArgument, "--shared-prefix-fraction must be in [0, 1], got " +
                                                 std::to_string(config.shared_prefix_fraction));
  }
  if (config.shared_prefix_len < 0) {
    throw Error(ErrorCode::kInvalidArgument, "--shared-prefix-len must be >= 0, got " +
                                                 std::to_string(config.shared_prefix_len));
  }
  std::mt19937_64 rng(config.seed);
  std::vector<Request> requests(config.num_requests);
  for (int64_t i = 0; i < config.num_requests; ++i) {
    Request& r = requests[i];
    r.id = static_cast<int32_t>(i);
    r.prompt_len = uniform(rng, config.prompt_len.min, config.prompt_len.max);
    r.output_len = uniform(rng, config.output_len.min, config.output_len.max);
  }
  if (config.shared_prefix_len == 0) return requests;

  // Pick exactly round(fraction * n) sharers with a seeded Fisher-Yates shuffle.
  const auto num_sharing = static_cast<int64_t>(
      std::llround(config.shared_prefix_fraction * static_cast<double>(config.num_requests)));
  std::vector<int64_t> order(config.num_requests);
  std::iota(order.begin(), order.end(), 0);
  for (int64_t i = config.num_requests - 1; i > 0; --i) {
    std::swap(order[i], order[uniform(rng, 0, i)]);
  }
  for (int64_t k = 0; k < num_sharing; ++k) {
    Request& r = requests[order[k]];
    r.prefix_id = 0;
    r.shared_prefix_len = std::min(config.shared_prefix_len, r.prompt_len - 1);
    if (r.shared_prefix_len == 0) r.prefix_id = -1;  // a 1-token prompt shares nothing
  }
  return requests;
}

}  // namespace mlakit::sim
