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

// max |x| over a f32/f16/bf16 view (any strides); NaN when an element is NaN, 0 when empty. Reads
// the result back to the host: synchronizes `stream` (calibration only, not for graph capture).
float abs_max(const TensorView& x, Stream stream);

}  // namespace mlakit::cuda
