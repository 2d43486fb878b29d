#include "mlakit/threads.hpp"

#include "cpu/thread_pool.hpp"

namespace mlakit {

int cpu_num_threads() { return cpu::num_threads(); }

}  // namespace mlakit
