// Element types of the kernels and their conversions to and from f32, written to give the same
// bits as the host conversions in include/mlakit/dtype.hpp and src/core/dtype.cpp for every
// non-NaN value (round to nearest even, e4m3 saturating at 448). NaN stays NaN, but its payload
// and sign may differ: GPU arithmetic makes the canonical NaN 0x7fffffff where x86 makes
// 0xffc00000, so tests treat any two NaNs as equal.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace mlakit::cuda {

struct F32 {
  using Storage = float;
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float x) { return x; }
};

struct BF16 {
  using Storage = uint16_t;
  static __device__ __forceinline__ float load(uint16_t v) {
    return __uint_as_float(static_cast<uint32_t>(v) << 16);
  }
  // mlakit::float_to_bf16_bits: round to nearest even on the bits; NaN made quiet.
  static __device__ __forceinline__ uint16_t store(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
};

struct F16 {
  using Storage = uint16_t;
  // IEEE conversions of the hardware: exact widening, round-to-nearest-even narrowing with
  // overflow to infinity and gradual underflow, as mlakit::float_to_f16_bits.
  static __device__ __forceinline__ float load(uint16_t v) {
    return __half2float(__ushort_as_half(v));
  }
  static __device__ __forceinline__ uint16_t store(float x) {
    return __half_as_ushort(__float2half_rn(x));
  }
};

// OCP e4m3fn: no infinities, max finite 448, NaN 0x7f / 0xff.
struct E4m3 {
  using Storage = uint8_t;
  // mlakit::e4m3_bits_to_float: exact.
  static __device__ __forceinline__ float load(uint8_t b) {
    const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
    const uint32_t exponent = (b >> 3) & 0xfu, mantissa = b & 7u;
    if (exponent == 0xfu && mantissa == 7u) return __uint_as_float(sign | 0x7fc00000u);
    if (exponent == 0) {  // subnormal: mantissa * 2^-9, exact in f32
      return __uint_as_float(sign | __float_as_uint(__fmul_rn(mantissa, 0.001953125f)));
    }
    // rebias 7 -> 127: exponent + 120
    return __uint_as_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
  }
  // mlakit::float_to_e4m3_bits without branches (the CPU cache kernel's encode_e4m3): round to
  // nearest even, finite values beyond 448 and infinities saturate to 448, NaN -> 0x7f | sign.
  static __device__ __forceinline__ uint8_t store(float x) {
    const uint32_t u = __float_as_uint(x);
    const uint32_t sign = (u >> 24) & 0x80u;
    const uint32_t abs = u & 0x7fffffffu;
    // Normal e4m3 (>= 2^-6): drop 20 mantissa bits with RNE; subtracting (127 - 7) << 3 from
    // (exponent, 3 mantissa bits) rebiases the exponent.
    const uint32_t rounded = abs + 0x7ffffu + ((abs >> 20) & 1u);
    const uint32_t normal = (rounded >> 20) - (120u << 3);
    // Subnormal e4m3 (< 2^-6, unit 2^-9): 2^14 has an f32 ulp of 2^-9, so the RNE sum counts
    // whole units in its low bits.
    const uint32_t subnormal =
        __float_as_uint(__fadd_rn(__uint_as_float(abs), 16384.0f)) - __float_as_uint(16384.0f);
    uint32_t code = abs < 0x3c800000u ? subnormal : normal;  // 0x3c800000 = 2^-6
    code = abs >= 0x43e00000u ? 0x7eu : code;                // 0x43e00000 = 448 -> code 0x7e
    code = abs > 0x7f800000u ? 0x7fu : code;                 // NaN -> 0x7f
    return static_cast<uint8_t>(code | sign);
  }
};

}  // namespace mlakit::cuda
