// Device side of ScaleSource (scale_source.hpp).
#pragma once

#include <cstdint>

#include "cuda/common/device_errors.cuh"
#include "cuda/common/scale_source.hpp"

namespace mlakit::cuda {

// True for a scale the fp8 formulas accept: finite and > 0 (NaN fails both comparisons).
__device__ __forceinline__ bool usable_scale(float scale) {
  return scale > 0.0f && scale <= 3.402823466e38f;  // FLT_MAX: the largest finite f32
}

// The scale of this launch. A device scale is read here; one that is not finite and > 0 becomes
// NaN, so that every value it scales (quantized or dequantized) is NaN, never a silently wrong
// number, and thread 0 of block 0 records `bad_bit` in the error word (check_device_errors). A
// host value was checked by the op already and is returned as it is.
__device__ __forceinline__ float resolve_scale(const ScaleSource& s, uint32_t* error_word,
                                               uint32_t bad_bit) {
  if (s.device == nullptr) return s.value;
  const float scale = __ldg(s.device);
  if (usable_scale(scale)) return scale;
  if (blockIdx.x == 0 && threadIdx.x == 0) raise_device_error(error_word, bad_bit);
  return __uint_as_float(0x7fc00000u);  // the canonical quiet NaN
}

}  // namespace mlakit::cuda
