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

// Two e4m3 bytes -> bf16x2 without the conversion pipe, which sm_90 runs at 16 results per clock
// and SM (the cvt.e4m3x2 -> f16x2, f16 -> f32 -> bf16 chain took ~9 issue cycles per value and
// made the fp8 decode slower than the bf16 one). `sext` holds the two bytes sign-extended into the
// 16-bit lanes (prmt). Shifting a lane left by 4 puts the 7 magnitude bits (4 exponent, 3
// mantissa) on bf16's low exponent and high mantissa bits and the sign on bit 15 (mask 0x87f0
// drops the other copies of the sign): a bf16 with exponent E_e4m3 instead of E_e4m3 + 120, so one
// exact multiply by 2^120 gives the value. Exact for every finite e4m3, subnormals included (they
// land on bf16 subnormals, which bf16 multiplies keep). A NaN byte comes out as +-480: callers
// check e4m3x4_nan_bytes.
__device__ __forceinline__ uint32_t e4m3_sext_pair_to_bf16x2(uint32_t sext) {
  constexpr uint32_t kMagnitudeAndSign = 0x87f087f0u;
  constexpr uint32_t kTwoPow120 = 0x7b807b80u;  // bf16 2^120 in both lanes (exponent 247)
  return mul_bf16x2((sext << 4) & kMagnitudeAndSign, kTwoPow120);
}

// prmt selectors: result bytes (low first) = byte i, sign of byte i, byte i + 1, sign of byte i + 1
// (a nibble with bit 3 set replicates the sign of the byte it names).
inline constexpr uint32_t kSextBytes01 = 0x9180u;
inline constexpr uint32_t kSextBytes23 = 0xb3a2u;

// The conversion pipe's exact conversion of eight e4m3 values (bytes of `in`, lowest first) to
// eight MMA elements (lowest in the low half of .x); NaN stays NaN.
template <class Elem>
__device__ __forceinline__ uint4 convert_e4m3x8_exact(uint2 in) {
  return make_uint4(Elem::from_e4m3x2(in.x & 0xffff), Elem::from_e4m3x2(in.x >> 16),
                    Elem::from_e4m3x2(in.y & 0xffff), Elem::from_e4m3x2(in.y >> 16));
}

// The four bf16x2 pairs of eight e4m3 values (bytes of `in`, lowest first) by the bit path;
// returns nonzero if any is NaN (then the pairs are not their values).
__device__ __forceinline__ uint32_t e4m3x8_to_bf16_pairs(uint2 in, uint32_t (&pairs)[4]) {
  pairs[0] = e4m3_sext_pair_to_bf16x2(prmt_b32(in.x, kSextBytes01));
  pairs[1] = e4m3_sext_pair_to_bf16x2(prmt_b32(in.x, kSextBytes23));
  pairs[2] = e4m3_sext_pair_to_bf16x2(prmt_b32(in.y, kSextBytes01));
  pairs[3] = e4m3_sext_pair_to_bf16x2(prmt_b32(in.y, kSextBytes23));
  return e4m3x4_nan_bytes(in.x) | e4m3x4_nan_bytes(in.y);
}

// convert_e4m3x8_exact by the cheapest path of the element type: for bf16 the bit path, which
// returns nonzero if any value is NaN (then `out` is not the conversion: the caller redoes it
// exactly); for f16 the conversion pipe (one cvt per pair, no cheaper by bit tricks).
template <class Elem>
__device__ __forceinline__ uint32_t convert_e4m3x8(uint2 in, uint4& out) {
  if constexpr (Elem::kBf16) {
    uint32_t pairs[4];
    const uint32_t nan = e4m3x8_to_bf16_pairs(in, pairs);
    out = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    return nan;
  } else {
    out = convert_e4m3x8_exact<Elem>(in);
    return 0;
  }
}

// The two floats of a bf16x2 pair (exact: a bf16 is the high half of an f32).
__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t pair) {
  const uint32_t lo = pair << 16, hi = pair & 0xffff0000u;
  float2 f;
  memcpy(&f.x, &lo, sizeof(float));
  memcpy(&f.y, &hi, sizeof(float));
  return f;
}

}  // namespace mlakit::cuda::decode_sm90
