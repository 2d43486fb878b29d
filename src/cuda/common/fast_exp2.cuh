// 2^x on the special-function unit, without exp2f's handling of results below 2^-126 (a compare,
// and a multiply before and after, around every MUFU.EX2): softmax probabilities that small
// relative to a row's largest add nothing to its sum, and flush to +0 here.
#pragma once

namespace mlakit::cuda {

// 2^x (max relative error 2^-22); results below 2^-126 flush to +0; 2^-inf = +0, NaN stays NaN.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace mlakit::cuda
