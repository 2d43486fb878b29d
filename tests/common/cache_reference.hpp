// The value a dequantizing gather must produce for one element of a cache entry, written from the
// entry formats' definitions (kv_cache.hpp) with the independent e4m3 reference.
#pragma once

#include <cstdint>

#include "mlakit/config.hpp"
#include "mlakit/dtype.hpp"

namespace mlakit::test {

// Element i of `entry` dequantized in f32 (cast, e4m3 * scale, or e4m3 * tile scale; ds_mla rope
// bits as stored) and rounded to dst_dtype. cache_dtype: the element dtype of kAuto entries.
double expected_dequant_value(KvCacheDType kv, DType cache_dtype, DType dst_dtype, float scale,
                              const uint8_t* entry, int64_t i);

}  // namespace mlakit::test
