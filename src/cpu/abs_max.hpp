// CPU kernel of ops::abs_max.
#pragma once

#include "mlakit/types.hpp"

namespace mlakit::cpu {

// max |x| over every element of a host f32/f16/bf16 view (any strides); NaN if one is NaN, 0 for
// an empty view.
float abs_max(const TensorView& x);

}  // namespace mlakit::cpu
