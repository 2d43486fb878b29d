#pragma once

#include "mlakit/types.hpp"

namespace mlakit::cpu {

// dst = src with dtype conversion; shapes already validated equal.
void copy(const TensorView& src, const TensorView& dst);
void fill_zero(const TensorView& dst);

}  // namespace mlakit::cpu
