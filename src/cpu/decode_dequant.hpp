// Conversion of one cache entry (or one query row) to f32, per storage format (kv_cache.hpp):
//   f32 / f16 / bf16 entries: the values themselves;
//   fp8_e4m3 entries:         the raw e4m3 values (the caller folds k_scale into its sums);
//   fp8_ds_mla entries:       512 e4m3 values times their tile scale, then 64 16-bit rope values.
// Every function writes exactly `n` (or the format's 576) floats; vector bodies with scalar tails.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/decode_simd.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/kv_cache.hpp"

namespace mlakit::cpu::dequant {

using simd::kLanes;
using simd::VecF;

using VecU16 = uint16_t __attribute__((vector_size(32)));
using VecU8 = uint8_t __attribute__((vector_size(16)));
using VecU32 = uint32_t __attribute__((vector_size(64)));

// 16 IEEE half values (raw bits) -> f32 with the hardware converter (GCC turns a _Float16 vector
// conversion into 16 scalar conversions, so the intrinsics are spelled out).
inline VecF half_to_float(VecU16 bits) {
#if defined(__AVX512F__)
  // The zero-masking form with a full mask is the same instruction; the plain intrinsic trips
  // GCC 12's -Wmaybe-uninitialized on its internal _mm512_undefined_ps().
  const __m512 f = _mm512_maskz_cvtph_ps(0xffff, reinterpret_cast<__m256i&>(bits));
#elif defined(__F16C__)
  __m128i lo, hi;
  std::memcpy(&lo, &bits, sizeof(lo));
  std::memcpy(&hi, reinterpret_cast<const char*>(&bits) + sizeof(lo), sizeof(hi));
  const __m256 f[2] = {_mm256_cvtph_ps(lo), _mm256_cvtph_ps(hi)};
#else
  float f[kLanes];
  for (int i = 0; i < kLanes; ++i) f[i] = f16_bits_to_float(bits[i]);
#endif
  VecF v;
  std::memcpy(&v, &f, sizeof(v));
  return v;
}

inline void f32_row(const float* src, int64_t n, float* dst) {
  std::memcpy(dst, src, n * sizeof(float));
}

// bf16 is the upper half of an f32: widen and shift.
inline void bf16_row(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    VecU16 h;
    std::memcpy(&h, src + i, sizeof(h));
    const VecU32 bits = __builtin_convertvector(h, VecU32) << 16;
    std::memcpy(dst + i, &bits, sizeof(bits));
  }
  for (; i < n; ++i) dst[i] = bf16_bits_to_float(src[i]);
}

inline void f16_row(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    VecU16 h;
    std::memcpy(&h, src + i, sizeof(h));
    simd::store(dst + i, half_to_float(h));
  }
  for (; i < n; ++i) dst[i] = f16_bits_to_float(src[i]);
}

// e4m3 -> f16 is exact: move the 4 exponent + 3 mantissa bits under the f16 exponent field
// (bias 15 instead of 7, so the f16 value is 2^-8 times the e4m3 value; e4m3 subnormals land on
// f16 subnormals), convert to f32 in hardware, multiply by 2^8. 0x7f / 0xff are NaN in e4m3.
inline VecF e4m3x16(const uint8_t* src, VecF scale) {
  VecU8 b;
  std::memcpy(&b, src, sizeof(b));
  // w << 7 puts the magnitude at bits 7-13 and the sign at bit 14; adding bit 14 to itself moves
  // the sign to bit 15 (f16's sign) and clears bit 14.
  const VecU16 shifted = __builtin_convertvector(b, VecU16) << 7;
  const VecU16 half_bits = shifted + (shifted & 0x4000);
  const VecF value = half_to_float(half_bits) * (scale * 256.0f);
  const auto is_nan = __builtin_convertvector(half_bits & 0x3f80, VecU32) == 0x3f80;
  return is_nan ? simd::splat(__builtin_nanf("")) : value;
}

inline void e4m3_row(const uint8_t* src, int64_t n, float* dst, float scale) {
  int64_t i = 0;
  const VecF s = simd::splat(scale);
  for (; i + kLanes <= n; i += kLanes) simd::store(dst + i, e4m3x16(src + i, s));
  for (; i < n; ++i) dst[i] = e4m3_bits_to_float(src[i]) * scale;
}

inline void float16_row(const uint16_t* src, int64_t n, DType dtype, float* dst) {
  if (dtype == DType::kBF16) {
    bf16_row(src, n, dst);
  } else {
    f16_row(src, n, dst);
  }
}

// One fp8_ds_mla entry (656 bytes) -> 576 floats: NoPE tile t times scale t, then the rope.
inline void ds_mla_entry(const uint8_t* entry, DType rope_dtype, float* dst) {
  float scales[kDsMlaNumTiles];
  std::memcpy(scales, entry + kDsMlaScaleOffset, sizeof(scales));
  for (int64_t t = 0; t < kDsMlaNumTiles; ++t) {
    e4m3_row(entry + t * kDsMlaTileSize, kDsMlaTileSize, dst + t * kDsMlaTileSize, scales[t]);
  }
  uint16_t rope[kDsMlaRopeDim];
  std::memcpy(rope, entry + kDsMlaRopeOffset, sizeof(rope));  // 2-byte aligned in any layout
  float16_row(rope, kDsMlaRopeDim, rope_dtype, dst + kDsMlaKvLoraRank);
}

// Any supported element type -> f32 (query rows; not on the per-key path).
inline void any_row(const void* src, DType dtype, int64_t n, float* dst) {
  switch (dtype) {
    case DType::kF32:
      f32_row(static_cast<const float*>(src), n, dst);
      break;
    case DType::kBF16:
    case DType::kF16:
      float16_row(static_cast<const uint16_t*>(src), n, dtype, dst);
      break;
    default:  // kFp8E4m3, kU8 (validated by the op)
      e4m3_row(static_cast<const uint8_t*>(src), n, dst, 1.0f);
      break;
  }
}

}  // namespace mlakit::cpu::dequant
