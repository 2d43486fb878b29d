#include "common/cache_reference.hpp"

#include <cmath>
#include <cstring>

#include "common/fp8_reference.hpp"

namespace mlakit::test {

double expected_dequant_value(KvCacheDType kv, DType cache_dtype, DType dst_dtype, float scale,
                              const uint8_t* entry, int64_t i) {
  switch (kv) {
    case KvCacheDType::kAuto:
      return round_to_dtype(load_float(entry, cache_dtype, i), dst_dtype);
    case KvCacheDType::kFp8E4m3:  // exact double product, rounded to f32, then to dst
      return round_to_dtype(static_cast<float>(e4m3_value(entry[i]) * scale), dst_dtype);
    case KvCacheDType::kFp8DsMla: {
      if (i >= 512) return load_float(entry + 528, dst_dtype, i - 512);  // rope bits, as stored
      float tile_scale;
      std::memcpy(&tile_scale, entry + 512 + 4 * (i / 128), 4);
      return round_to_dtype(static_cast<float>(e4m3_value(entry[i]) * tile_scale), dst_dtype);
    }
  }
  return NAN;
}

}  // namespace mlakit::test
