// Element types and exact host-side conversions (round-to-nearest-even everywhere).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace mlakit {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kFp8E4m3,  // OCP e4m3 "fn": no infinities, max finite 448, NaN = 0x7f / 0xff
  kU8,       // raw bytes (fp8 and fp8_ds_mla caches may be handed over as u8)
  kI32,
  kI64,
};

int64_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
bool is_float16(DType dtype);  // kF16 or kBF16

// ---- bf16 -----------------------------------------------------------------------------------
inline uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
inline float bits_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

inline uint16_t float_to_bf16_bits(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                    // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// ---- f16 (IEEE binary16) --------------------------------------------------------------------
uint16_t float_to_f16_bits(float x);
float f16_bits_to_float(uint16_t h);

// ---- fp8 e4m3 (saturating: finite values beyond +-448 clamp to +-448; NaN stays NaN) ----------
inline constexpr float kFp8E4m3Max = 448.0f;  // largest finite e4m3fn value
uint8_t float_to_e4m3_bits(float x);
float e4m3_bits_to_float(uint8_t b);  // table lookup

// Rounds x to the nearest value representable in `dtype` (identity for kF32).
float round_to_dtype(float x, DType dtype);

// Element access by dtype, for code that is generic over float storage types.
inline float load_float(const void* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[index];
    case DType::kBF16:
      return bf16_bits_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::kF16:
      return f16_bits_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::kFp8E4m3:
    case DType::kU8:
      return e4m3_bits_to_float(static_cast<const uint8_t*>(base)[index]);
    default:
      return NAN;
  }
}
inline void store_float(void* base, DType dtype, int64_t index, float x) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(base)[index] = x;
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[index] = float_to_bf16_bits(x);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(base)[index] = float_to_f16_bits(x);
      break;
    case DType::kFp8E4m3:
    case DType::kU8:
      static_cast<uint8_t*>(base)[index] = float_to_e4m3_bits(x);
      break;
    default:
      break;
  }
}

}  // namespace mlakit
