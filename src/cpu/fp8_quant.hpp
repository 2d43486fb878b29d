// CPU kernel of ops::scaled_fp8_quant (arguments already validated by the op).
#pragma once

#include "mlakit/types.hpp"

namespace mlakit::cpu {

// out = e4m3(clamp(x * inv_scale, -448, 448)) element by element; x f32/f16/bf16, out 1-byte fp8;
// same shape, any strides.
void scaled_fp8_quant(const TensorView& x, const TensorView& out, float inv_scale);

}  // namespace mlakit::cpu
