// Context gathers (spec A.7). gather_and_maybe_dequant_cache: one warp per dst token, grid-stride;
// the warp resolves the token's entry once (broadcast loads of the index tensors), then its lanes
// move consecutive units. cp_gather_cache: blocks (request, split); warp w of split s copies the
// request's rows s * 8 + w, s * 8 + w + splits * 8, ...
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/cache/addressing.cuh"
#include "cuda/cache/kvcache_constants.cuh"
#include "cuda/common/elements.cuh"
#include "cuda/common/pack.cuh"
#include "cuda/common/scale_source.cuh"

namespace mlakit::cuda {

// kAuto, same dtype: raw units of kUnit bytes.
template <int kUnit>
__global__ void gather_raw_kernel(const __grid_constant__ GatherParams p) {
  const int64_t units = p.row_bytes / kUnit;
  for (int64_t t = global_warp(); t < p.num_tokens; t += grid_warps()) {
    const char* entry = gather_entry(p, t);
    if (entry == nullptr) continue;
    char* dst = p.dst + t * p.dst_row_bytes;
    for (int64_t u = lane_id(); u < units; u += kWarpSize) {
      copy_unit<kUnit>(entry + u * kUnit, dst + u * kUnit);
    }
  }
}

// kAuto with a dtype change (Op = Identity) or kFp8E4m3 (In = E4m3, Op = MultiplyBy{scale}):
// dst[i] = Out(op(In(entry[i]))), packs of kVec values (kVec divides W). The scale is resolved
// here (scale_source.cuh): one read on the device that is not finite and > 0 makes the rows NaN.
// Only gather_and_maybe_dequant_cache passes a device scale (its error bit).
template <class In, class Out, int kVec, class Op>
__global__ void gather_convert_kernel(const __grid_constant__ GatherParams p) {
  Op op{};
  if constexpr (std::is_same_v<Op, MultiplyBy>) {
    op = MultiplyBy{resolve_scale(p.scale, p.error_word, kGatherBadScale)};
  }
  constexpr int64_t kInBytes = sizeof(typename In::Storage);
  constexpr int64_t kOutBytes = sizeof(typename Out::Storage);
  const int64_t packs = p.width / kVec;
  for (int64_t t = global_warp(); t < p.num_tokens; t += grid_warps()) {
    const char* entry = gather_entry(p, t);
    if (entry == nullptr) continue;
    char* dst = p.dst + t * p.dst_row_bytes;
    for (int64_t k = lane_id(); k < packs; k += kWarpSize) {
      convert_pack<In, Out, kVec>(entry + k * kVec * kInBytes, dst + k * kVec * kOutBytes, op);
    }
  }
}

// kFp8DsMla -> [576] of Out (f16/bf16): lane l dequantizes NoPE codes [16 l, 16 l + 16) with the
// scale of tile l / 8 and copies 4 of the 128 rope bytes. kAligned: entries and dst rows are
// 16-byte aligned.
template <class Out, bool kAligned>
__global__ void gather_ds_mla_kernel(const __grid_constant__ GatherParams p) {
  static_assert(sizeof(typename Out::Storage) == 2, "fp8_ds_mla gathers into 16-bit rows");
  for (int64_t t = global_warp(); t < p.num_tokens; t += grid_warps()) {
    const char* entry = gather_entry(p, t);
    if (entry == nullptr) continue;
    const int lane = lane_id();
    const char* scale_src = entry + kDsScaleOffset + (lane / kDsLanesPerTile) * sizeof(float);
    const auto* codes = reinterpret_cast<const uint8_t*>(entry) + lane * kDsValuesPerLane;
    char* dst = p.dst + t * p.dst_row_bytes;
    auto* out = reinterpret_cast<uint16_t*>(dst) + lane * kDsValuesPerLane;
    const char* rope = entry + kDsRopeOffset + lane * kDsRopeBytesPerLane;
    char* rope_dst = dst + kDsNopeValues * 2 + lane * kDsRopeBytesPerLane;
    float tile_scale;
    Pack<uint8_t, kDsValuesPerLane> q;
    if constexpr (kAligned) {
      tile_scale = *reinterpret_cast<const float*>(scale_src);
      q = *reinterpret_cast<const Pack<uint8_t, kDsValuesPerLane>*>(codes);
    } else {
      uint32_t bits = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        bits |= static_cast<uint32_t>(static_cast<uint8_t>(scale_src[i])) << (8 * i);
      tile_scale = __uint_as_float(bits);
#pragma unroll
      for (int i = 0; i < kDsValuesPerLane; ++i) q.v[i] = codes[i];
    }
    Pack<uint16_t, 8> half[kDsValuesPerLane / 8];
#pragma unroll
    for (int i = 0; i < kDsValuesPerLane; ++i) {
      half[i / 8].v[i % 8] = Out::store(__fmul_rn(E4m3::load(q.v[i]), tile_scale));
    }
    if constexpr (kAligned) {
#pragma unroll
      for (int h = 0; h < kDsValuesPerLane / 8; ++h)
        reinterpret_cast<Pack<uint16_t, 8>*>(out)[h] = half[h];
      copy_unit<kDsRopeBytesPerLane>(rope, rope_dst);
    } else {
#pragma unroll
      for (int i = 0; i < kDsValuesPerLane; ++i) out[i] = half[i / 8].v[i % 8];
#pragma unroll
      for (int i = 0; i < kDsRopeBytesPerLane; ++i) rope_dst[i] = rope[i];
    }
  }
}

// cp_gather_cache: request b = blockIdx.x (grid-stride), rows split over gridDim.y * warps.
template <int kUnit>
__global__ void cp_gather_kernel(const __grid_constant__ CpGatherParams p) {
  const RequestIndex& r = p.index;
  const int warps = blockDim.x / kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  // One report per request: the first warp of split 0.
  const bool reporter = blockIdx.y == 0 && warp == 0;
  const int64_t units = p.row_bytes / kUnit;
  for (int64_t b = blockIdx.x; b < r.batch; b += gridDim.x) {
    const int64_t begin = r.cu_seq_lens[b * r.cu_stride];
    const int64_t end = r.cu_seq_lens[(b + 1) * r.cu_stride];
    if (begin < 0 || end < begin || end > p.dst_rows) {
      if (reporter && lane_id() == 0) raise_device_error(p.error_word, kCpGatherBadRows);
      continue;
    }
    const int64_t start = r.seq_starts ? r.seq_starts[b * r.starts_stride] : 0;
    if (start < 0) {
      if (reporter && lane_id() == 0) raise_device_error(p.error_word, kCpGatherNegativeStart);
      continue;
    }
    for (int64_t i = static_cast<int64_t>(blockIdx.y) * warps + warp; i < end - begin;
         i += static_cast<int64_t>(gridDim.y) * warps) {
      const char* entry = request_entry(r, p.cache, b, start + i, p.error_word,
                                        kCpGatherColumnOutOfRange, kCpGatherBlockOutOfRange);
      if (entry == nullptr) continue;
      char* dst = p.dst + (begin + i) * p.dst_row_bytes;
      for (int64_t u = lane_id(); u < units; u += kWarpSize) {
        copy_unit<kUnit>(entry + u * kUnit, dst + u * kUnit);
      }
    }
  }
}

}  // namespace mlakit::cuda
