// concat_and_cache_mla kernels (spec A.3): one warp per token, grid-stride over tokens. The warp
// reads the token's slot once (a broadcast load), then its lanes move consecutive units of the
// entry, so each warp access is contiguous. Each kernel first moves its share of p.q_rope (the
// decode queries' rope part, concat_and_cache_mla_with_q_rope; nothing when p.q_rope.rows is 0).
#pragma once

#include <cfloat>
#include <cstdint>

#include "cuda/cache/addressing.cuh"
#include "cuda/cache/kvcache_constants.cuh"
#include "cuda/common/elements.cuh"
#include "cuda/common/pack.cuh"
#include "cuda/common/scale_source.cuh"

namespace mlakit::cuda {

// Every thread moves units i = global_thread() + j * grid_threads() of the copy, numbered
// (row, head, unit) with the unit fastest: consecutive lanes touch consecutive bytes.
__device__ __forceinline__ void copy_head_rows(const HeadRowsCopy& c) {
  const int64_t total = c.rows * c.heads * c.units;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t unit = i % c.units, run = i / c.units;
    const int64_t head = run % c.heads, row = run / c.heads;
    const int64_t offset = unit * c.unit_bytes;
    copy_unit_of(c.unit_bytes, c.src + row * c.src_row_bytes + head * c.src_head_bytes + offset,
                 c.dst + row * c.dst_row_bytes + head * c.dst_head_bytes + offset);
  }
}

// kAuto: entry = [kv_c | k_pe] bit for bit, in raw units of kUnit bytes (kUnit divides both
// parts, every row stride and the entry strides).
template <int kUnit>
__global__ void write_raw_kernel(const __grid_constant__ CacheWriteParams p) {
  copy_head_rows(p.q_rope);
  const int64_t latent_bytes = p.latent * p.elem_bytes;
  const int64_t units = (p.latent + p.rope) * p.elem_bytes / kUnit;
  for (int64_t t = global_warp(); t < p.num_tokens; t += grid_warps()) {
    char* entry = write_entry(p, t);
    if (entry == nullptr) continue;
    const char* kv_c = p.kv_c + t * p.kv_c_row_bytes;
    const char* k_pe = p.k_pe + t * p.k_pe_row_bytes;
    for (int64_t u = lane_id(); u < units; u += kWarpSize) {
      const int64_t o = u * kUnit;
      copy_unit<kUnit>(o < latent_bytes ? kv_c + o : k_pe + (o - latent_bytes), entry + o);
    }
  }
}

// kFp8E4m3: entry[i] = e4m3(x[i] / k_scale), packs of kVec values (kVec divides L and R). A
// k_scale read on the device that is not finite and > 0 writes NaN codes (scale_source.cuh).
template <class In, int kVec>
__global__ void write_fp8_kernel(const __grid_constant__ CacheWriteParams p) {
  copy_head_rows(p.q_rope);
  constexpr int64_t kInBytes = sizeof(typename In::Storage);
  const int64_t packs = (p.latent + p.rope) / kVec;
  const DivideBy op{resolve_scale(p.k_scale, p.error_word, kConcatBadScale)};
  for (int64_t t = global_warp(); t < p.num_tokens; t += grid_warps()) {
    char* entry = write_entry(p, t);
    if (entry == nullptr) continue;
    const char* kv_c = p.kv_c + t * p.kv_c_row_bytes;
    const char* k_pe = p.k_pe + t * p.k_pe_row_bytes;
    for (int64_t k = lane_id(); k < packs; k += kWarpSize) {
      const int64_t i = k * kVec;  // first value of the pack; entry bytes = values
      const char* src = i < p.latent ? kv_c + i * kInBytes : k_pe + (i - p.latent) * kInBytes;
      convert_pack<In, E4m3, kVec>(src, entry + i, op);
    }
  }
}

// kFp8DsMla (656-byte entry, kvcache_constants.cuh). Lane l quantizes NoPE values
// [16 l, 16 l + 16): the 8 lanes of tile l / 8 reduce their amax with xor shuffles, lane 8 k
// stores tile k's scale, and every lane copies 4 bytes of the 128 rope bytes. kAligned: every
// input row and cache entry start is 16-byte aligned (vector accesses); else byte/element ones.
template <class In, bool kAligned>
__global__ void write_ds_mla_kernel(const __grid_constant__ CacheWriteParams p) {
  copy_head_rows(p.q_rope);
  static_assert(sizeof(typename In::Storage) == 2, "fp8_ds_mla stores 16-bit rope values");
  using Half8 = Pack<uint16_t, 8>;
  for (int64_t t = global_warp(); t < p.num_tokens; t += grid_warps()) {
    char* entry = write_entry(p, t);
    if (entry == nullptr) continue;
    const int lane = lane_id();
    const auto* kv_c =
        reinterpret_cast<const uint16_t*>(p.kv_c + t * p.kv_c_row_bytes) + lane * kDsValuesPerLane;
    float x[kDsValuesPerLane];
    if constexpr (kAligned) {
#pragma unroll
      for (int h = 0; h < kDsValuesPerLane / 8; ++h) {
        const Half8 v = reinterpret_cast<const Half8*>(kv_c)[h];
#pragma unroll
        for (int i = 0; i < 8; ++i) x[8 * h + i] = In::load(v.v[i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kDsValuesPerLane; ++i) x[i] = In::load(kv_c[i]);
    }
    // amax over the tile; a NaN never wins a comparison (as in the CPU kernel).
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kDsValuesPerLane; ++i) {
      const float a = fabsf(x[i]);
      amax = a > amax ? a : amax;
    }
#pragma unroll
    for (int offset = kDsLanesPerTile / 2; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, amax, offset);
      amax = other > amax ? other : amax;
    }
    // std::max(amax / 448, FLT_MIN): FLT_MIN keeps an all-zero tile's quotients 0, not NaN.
    const float quotient = __fdiv_rn(amax, kE4m3Max);
    const float tile_scale = quotient < FLT_MIN ? FLT_MIN : quotient;
    Pack<uint8_t, kDsValuesPerLane> codes;
#pragma unroll
    for (int i = 0; i < kDsValuesPerLane; ++i)
      codes.v[i] = E4m3::store(__fdiv_rn(x[i], tile_scale));
    char* nope = entry + lane * kDsValuesPerLane;
    char* scale_dst = entry + kDsScaleOffset + (lane / kDsLanesPerTile) * sizeof(float);
    const char* rope = p.k_pe + t * p.k_pe_row_bytes + lane * kDsRopeBytesPerLane;
    char* rope_dst = entry + kDsRopeOffset + lane * kDsRopeBytesPerLane;
    if constexpr (kAligned) {
      *reinterpret_cast<Pack<uint8_t, kDsValuesPerLane>*>(nope) = codes;
      if (lane % kDsLanesPerTile == 0) *reinterpret_cast<float*>(scale_dst) = tile_scale;
      copy_unit<kDsRopeBytesPerLane>(rope, rope_dst);
    } else {
#pragma unroll
      for (int i = 0; i < kDsValuesPerLane; ++i) nope[i] = static_cast<char>(codes.v[i]);
      if (lane % kDsLanesPerTile == 0) {
        const uint32_t bits = __float_as_uint(tile_scale);
#pragma unroll
        for (int i = 0; i < 4; ++i) scale_dst[i] = static_cast<char>(bits >> (8 * i));
      }
#pragma unroll
      for (int i = 0; i < kDsRopeBytesPerLane; ++i) rope_dst[i] = rope[i];
    }
  }
}

}  // namespace mlakit::cuda
