// Division of non-negative 32-bit integers by a divisor fixed at launch: the host computes a
// multiplier once (the round-up method of Granlund and Montgomery, in its branch-free form), and
// the kernel divides with one high multiply, a subtract, an add and two shifts instead of the ~20
// dependent instructions of a division by a run-time value. Exact for every 32-bit dividend and
// divisors in [1, 2^31]. Plain C++ with host/device qualifiers: the kernels, the host that builds
// their arguments and the CPU emulation of the kernels use it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MLAKIT_FAST_DIV_HD __host__ __device__
#else
#define MLAKIT_FAST_DIV_HD
#endif

namespace mlakit::cuda {

struct FastDivisor {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;  // floor(2^32 (2^l - d) / d) + 1 with l = ceil(log2 d)
  uint32_t shift1 = 0;      // min(l, 1)
  uint32_t shift2 = 0;      // max(l - 1, 0)
};

// `d` in [1, 2^31] (the callers pass positive int32 values); 0, the size of an empty dimension
// nothing is divided by, gives the divisor 1 instead of a division by zero here.
inline FastDivisor make_fast_divisor(uint32_t d) {
  if (d == 0) d = 1;
  uint32_t l = 0;
  while ((uint64_t{1} << l) < d) ++l;
  const uint64_t m = (((uint64_t{1} << l) - d) << 32) / d + 1;
  return {d, static_cast<uint32_t>(m), l < 1 ? l : 1u, l > 1 ? l - 1 : 0u};
}

MLAKIT_FAST_DIV_HD inline uint32_t fast_div(uint32_t n, const FastDivisor& f) {
#if defined(__CUDA_ARCH__)
  const uint32_t t = __umulhi(n, f.multiplier);
#else
  const auto t = static_cast<uint32_t>((uint64_t{n} * f.multiplier) >> 32);
#endif
  return (t + ((n - t) >> f.shift1)) >> f.shift2;
}

// n / d and n % d of a non-negative int.
struct DivMod {
  int quotient, remainder;
};
MLAKIT_FAST_DIV_HD inline DivMod fast_divmod(int n, const FastDivisor& f) {
  const auto q = static_cast<int>(fast_div(static_cast<uint32_t>(n), f));
  return {q, n - q * static_cast<int>(f.divisor)};
}

}  // namespace mlakit::cuda
