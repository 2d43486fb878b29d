// Conversion of one cache entry (or one query row) to f32, per storage format (kv_cache.hpp):
//   f32 / f16 / bf16 entries: the values themselves;
//   fp8_e4m3 entries:         the raw e4m3 values (the caller folds k_scale into its sums);
//   fp8_ds_mla entries:       512 e4m3 values times their tile scale, then 64 16-bit rope values.
// Every function writes exactly `n` (or the format's 576) floats; vector bodies with scalar tails.
#pragma once

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
using VecF16 = _Float16 __attribute__((vector_size(32)));

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
    VecF16 h;
    std::memcpy(&h, src + i, sizeof(h));
    simd::store(dst + i, __builtin_convertvector(h, VecF));
  }
  for (; i < n; ++i) dst[i] = f16_bits_to_float(src[i]);
}

// e4m3 -> f16 is exact: move the 4 exponent + 3 mantissa bits under the f16 exponent field
// (bias 15 instead of 7, so the f16 value is 2^-8 times the e4m3 value; e4m3 subnormals land on
// f16 subnormals), convert to f32 in hardware, multiply by 2^8. 0x7f / 0xff are NaN in e4m3.
inline VecF e4m3x16(const uint8_t* src, VecF scale) {
  VecU8 b;
  std::memcpy(&b, src, sizeof(b));
  const VecU16 w = __builtin_convertvector(b, VecU16);
  const VecU16 mag = w & 0x7f;
  const VecU16 half_bits = (mag << 7) | ((w & 0x80) << 8);
  VecF16 h;
  std::memcpy(&h, &half_bits, sizeof(h));
  const VecF value = __builtin_convertvector(h, VecF) * (scale * 256.0f);
  // e4m3 NaN: the 0x7f magnitude. Compare as 32-bit lanes to pick per float.
  const auto is_nan = __builtin_convertvector(mag, VecU32) == 0x7f;
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
