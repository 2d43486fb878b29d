#include "kv_mirror.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>

#include "mlakit/error.hpp"

namespace mlakit::cli {

void quantize_dequantize_entry(std::span<float> entry, KvCacheDType kv_dtype, int64_t kv_lora_rank,
                               float k_scale) {
  const auto fp8 = [](float x) { return e4m3_bits_to_float(float_to_e4m3_bits(x)); };
  switch (kv_dtype) {
    case KvCacheDType::kAuto:
      return;
    case KvCacheDType::kFp8E4m3:
      for (float& x : entry) x = fp8(x / k_scale) * k_scale;
      return;
    case KvCacheDType::kFp8DsMla:
      for (int64_t tile = 0; tile < kv_lora_rank / kDsMlaTileSize; ++tile) {
        const std::span<float> t = entry.subspan(tile * kDsMlaTileSize, kDsMlaTileSize);
        float amax = 0.0f;
        for (float x : t) amax = std::max(amax, std::fabs(x));
        const float scale = std::max(amax / kFp8E4m3Max, FLT_MIN);  // FLT_MIN: all-zero tiles
        for (float& x : t) x = fp8(x / scale) * scale;
      }
      return;  // the rope part is stored unquantized in the 16-bit activation dtype
  }
}

KvMirror::KvMirror(const KvCacheSpec& spec, float k_scale)
    : spec_(spec), k_scale_(k_scale), blocks_(spec.num_blocks) {}

void KvMirror::write(const TensorView& kv_c, const TensorView& k_pe,
                     std::span<const int64_t> slots) {
  const int64_t l = spec_.dims.kv_lora_rank, r = spec_.dims.qk_rope_head_dim, e = l + r;
  for (size_t t = 0; t < slots.size(); ++t) {
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    const int64_t block = slot / spec_.block_size, offset = slot % spec_.block_size;
    if (block >= spec_.num_blocks) {
      throw Error(ErrorCode::kInternal,
                  "KvMirror::write: slot " + std::to_string(slot) + " outside the cache");
    }
    std::vector<float>& data = blocks_[block];
    if (data.empty()) data.assign(spec_.block_size * e, NAN);
    const std::span<float> dst(data.data() + offset * e, e);
    const auto row = static_cast<int64_t>(t);
    for (int64_t i = 0; i < l; ++i) {
      dst[i] = load_float(kv_c.data, kv_c.dtype, row * kv_c.stride(0) + i * kv_c.stride(1));
    }
    for (int64_t i = 0; i < r; ++i) {
      dst[l + i] = load_float(k_pe.data, k_pe.dtype, row * k_pe.stride(0) + i * k_pe.stride(1));
    }
    quantize_dequantize_entry(dst, spec_.kv_dtype, l, k_scale_);
  }
}

std::span<const float> KvMirror::entry(int64_t slot) const {
  const int64_t e = spec_.dims.entry_dim();
  const int64_t block = slot / spec_.block_size, offset = slot % spec_.block_size;
  if (slot < 0 || block >= spec_.num_blocks || blocks_[block].empty()) {
    throw Error(ErrorCode::kInternal,
                "KvMirror::entry: slot " + std::to_string(slot) + " was never written");
  }
  return {blocks_[block].data() + offset * e, static_cast<size_t>(e)};
}

}  // namespace mlakit::cli
