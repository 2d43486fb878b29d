// Device side of the per-device error word (see device_errors.hpp).
#pragma once

#include <cstdint>

#include "cuda/common/device_errors.hpp"

namespace mlakit::cuda {

// Records a bad index; the caller then skips the access it guarded.
__device__ __forceinline__ void raise_device_error(uint32_t* error_word, uint32_t bit) {
  atomicOr(error_word, bit);
}

}  // namespace mlakit::cuda
