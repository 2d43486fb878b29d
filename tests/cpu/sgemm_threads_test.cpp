// cpu::sgemm (src/cpu/sgemm.hpp) from several threads at once: exact results on every thread (a
// BLAS that shares its packing buffers between threads, such as Debian's serial OpenBLAS, fails
// this), no thread started by the BLAS, and the calling thread's OpenMP thread count unchanged.
#include <dirent.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "cpu/sgemm.hpp"

namespace mlakit::cpu {
namespace {

// Big enough that OpenBLAS would split it over its threads if it were allowed to (its threshold is
// 4 x 65536 multiply-adds), small enough for many repetitions.
constexpr int64_t kSize = 96;
// Host threads calling at once, and calls per thread. Why: with Debian's serial OpenBLAS, 8 threads
// x 3000 calls of this size gave 31-494 wrong products per run on the 2-core CI machine.
constexpr int kCallers = 8;
constexpr int kCallsPerThread = 1500;

int threads_of_this_process() {
  int count = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (const dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
  closedir(dir);
  return count;
}

// a, b: [kSize, kSize] small integers, so every f32 sum is exact; distinct per caller.
void fill_operands(int caller, std::vector<float>& a, std::vector<float>& b) {
  for (int64_t i = 0; i < kSize * kSize; ++i) {
    a[size_t(i)] = static_cast<float>((i * 7 + caller) % 13 - 6);
    b[size_t(i)] = static_cast<float>((i * 5 + 3 * caller) % 11 - 5);
  }
}

// c = a @ b in double (row-major, [kSize, kSize]).
std::vector<double> product_fp64(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<double> c(size_t(kSize * kSize), 0.0);
  for (int64_t r = 0; r < kSize; ++r)
    for (int64_t k = 0; k < kSize; ++k)
      for (int64_t col = 0; col < kSize; ++col)
        c[size_t(r * kSize + col)] += double(a[size_t(r * kSize + k)]) * b[size_t(k * kSize + col)];
  return c;
}

TEST(Sgemm, ExactFromManyThreadsAtOnce) {
  std::atomic<int64_t> wrong_products{0};
  std::vector<std::thread> callers;
  for (int caller = 0; caller < kCallers; ++caller) {
    callers.emplace_back([caller, &wrong_products] {
      std::vector<float> a(size_t(kSize * kSize)), b(size_t(kSize * kSize));
      fill_operands(caller, a, b);
      const std::vector<double> expected = product_fp64(a, b);
      std::vector<float> c(size_t(kSize * kSize));
      for (int call = 0; call < kCallsPerThread; ++call) {
        std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
        sgemm(MatrixLayout::kRowMajor, false, false, kSize, kSize, kSize, 1.0f, a.data(), kSize,
              b.data(), kSize, 0.0f, c.data(), kSize);
        for (size_t i = 0; i < c.size(); ++i) {
          if (double(c[i]) != expected[i]) {
            wrong_products.fetch_add(1);
            break;
          }
        }
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(wrong_products.load(), 0) << "of " << kCallers * kCallsPerThread << " products";
}

TEST(Sgemm, StartsNoThreadAndKeepsTheCallersOpenMpThreadCount) {
  // A fresh thread, so that no earlier call of this process has started OpenMP workers.
  std::thread([] {
    omp_set_num_threads(4);  // what a host thread may have set; OpenBLAS would use 4 threads
    std::vector<float> a(size_t(kSize * kSize)), b(size_t(kSize * kSize));
    fill_operands(0, a, b);
    std::vector<float> c(size_t(kSize * kSize));
    const int threads_before = threads_of_this_process();
    ASSERT_GT(threads_before, 0) << "/proc/self/task is not readable";
    sgemm(MatrixLayout::kRowMajor, false, false, kSize, kSize, kSize, 1.0f, a.data(), kSize,
          b.data(), kSize, 0.0f, c.data(), kSize);
    EXPECT_EQ(threads_of_this_process(), threads_before);
    EXPECT_EQ(omp_get_max_threads(), 4);
  }).join();
}

TEST(Sgemm, TheLinkedOpenBlasServesCallsFromSeveralThreads) {
  EXPECT_NO_THROW(require_per_thread_blas("sgemm_threads_test"));
}

}  // namespace
}  // namespace mlakit::cpu
