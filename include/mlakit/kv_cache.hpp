// Layout math of the paged latent KV cache.
//
// The cache is a tensor [num_blocks, block_size, entry_width]. A token's slot is
// block * block_size + offset. Entry formats (spec A.2):
//   kAuto      : entry_width = L + R elements of the activation dtype.
//   kFp8E4m3   : entry_width = L + R bytes (dtype kU8 or kFp8E4m3), value = fp8 * k_scale.
//   kFp8DsMla  : entry_width = 656 bytes (dtype kU8): [0,512) e4m3 NoPE, [512,528) four f32 tile
//                scales (one per 128 NoPE values), [528,656) 64 rope values in the 16-bit
//                activation dtype. Requires L = 512, R = 64 and a 16-bit activation dtype.
#pragma once

#include <array>
#include <cstdint>

#include "mlakit/config.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/types.hpp"

namespace mlakit {

inline constexpr int64_t kDsMlaNopeBytes = 512;    // 512 fp8 NoPE values
inline constexpr int64_t kDsMlaTileSize = 128;     // NoPE values per scale
inline constexpr int64_t kDsMlaNumTiles = 4;       // 512 / 128
inline constexpr int64_t kDsMlaScaleOffset = 512;  // bytes: scales follow the NoPE values
inline constexpr int64_t kDsMlaRopeOffset = 528;   // bytes: 512 + 4 * sizeof(float)
inline constexpr int64_t kDsMlaEntryBytes = 656;   // 528 + 64 * 2
inline constexpr int64_t kDsMlaKvLoraRank = 512;   // the only L the layout supports
inline constexpr int64_t kDsMlaRopeDim = 64;       // the only R the layout supports

struct KvCacheSpec {
  MlaDims dims;
  KvCacheDType kv_dtype = KvCacheDType::kAuto;
  DType act_dtype = DType::kBF16;  // activation (model) dtype: kF32, kF16 or kBF16
  int64_t block_size = 64;
  int64_t num_blocks = 0;

  // Element type of the cache tensor: act_dtype for kAuto, kU8 for the fp8 formats.
  DType storage_dtype() const;
  // Elements of storage_dtype() per token: L + R, or 656 for kFp8DsMla.
  int64_t entry_width() const;
  // Bytes per token: 2(L+R) for 16-bit auto, L+R for fp8, 656 for ds_mla.
  int64_t entry_bytes() const;
  std::array<int64_t, 3> cache_shape() const;  // [num_blocks, block_size, entry_width]
  // Throws unless the format, dims and activation dtype fit together.
  void validate() const;
};

// Checks that `cache` is a [num_blocks, block_size, entry_width] tensor of the right dtype for
// `kv_dtype` with a contiguous entry (stride(2) == 1). Throws an Error naming `op` and the
// argument `name` ("kv_cache" in the first form).
void check_kv_cache(const char* op, const TensorView& cache, KvCacheDType kv_dtype,
                    const MlaDims& dims);
void check_kv_cache(const char* op, const char* name, const TensorView& cache,
                    KvCacheDType kv_dtype, const MlaDims& dims);

}  // namespace mlakit
