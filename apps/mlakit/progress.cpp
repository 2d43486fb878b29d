#include "progress.hpp"

#include <unistd.h>

#include <cstdio>

namespace mlakit::cli {

namespace {
constexpr auto kRefreshInterval = std::chrono::milliseconds(100);  // ~10 redraws/s: no flicker
constexpr int64_t kDeciles = 10;                                   // non-terminal: every 10 %
}  // namespace

Progress::Progress(bool enabled, int64_t total_tokens, int64_t total_requests)
    : enabled_(enabled),
      tty_(isatty(fileno(stderr)) != 0),
      total_tokens_(total_tokens > 0 ? total_tokens : 1),
      total_requests_(total_requests) {}

void Progress::print(int64_t step, int64_t tokens_done, int64_t requests_done, bool newline) {
  const double percent = 100.0 * static_cast<double>(tokens_done) / total_tokens_;
  std::fprintf(stderr, "%s[mlakit run] %5.1f%%  step %lld  requests %lld/%lld  tokens %lld/%lld%s",
               tty_ ? "\r" : "", percent, static_cast<long long>(step),
               static_cast<long long>(requests_done), static_cast<long long>(total_requests_),
               static_cast<long long>(tokens_done), static_cast<long long>(total_tokens_),
               newline ? "\n" : "");
  std::fflush(stderr);
  printed_ = true;
}

void Progress::update(int64_t step, int64_t tokens_done, int64_t requests_done) {
  if (!enabled_) return;
  if (tty_) {
    const auto now = std::chrono::steady_clock::now();
    if (printed_ && now - last_print_ < kRefreshInterval && requests_done < total_requests_) {
      return;
    }
    last_print_ = now;
    print(step, tokens_done, requests_done, /*newline=*/false);
    return;
  }
  if (tokens_done * kDeciles < next_decile_ * total_tokens_) return;
  while (next_decile_ <= kDeciles && tokens_done * kDeciles >= next_decile_ * total_tokens_) {
    ++next_decile_;
  }
  print(step, tokens_done, requests_done, /*newline=*/true);
}

void Progress::finish() {
  if (enabled_ && tty_ && printed_) std::fputc('\n', stderr);
}

}  // namespace mlakit::cli
