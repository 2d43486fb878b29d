#include "mlakit/dtype.hpp"

#include <array>
#include <cmath>

namespace mlakit {

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kFp8E4m3:
    case DType::kU8:
      return 1;
    case DType::kI64:
      return 8;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kFp8E4m3:
      return "fp8_e4m3";
    case DType::kU8:
      return "u8";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
  }
  return "unknown";
}

bool is_float16(DType dtype) { return dtype == DType::kF16 || dtype == DType::kBF16; }

uint16_t float_to_f16_bits(float x) {
  const uint32_t u = float_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN stays a (quiet) NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (abs < 0x38800000u) {                        // below 2^-14: binary16 subnormal
    // Scaling by 2^24 is exact; nearbyint rounds to nearest-even in the default mode.
    return sign | static_cast<uint16_t>(std::nearbyint(bits_float(abs) * 16777216.0f));
  }
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);          // drop 13 mantissa bits, RNE
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);  // rebias 127 -> 15
}

float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal unit
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));  // rebias 15 -> 127
}

uint8_t float_to_e4m3_bits(float x) {
  const uint8_t sign = static_cast<uint8_t>((float_bits(x) >> 24) & 0x80u);
  if (std::isnan(x)) return sign | 0x7fu;
  const float a = std::fabs(x);
  if (a >= kFp8E4m3Max) return sign | 0x7eu;  // saturate (infinities too): 0x7e = 448
  if (a < 0.015625f) {                        // below 2^-6: e4m3 subnormal, unit 2^-9
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  const uint32_t ua = float_bits(a);
  const uint32_t rounded = ua + 0x7ffffu + ((ua >> 20) & 1u);  // keep 3 mantissa bits, RNE
  const uint32_t exponent = (rounded >> 23) - 127u + 7u;       // rebias 127 -> 7
  const uint32_t mantissa = (rounded >> 20) & 7u;
  return sign | static_cast<uint8_t>((exponent << 3) | mantissa);
}

namespace {
std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> table{};
  for (int b = 0; b < 256; ++b) {
    const int exponent = (b >> 3) & 0xf;
    const int mantissa = b & 7;
    float magnitude;
    if (exponent == 0xf && mantissa == 7) {
      magnitude = NAN;
    } else if (exponent == 0) {
      magnitude = std::ldexp(static_cast<float>(mantissa), -9);
    } else {
      magnitude = std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
    }
    table[b] = (b & 0x80) ? -magnitude : magnitude;
  }
  return table;
}
const std::array<float, 256> kE4m3Table = make_e4m3_table();
}  // namespace

float e4m3_bits_to_float(uint8_t b) { return kE4m3Table[b]; }

float round_to_dtype(float x, DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return bf16_bits_to_float(float_to_bf16_bits(x));
    case DType::kF16:
      return f16_bits_to_float(float_to_f16_bits(x));
    case DType::kFp8E4m3:
    case DType::kU8:
      return e4m3_bits_to_float(float_to_e4m3_bits(x));
    default:
      return x;
  }
}

}  // namespace mlakit
