// fp8 e4m3 -> 16-bit MMA element conversion of cache values (docs/kernels/decode_sm90.md, "fp8
// conversion"). Built on ptx.cuh's primitives only, so that the CPU emulation test runs this logic
// with its host versions of them.
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda/decode/sm90/ptx.cuh"

namespace mlakit::cuda::decode_sm90 {

// Bit 7 of each byte of `four` (four e4m3 values) whose value is NaN (magnitude bits 0x7f): adding
// 1 to a 7-bit magnitude carries into bit 7 only from 0x7f, and never into the next byte.
__device__ __forceinline__ uint32_t e4m3x4_nan_bytes(uint32_t four) {
  constexpr uint32_t kMagnitudes = 0x7f7f7f7fu, kOnes = 0x01010101u, kCarries = 0x80808080u;
  return ((four & kMagnitudes) + kOnes) & kCarries;
}

// Two e4m3 bytes -> two MMA elements without the conversion pipe, which sm_90 runs at 16 results
// per clock and SM (cvt.e4m3x2 -> f16x2, and for bf16 the f16 -> f32 -> bf16 chain after it).
// `sext` holds the two bytes sign-extended into the 16-bit lanes (prmt). Shifting a lane left puts
// the 7 magnitude bits (4 exponent, 3 mantissa) on the element's low exponent and high mantissa
// bits and a copy of the sign on bit 15; the mask drops the other copies. That is an element whose
// exponent is e4m3's with the element's bias (127 bf16, 15 f16) instead of e4m3's (7), so one exact
// multiply by 2^120 (bf16) or 2^8 (f16) gives the value. Exact for every finite e4m3, subnormals
// included (they land on the element's subnormals, which its multiplies keep). A NaN byte comes out
// as +-480: callers check e4m3x4_nan_bytes.
template <class Elem>
__device__ __forceinline__ uint32_t e4m3_sext_pair_to_elements(uint32_t sext) {
  if constexpr (Elem::kBf16) {
    constexpr uint32_t kSignAndMagnitude = 0x87f087f0u;  // bit 15, bits 10..4 of each lane
    constexpr uint32_t kTwoPow120 = 0x7b807b80u;         // bf16 2^120 (exponent field 247)
    return mul_bf16x2((sext << 4) & kSignAndMagnitude, kTwoPow120);
  } else {
    constexpr uint32_t kSignAndMagnitude = 0xbf80bf80u;  // bit 15, bits 13..7 of each lane
    constexpr uint32_t kTwoPow8 = 0x5c005c00u;           // f16 2^8 (exponent field 23)
    return mul_f16x2((sext << 7) & kSignAndMagnitude, kTwoPow8);
  }
}

// prmt selectors: result bytes (low first) = byte i, sign of byte i, byte i + 1, sign of byte i + 1
// (a nibble with bit 3 set replicates the sign of the byte it names).
inline constexpr uint32_t kSextBytes01 = 0x9180u;
inline constexpr uint32_t kSextBytes23 = 0xb3a2u;

// Eight e4m3 values (bytes of `in`, lowest first) -> four pairs of MMA elements (lowest in the low
// half of pairs[0]) by the bit path. Returns nonzero if any value is NaN; the pairs are then not
// their values, and the caller converts them with convert_e4m3x8_exact.
template <class Elem>
__device__ __forceinline__ uint32_t convert_e4m3x8(uint2 in, uint32_t (&pairs)[4]) {
  pairs[0] = e4m3_sext_pair_to_elements<Elem>(prmt_b32(in.x, kSextBytes01));
  pairs[1] = e4m3_sext_pair_to_elements<Elem>(prmt_b32(in.x, kSextBytes23));
  pairs[2] = e4m3_sext_pair_to_elements<Elem>(prmt_b32(in.y, kSextBytes01));
  pairs[3] = e4m3_sext_pair_to_elements<Elem>(prmt_b32(in.y, kSextBytes23));
  return e4m3x4_nan_bytes(in.x) | e4m3x4_nan_bytes(in.y);
}

// The conversion pipe's exact version of convert_e4m3x8 (NaN stays NaN).
template <class Elem>
__device__ __forceinline__ void convert_e4m3x8_exact(uint2 in, uint32_t (&pairs)[4]) {
  pairs[0] = Elem::from_e4m3x2(in.x & 0xffff);
  pairs[1] = Elem::from_e4m3x2(in.x >> 16);
  pairs[2] = Elem::from_e4m3x2(in.y & 0xffff);
  pairs[3] = Elem::from_e4m3x2(in.y >> 16);
}

// The two floats of a pair of MMA elements (exact; a bf16 is the high half of an f32).
template <class Elem>
__device__ __forceinline__ float2 elements_to_float2(uint32_t pair) {
  if constexpr (Elem::kBf16) {
    const uint32_t lo = pair << 16, hi = pair & 0xffff0000u;
    float2 f;
    memcpy(&f.x, &lo, sizeof(float));
    memcpy(&f.y, &hi, sizeof(float));
    return f;
  } else {
    return f16x2_to_float2(pair);
  }
}

}  // namespace mlakit::cuda::decode_sm90
