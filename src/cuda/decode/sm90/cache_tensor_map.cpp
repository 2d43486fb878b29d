#include "cuda/decode/sm90/cache_tensor_map.hpp"

#include <cuda_runtime.h>  // __host__ __device__ of traits.cuh in a .cpp

#include <algorithm>
#include <cstdint>

#include "core/check.hpp"
#include "cuda/common/tensor_map.hpp"
#include "cuda/decode/sm90/traits.cuh"
#include "mlakit/kv_cache.hpp"

namespace mlakit::cuda::decode_sm90 {

namespace {

constexpr int kTmaAlignment = 16;  // TMA's requirement on the global address and strides (bytes)
constexpr int kBoxValues = 64;     // one 128-byte swizzle span of 16-bit values (a column block)

// A 3-D map (`values` elements of `type` from `base`, block_size slots, num_blocks pages) over the
// cache's pages, read in boxes of `box_values` x cache_box_slots(block_size) x 1.
CUtensorMap encode_cache_map(const DecodeKernelParams& p, CUtensorMapDataType type,
                             const uint8_t* base, int values, int box_values,
                             CUtensorMapSwizzle swizzle) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(values),
                              static_cast<cuuint64_t>(p.block_size),
                              static_cast<cuuint64_t>(p.num_blocks)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p.cache_stride_slot_bytes),
                                 static_cast<cuuint64_t>(p.cache_stride_block_bytes)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_values),
                             static_cast<cuuint32_t>(cache_box_slots(p.block_size)), 1};
  CUtensorMap map;
  const CUresult status =
      encode_tiled_tensor_map("mla_decode", map, type, 3, base, dims, strides, box, swizzle);
  if (status != CUDA_SUCCESS) {
    detail::fail(ErrorCode::kBackend,
                 detail::str_cat("mla_decode: cuTensorMapEncodeTiled refused the kv_cache (error ",
                                 static_cast<int>(status), ")"));
  }
  return map;
}

}  // namespace

bool cache_tensor_map_supported(const DecodeKernelParams& p) {
  const int bs = p.block_size;
  const bool box_ok = bs == kMinBoxSlots || bs == 16 || bs == 32 || (bs > 0 && bs % 64 == 0);
  return box_ok && p.num_blocks > 0 && reinterpret_cast<uintptr_t>(p.cache) % kTmaAlignment == 0 &&
         p.cache_stride_slot_bytes % kTmaAlignment == 0 &&
         p.cache_stride_block_bytes % kTmaAlignment == 0;
}

CUtensorMap make_cache_tensor_map(const DecodeKernelParams& p, CacheFormat format) {
  detail::require(format == CacheFormat::kNative || format == CacheFormat::kFp8E4m3,
                  ErrorCode::kInternal,
                  "mla_decode: one TMA map reads native and fp8_e4m3 caches only");
  const bool fp8 = format == CacheFormat::kFp8E4m3;
  return encode_cache_map(p, fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16,
                          p.cache, kDimQK, kBoxValues,
                          fp8 ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B);
}

DsMlaTensorMaps make_ds_mla_tensor_maps(const DecodeKernelParams& p) {
  static_assert(kDsMlaScaleOffset % kTmaAlignment == 0 && kDsMlaRopeOffset % kTmaAlignment == 0,
                "the scale and rope maps start 16-byte aligned in a 16-byte aligned entry");
  constexpr int kScales = static_cast<int>(kDsMlaNumTiles);  // f32 scales per entry: 16 bytes
  DsMlaTensorMaps maps;
  // The NoPE bytes in the raw column blocks of 64 bytes the convert warpgroup reads.
  maps.nope =
      encode_cache_map(p, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.cache, static_cast<int>(kDsMlaNopeBytes),
                       kBoxValues, CU_TENSOR_MAP_SWIZZLE_NONE);
  // A key's 4 scales as one 16-byte row of the scale ring (the smallest box row TMA takes).
  maps.scales = encode_cache_map(p, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p.cache + kDsMlaScaleOffset,
                                 kScales, kScales, CU_TENSOR_MAP_SWIZZLE_NONE);
  // The rope values, 16-bit like the operand tile (bf16 or f16: the bits are copied), straight
  // into its ninth column block in the wgmma layout.
  maps.rope =
      encode_cache_map(p, CU_TENSOR_MAP_DATA_TYPE_UINT16, p.cache + kDsMlaRopeOffset,
                       static_cast<int>(kDsMlaRopeDim), kBoxValues, CU_TENSOR_MAP_SWIZZLE_128B);
  return maps;
}

std::optional<CUtensorMap> make_q_tensor_map(const DecodeKernelParams& p, RuntimeDType element) {
  const int64_t heads = p.num_heads;
  const bool whole_heads =
      heads > 0 && (heads % kDecodeRowsLarge == 0 || kDecodeRowsLarge % heads == 0);
  constexpr int64_t kBytes = 2;  // a 16-bit q value
  const bool aligned = reinterpret_cast<uintptr_t>(p.q) % kTmaAlignment == 0 &&
                       (p.q_stride_head * kBytes) % kTmaAlignment == 0 &&
                       (p.q_stride_query * kBytes) % kTmaAlignment == 0 &&
                       (p.q_stride_batch * kBytes) % kTmaAlignment == 0;
  if (p.q_dtype != element || !whole_heads || !aligned || p.batch <= 0 || p.s_q <= 0) {
    return std::nullopt;
  }
  const int64_t box_heads = std::min<int64_t>(heads, kDecodeRowsLarge);
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(kDimQK), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(p.s_q), static_cast<cuuint64_t>(p.batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(p.q_stride_head * kBytes),
                                 static_cast<cuuint64_t>(p.q_stride_query * kBytes),
                                 static_cast<cuuint64_t>(p.q_stride_batch * kBytes)};
  const cuuint32_t box[4] = {kBoxValues, static_cast<cuuint32_t>(box_heads),
                             static_cast<cuuint32_t>(kDecodeRowsLarge / box_heads), 1};
  CUtensorMap map;
  if (encode_tiled_tensor_map("mla_decode", map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, p.q, dims,
                              strides, box, CU_TENSOR_MAP_SWIZZLE_128B) != CUDA_SUCCESS) {
    return std::nullopt;  // e.g. strides the driver does not take: the threads load q
  }
  return map;
}

}  // namespace mlakit::cuda::decode_sm90
