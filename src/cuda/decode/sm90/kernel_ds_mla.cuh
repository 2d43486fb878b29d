// The pieces of the mma.sync decode kernel (kernel.cuh) for a 16-bit q over an fp8_ds_mla cache
// with 16 rows (Config<16, kFp8DsMla, RawDsMlaMma<Rope>>): the raw tile (64 entries of 656 bytes:
// 512 e4m3 NoPE values, 4 f32 scales of 128 values each, 64 rope values in the rope dtype) is read
// in place, as raw e4m3 tiles are (kernel_e4m3.cuh), with no conversion pass:
//   q      NoPE dims in f16 in raw_e4m3_dim_order, each row multiplied by a power of two that puts
//          its largest |value| in [2^14, 2^15) (a bf16 q may exceed f16's range; the factor is
//          undone on the row's scores); rope dims in the rope dtype;
//   scores S = sum_g scale_g[key] (q_g . K_g) + q_rope . K_rope: four chains of f16 MMAs over the
//          raw e4m3 K of the four 128-dim scale groups, scaled in f32 after the MMAs, and a chain
//          of MMAs in the rope dtype over the stored rope values;
//   values warp w owns output columns [64 w, 64 w + 64), all in scale group w / 2: O_w += (P x
//          scale_{w/2} / m) V_raw, P's A fragments scaled per key in f16, with m the tile's
//          largest scale of the group rounded up to a power of two (so P x scale / m <= 1); O is
//          kept in units of m, the ratio of consecutive tiles' m joins alpha, the last one the
//          epilogue's factor.
// 656-byte rows need no swizzle: 656 / 16 = 41 is odd, so the 16-byte chunks of 8 consecutive keys
// fall in 8 distinct bank groups for every ldmatrix phase. A NaN scale makes the key's scores and
// P NaN, hence its rows'; keys past the segment are zero-filled by the copies (scales 0).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/decode/sm90/kernel_common.cuh"
#include "cuda/decode/sm90/kernel_e4m3.cuh"
#include "cuda/decode/sm90/ptx.cuh"
#include "cuda/decode/sm90/traits.cuh"

namespace mlakit::cuda::decode_sm90 {

inline constexpr int kDsMlaScaleOffset = 512;  // the 4 f32 scales of an entry
inline constexpr int kDsMlaRopeChunk = 33;     // the rope values start at byte 528 = chunk 33
inline constexpr int kDsMlaGroups = 4;         // scale groups of 128 NoPE values

// acc[chain][0][4] += q rows x this warp's 8 keys: chains 0-3 the NoPE scale groups (f16 MMAs on
// raw e4m3 K), chain 4 the rope (MMAs in the rope dtype on the stored values).
template <class Cfg, class QFrags>
__device__ __forceinline__ void compute_scores_raw_ds_mla(
    const QFrags& q_frags, uint32_t k_base, int key_group,
    float (&acc)[Cfg::kScoreChains][Cfg::kScoreTiles][4]) {
  static_assert(Cfg::kRawDsMla && Cfg::kScoreChains == kDsMlaGroups + 1, "group and rope chains");
  using Rope = typename Cfg::Element::RopeMma;
  const int lane = threadIdx.x & 31;
  const int key = key_group * Cfg::kKeysPerWarp + (lane & 7);
  // Rope first: its chain of 4 MMAs overlaps the NoPE chains that follow.
  // ldmatrix.x4 of 4 chunks of 8 16-bit values gives the B fragments of two k16 steps.
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    uint32_t b[4];
    ldmatrix_x4(b, k_base + Cfg::raw_offset(key, kDsMlaRopeChunk + 4 * j + (lane >> 3)));
    Rope::mma(acc[kDsMlaGroups][0], q_frags[32 + 2 * j], b[0], b[1]);
    Rope::mma(acc[kDsMlaGroups][0], q_frags[33 + 2 * j], b[2], b[3]);
  }
  // NoPE: chunks 0-31, 8 per 128-dim scale group, so chunk 4 kp + i is in group kp / 2; one kp of
  // each group per round, so that consecutive MMAs feed the four group chains in turn (in kp order
  // a group's 8 MMAs ran back to back, each waiting for the one before).
  raw_e4m3_key_steps<8, kDsMlaGroups, Cfg>(
      q_frags, k_base, key, [](int kp, int) { return kp / 2; }, acc);
}

// Raw score e of this thread's n8 tile: sum_g acc_g x scale_g[key] x q_unscale + acc_rope, for
// its key (key_group's keys, 2 tq + (e & 1)); q_unscale undoes the row's NoPE q factor (the rope
// q is not scaled).
template <class Cfg>
__device__ __forceinline__ float ds_mla_score(const float (&acc)[Cfg::kScoreChains][1][4],
                                              const float4 (&key_scales)[2], float q_unscale,
                                              int e) {
  const float4 s = key_scales[e & 1];
  const float nope =
      acc[0][0][e] * s.x + acc[1][0][e] * s.y + acc[2][0][e] * s.z + acc[3][0][e] * s.w;
  return nope * q_unscale + acc[kDsMlaGroups][0][e];
}

// The 4 scales of this thread's two score keys (2 tq, 2 tq + 1 of its key group).
template <class Cfg>
__device__ __forceinline__ void load_score_key_scales(const uint8_t* tile, int key_group, int tq,
                                                      float4 (&key_scales)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int key = key_group * Cfg::kKeysPerWarp + 2 * tq + i;
    key_scales[i] =
        *reinterpret_cast<const float4*>(tile + key * Cfg::kRawEntry + kDsMlaScaleOffset);
  }
}

// This warp's value scales of a tile: m = the group's largest |scale| over the 64 keys rounded up
// to a power of two (1 if all are 0; infinite if one is), and for each k16 step ks the f16 pairs
// scale / m of keys (16 ks + 2 tq, + 1) and (16 ks + 2 tq + 8, + 9). Returns m.
template <class Cfg>
__device__ __forceinline__ float ds_mla_value_scales(const uint8_t* tile, int warp,
                                                     uint32_t (&pairs)[kBlockN / 16][2]) {
  const int lane = threadIdx.x & 31, tq = lane & 3;
  const int group = warp / (kWarps / kDsMlaGroups);  // 2 warps (128 columns) per scale group
  auto scale_of = [&](int key) {
    return *reinterpret_cast<const float*>(tile + key * Cfg::kRawEntry + kDsMlaScaleOffset +
                                           4 * group);
  };
  float max_abs = fmaxf(fabsf(scale_of(lane)), fabsf(scale_of(lane + 32)));
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    max_abs = fmaxf(max_abs, __shfl_xor_sync(0xffffffffu, max_abs, offset));
  }
  // Round up to a power of two (exact ratios between tiles): an exponent-only float, one step up
  // when the mantissa is not zero.
  const uint32_t bits = __float_as_uint(max_abs);
  const float m =
      max_abs == 0.0f ? 1.0f
      : max_abs == INFINITY
          ? max_abs
          : __uint_as_float(((bits & 0x7fffffu) != 0 ? bits + 0x800000u : bits) & 0x7f800000u);
  const float inv_m = 1.0f / m;
#pragma unroll
  for (int ks = 0; ks < kBlockN / 16; ++ks) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = 16 * ks + 2 * tq + 8 * h;
      pairs[ks][h] = F16Mma::pack(scale_of(key) * inv_m, scale_of(key + 1) * inv_m);
    }
  }
  return m;
}

// f16x2 product (P's pair of keys times their value scales), round to nearest.
__device__ __forceinline__ uint32_t mul_f16x2(uint32_t a, uint32_t b) {
  auto as_half2 = [](uint32_t v) {
    __half2_raw r;
    r.x = static_cast<unsigned short>(v & 0xffffu);
    r.y = static_cast<unsigned short>(v >> 16);
    return __half2(r);
  };
  const __half2_raw p = __hmul2(as_half2(a), as_half2(b));
  return static_cast<uint32_t>(p.x) | (static_cast<uint32_t>(p.y) << 16);
}

// o[0][n8 tile][4] += (P x scale / m) (16 x 64, shared, f16) x raw e4m3 V columns [64 warp, 64
// warp + 64): the raw e4m3 values with P's A fragments scaled per key (value_pair_column order).
template <class Cfg>
__device__ __forceinline__ void accumulate_values_raw_ds_mla(
    uint32_t p_base, uint32_t v_base, int warp, const uint32_t (&pairs)[kBlockN / 16][2],
    float (&o)[Cfg::kRowTiles][Cfg::kColTiles][4]) {
  static_assert(Cfg::kRawDsMla && Cfg::kRowTiles == 1, "16 rows");
  accumulate_values_raw_e4m3<Cfg>(p_base, v_base, warp, o, [&](int ks, uint32_t(&a)[1][4]) {
    // a0 / a1: rows g / g + 8 of keys (2 tq, + 1); a2 / a3: of keys (2 tq + 8, + 9)
    a[0][0] = mul_f16x2(a[0][0], pairs[ks][0]);
    a[0][1] = mul_f16x2(a[0][1], pairs[ks][0]);
    a[0][2] = mul_f16x2(a[0][2], pairs[ks][1]);
    a[0][3] = mul_f16x2(a[0][3], pairs[ks][1]);
  });
}

}  // namespace mlakit::cuda::decode_sm90
