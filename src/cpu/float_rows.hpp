// Rows of f32 / f16 / bf16 storage converted to and from f32 working buffers. The switch on the
// dtype sits outside the loops, so each loop is a plain conversion the compiler vectorizes
// (bf16 is a 16-bit shift; f16 uses the F16C / AVX-512 FP16 conversions when the target has them).
#pragma once

#include <cstdint>

#include "mlakit/dtype.hpp"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace mlakit::cpu {

// Contiguous f16 -> f32: eight at a time with F16C (the compiler does not vectorize scalar
// half conversions), exact like the scalar conversion used for the tail.
inline void f16_row_to_float(const uint16_t* src, int64_t n, float* dst) {
  int64_t j = 0;
#if defined(__F16C__)
  constexpr int64_t kLanes = 8;  // one 128-bit load of halves widens to one 256-bit f32 vector
  for (; j + kLanes <= n; j += kLanes) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j));
    _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(h));
  }
#endif
  for (; j < n; ++j) dst[j] = f16_bits_to_float(src[j]);
}

// Contiguous f32 -> f16, round to nearest even (hardware and scalar paths agree).
inline void float_row_to_f16(const float* src, int64_t n, uint16_t* dst) {
  int64_t j = 0;
#if defined(__F16C__)
  constexpr int64_t kLanes = 8;  // one 256-bit f32 vector narrows to one 128-bit store
  for (; j + kLanes <= n; j += kLanes) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + j), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j), h);
  }
#endif
  for (; j < n; ++j) dst[j] = float_to_f16_bits(src[j]);
}

// dst[j] = src[j * stride] for j < n, as f32.
// src: [n] elements of `dtype` (f32, f16 or bf16) with element stride `stride`
// dst: [n] f32
inline void load_row(const void* src, DType dtype, int64_t stride, int64_t n, float* dst) {
  switch (dtype) {
    case DType::kF32: {
      const float* s = static_cast<const float*>(src);
      if (stride == 1) {
        for (int64_t j = 0; j < n; ++j) dst[j] = s[j];
      } else {
        for (int64_t j = 0; j < n; ++j) dst[j] = s[j * stride];
      }
      break;
    }
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      if (stride == 1) {
        for (int64_t j = 0; j < n; ++j) dst[j] = bf16_bits_to_float(s[j]);
      } else {
        for (int64_t j = 0; j < n; ++j) dst[j] = bf16_bits_to_float(s[j * stride]);
      }
      break;
    }
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      if (stride == 1) {
        f16_row_to_float(s, n, dst);
      } else {
        for (int64_t j = 0; j < n; ++j) dst[j] = f16_bits_to_float(s[j * stride]);
      }
      break;
    }
    default:
      for (int64_t j = 0; j < n; ++j) dst[j] = load_float(src, dtype, j * stride);
  }
}

// dst[j * stride] = src[j] rounded to `dtype` (round to nearest even), for j < n.
// src: [n] f32
// dst: [n] elements of `dtype` (f32, f16 or bf16) with element stride `stride`
inline void store_row(const float* src, int64_t n, void* dst, DType dtype, int64_t stride) {
  switch (dtype) {
    case DType::kF32: {
      float* d = static_cast<float*>(dst);
      if (stride == 1) {
        for (int64_t j = 0; j < n; ++j) d[j] = src[j];
      } else {
        for (int64_t j = 0; j < n; ++j) d[j * stride] = src[j];
      }
      break;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      if (stride == 1) {
        for (int64_t j = 0; j < n; ++j) d[j] = float_to_bf16_bits(src[j]);
      } else {
        for (int64_t j = 0; j < n; ++j) d[j * stride] = float_to_bf16_bits(src[j]);
      }
      break;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      if (stride == 1) {
        float_row_to_f16(src, n, d);
      } else {
        for (int64_t j = 0; j < n; ++j) d[j * stride] = float_to_f16_bits(src[j]);
      }
      break;
    }
    default:
      for (int64_t j = 0; j < n; ++j) store_float(dst, dtype, j * stride, src[j]);
  }
}

}  // namespace mlakit::cpu
