// 16-lane float vectors for the CPU decode kernel, written with GCC/Clang vector extensions so the
// same code compiles to AVX-512 (-march=native on a recent x86) or to pairs of AVX2 registers
// (-march=x86-64-v3). Loads and stores go through memcpy: any alignment, no aliasing games.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__GNUC__) && !defined(__clang__)
// Passing 64-byte vectors by value changes the ABI when AVX-512 is off; these helpers are inline
// and private to the decode kernel, so no ABI boundary is crossed.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace mlakit::cpu::simd {

inline constexpr int kLanes = 16;  // floats per 64-byte vector (one cache line, one zmm register)

using VecF = float __attribute__((vector_size(64)));
using VecI = int32_t __attribute__((vector_size(64)));

inline VecF load(const float* p) {
  VecF v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store(float* p, VecF v) { std::memcpy(p, &v, sizeof(v)); }
// Written out: `VecF{} + x` would cost a scalar add (0 + x does not fold, for x = -0).
inline VecF splat(float x) { return VecF{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

inline float reduce_add(VecF v) {
  const VecF h8 =
      __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7) + v;
  const VecF h4 =
      __builtin_shufflevector(h8, h8, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3) + h8;
  const VecF h2 =
      __builtin_shufflevector(h4, h4, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1) + h4;
  return h2[0] + h2[1];
}

inline float reduce_max(VecF v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// Horizontal sums of 16 vectors at once, by a pairwise tree of lane swaps (15 adds, 30 shuffles
// instead of 16 separate reductions). Each step halves the partial sums per source vector:
// half_sum(a, b):    lanes 0-7 hold 8 partial sums of a, lanes 8-15 of b;
// quarter_sum(x, y): of two half_sum results, 4 partials per source, sources in order;
// eighth_sum, pair_sum: 2 partials, then the totals.
inline VecF half_sum(VecF a, VecF b) {
  return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
         __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30,
                                 31);
}
inline VecF quarter_sum(VecF a, VecF b) {
  return __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
         __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
}
inline VecF eighth_sum(VecF a, VecF b) {
  return __builtin_shufflevector(a, b, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
         __builtin_shufflevector(a, b, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
}
inline VecF pair_sum(VecF a, VecF b) {
  return __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
// Lanes 4j .. 4j+3 hold partial sums of v_j.
inline VecF sums4(VecF v0, VecF v1, VecF v2, VecF v3) {
  return quarter_sum(half_sum(v0, v1), half_sum(v2, v3));
}
// Lane 4i + j is the sum of row i's vector j, given sums4 of rows 0..3.
inline VecF sums4x4(VecF r0, VecF r1, VecF r2, VecF r3) {
  return pair_sum(eighth_sum(r0, r1), eighth_sum(r2, r3));
}

// 2^x for x in [-126, 127] (callers clamp), relative error below 2e-7: x = n + f with n = rint(x),
// |f| <= 1/2, 2^f by its degree-7 Taylor polynomial (truncation error (ln2/2)^8/8! ~ 5e-9), 2^n
// by writing n + 127 into the exponent field.
inline VecF exp2(VecF x) {
  // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer for |x| < 2^22 (float
  // addition rounds away every fraction bit at that magnitude).
  const VecF kRound = splat(12582912.0f);
  const VecF n = (x + kRound) - kRound;
  const VecF f = x - n;
  // Taylor coefficients ln(2)^k / k! for k = 7 .. 0.
  VecF p = splat(1.5252733804e-5f);
  p = p * f + 1.5403530393e-4f;
  p = p * f + 1.3333558146e-3f;
  p = p * f + 9.6181291076e-3f;
  p = p * f + 5.5504108665e-2f;
  p = p * f + 2.4022650696e-1f;
  p = p * f + 6.9314718056e-1f;
  p = p * f + 1.0f;
  const VecI bits = (__builtin_convertvector(n, VecI) + 127) << 23;  // 2^n as float bits
  VecF scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline VecF max(VecF a, VecF b) { return a > b ? a : b; }
inline VecF min(VecF a, VecF b) { return a < b ? a : b; }

}  // namespace mlakit::cpu::simd
