// Walking the elements of a strided view in row-major order.
#pragma once

#include <cstdint>

#include "mlakit/types.hpp"

namespace mlakit::cpu {

// Element offset (in elements) of the row-major linear index `linear` in view `t`.
inline int64_t strided_offset(const TensorView& t, int64_t linear) {
  int64_t offset = 0;
  for (int d = t.ndim - 1; d >= 0; --d) {
    offset += (linear % t.shape[d]) * t.strides[d];
    linear /= t.shape[d];
  }
  return offset;
}

}  // namespace mlakit::cpu
