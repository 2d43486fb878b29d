// CUDA elementwise ops (docs/kernels/elementwise_cuda.md). Arguments are validated by the callers
// (src/ops/elementwise.cpp, the fp8 quant op); these enqueue on `stream` without synchronizing or
// allocating. Data pointers must be aligned to their element size (as every view of a
// cudaMalloc'd buffer is).
#pragma once

#include "mlakit/types.hpp"

namespace mlakit::cuda {

// dst = src converted to dst's dtype (f32/f16/bf16, round to nearest even); same shape, any
// strides. Same dtypes move raw bytes (16-byte accesses when the layout allows).
void copy(const TensorView& src, const TensorView& dst, Stream stream);

// Every element of dst (any dtype, any strides) becomes 0: one cudaMemsetAsync when dst is one
// dense run, else a kernel.
void fill_zero(const TensorView& dst, Stream stream);

// out = e4m3(x * inv_scale) element by element (the product rounded to f32, then round to
// nearest even saturating at +-448); x f32/f16/bf16, out fp8_e4m3/u8 of x's shape, any strides.
// inv_scale is 1 / scale rounded to f32 by the caller, as the CPU kernel takes it.
void scaled_fp8_quant(const TensorView& x, const TensorView& out, float inv_scale, Stream stream);

// The same with the scale read on the device when the kernel runs (CUDA-graph replays follow the
// value written there): out = e4m3(x * __frcp_rn(*scale)), the bits of the form above for the
// same scale. A *scale that is not finite and > 0 with a finite reciprocal writes NaN codes and
// records kQuantBadScale (check_device_errors); with zero_scale_gives_zero, *scale == 0 writes
// code 0 everywhere instead (dynamic_fp8_scale's result for an all-zero x).
// scale: [1] f32 on x's device
void scaled_fp8_quant(const TensorView& x, const TensorView& out, const float* scale,
                      bool zero_scale_gives_zero, Stream stream);

// *scale = max |x| / 448 (f32 division; 448: the largest finite e4m3 value), computed on the
// device in place: a memset, the abs_max reduction into *scale's bits, and a one-thread kernel.
// 0 for an all-zero or empty x, NaN when an element is NaN, inf when one is inf. Allocates
// nothing and does not synchronize (capturable).
// scale: [1] f32 on x's device (written)
void dynamic_fp8_scale(const TensorView& x, float* scale, Stream stream);

// max |x| over a f32/f16/bf16 view (any strides); NaN when an element is NaN, 0 when empty. Reads
// the result back to the host: synchronizes `stream` (calibration only, not for graph capture).
float abs_max(const TensorView& x, Stream stream);

}  // namespace mlakit::cuda
