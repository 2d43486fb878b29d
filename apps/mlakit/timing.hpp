// Wall-clock timing of `mlakit bench`: one warm-up run, then the median of `reps` timed runs.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace mlakit::cli {

template <class Fn>
double median_seconds(int reps, const Fn& fn) {
  fn();  // warm-up: page faults, thread start, scratch growth, lazy initialization
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace mlakit::cli
