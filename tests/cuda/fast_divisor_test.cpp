// FastDivisor (cuda/common/fast_divisor.hpp) against the division operator: every small divisor
// and the kernels' typical ones (heads, page sizes, row tiles) with edge and random dividends, and
// random divisors up to 2^31. Host code: runs without a GPU.
#include "cuda/common/fast_divisor.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/test_util.hpp"

namespace {

using mlakit::cuda::fast_div;
using mlakit::cuda::fast_divmod;
using mlakit::cuda::make_fast_divisor;

void check_divisor(uint32_t d, std::mt19937_64& rng) {
  const auto f = make_fast_divisor(d);
  std::vector<uint32_t> dividends = {0u,          1u,          d - 1,      d,
                                     d + 1,       2 * d - 1,   2 * d,      0x7fffffffu,
                                     0x80000000u, 0xfffffffeu, 0xffffffffu};
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 200; ++i) dividends.push_back(any(rng));
  for (uint32_t k = 1; k < 64; ++k) dividends.push_back(static_cast<uint32_t>(uint64_t{k} * d - 1));
  for (uint32_t n : dividends) {
    ASSERT_EQ(fast_div(n, f), n / d) << n << " / " << d;
  }
  for (int n : {0, 1, 7, 63, 64, 65, 1000, 123456789, 0x7fffffff}) {
    const auto r = fast_divmod(n, f);
    ASSERT_EQ(r.quotient, static_cast<int>(static_cast<uint32_t>(n) / d)) << n << " / " << d;
    ASSERT_EQ(r.remainder, static_cast<int>(static_cast<uint32_t>(n) % d)) << n << " % " << d;
  }
}

TEST(FastDivisor, EverySmallDivisor) {
  std::mt19937_64 rng = mlakit::test::make_rng(__LINE__);
  for (uint32_t d = 1; d <= 4096; ++d) check_divisor(d, rng);
}

TEST(FastDivisor, LargeAndRandomDivisors) {
  std::mt19937_64 rng = mlakit::test::make_rng(__LINE__);
  for (uint32_t d : {65535u, 65536u, 65537u, 1u << 20, (1u << 30) + 1, 0x7fffffffu, 0x80000000u}) {
    check_divisor(d, rng);
  }
  std::uniform_int_distribution<uint32_t> divisor(1, 0x80000000u);
  for (int i = 0; i < 2000; ++i) check_divisor(divisor(rng), rng);
}

}  // namespace
