// Progress of `mlakit run` on stderr: one line rewritten with '\r' on a terminal (at most every
// 100 ms), otherwise one line per 10 % of the workload's tokens.
#pragma once

#include <chrono>
#include <cstdint>

namespace mlakit::cli {

class Progress {
 public:
  Progress(bool enabled, int64_t total_tokens, int64_t total_requests);
  // tokens_done: prompt + decode tokens computed plus prefix-cache hits so far.
  void update(int64_t step, int64_t tokens_done, int64_t requests_done);
  void finish();  // ends the terminal line

 private:
  void print(int64_t step, int64_t tokens_done, int64_t requests_done, bool newline);

  bool enabled_;
  bool tty_;
  int64_t total_tokens_;
  int64_t total_requests_;
  int64_t next_decile_ = 1;  // non-terminal: the next 10 % mark to report
  std::chrono::steady_clock::time_point last_print_{};
  bool printed_ = false;
};

}  // namespace mlakit::cli
