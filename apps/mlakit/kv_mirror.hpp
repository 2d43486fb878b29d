// A host copy of what one layer's paged cache holds, kept by `mlakit run --verify`: every token
// written is stored as the values the cache will return (dequantized for fp8 formats), so the
// oracle sees exactly the keys the library reads. Written independently of the library's cache
// kernel, from the same slot_mapping. Blocks are allocated on first write.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mlakit/kv_cache.hpp"
#include "mlakit/types.hpp"

namespace mlakit::cli {

class KvMirror {
 public:
  KvMirror(const KvCacheSpec& spec, float k_scale);

  // kv_c: host [>= T, L], k_pe: host [>= T, R] (activation dtype, any row strides);
  // slots: [T] (negative: skipped).
  void write(const TensorView& kv_c, const TensorView& k_pe, std::span<const int64_t> slots);
  // [L + R] values the cache holds at `slot`; the slot must have been written.
  std::span<const float> entry(int64_t slot) const;

 private:
  KvCacheSpec spec_;
  float k_scale_;
  std::vector<std::vector<float>> blocks_;  // [num_blocks][block_size * (L + R)], lazily sized
};

// x as stored by a cache of format `kv_dtype`, read back: identity for auto (x is already in
// the activation dtype); e4m3(x / k_scale) * k_scale for fp8; fp8_ds_mla: 128-value tiles of the
// latent part scaled by max(amax / 448, FLT_MIN), rope part unchanged. entry: [L + R], in place.
void quantize_dequantize_entry(std::span<float> entry, KvCacheDType kv_dtype, int64_t kv_lora_rank,
                               float k_scale);

}  // namespace mlakit::cli
