#include "mlakit/threads.hpp"

#include <cstdlib>

#include "cpu/thread_pool.hpp"

namespace mlakit {

int cpu_num_threads() { return cpu::num_threads(); }

int thread_count_setting(const char* text) {
  constexpr long kMaxThreads = 65535;  // far above any CPU; larger values are typos
  if (text == nullptr) return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return end != text && value >= 1 && value <= kMaxThreads ? static_cast<int>(value) : 0;
}

}  // namespace mlakit
