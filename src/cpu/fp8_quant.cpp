#include "cpu/fp8_quant.hpp"

#include <cstdint>

#include "cpu/parallel.hpp"
#include "mlakit/dtype.hpp"

namespace mlakit::cpu {
namespace {

// Element offset of the first element of row `row` (all dimensions but the last, row-major).
int64_t row_offset(const TensorView& t, int64_t row) {
  int64_t offset = 0;
  for (int d = t.ndim - 2; d >= 0; --d) {
    offset += (row % t.shape[d]) * t.strides[d];
    row /= t.shape[d];
  }
  return offset;
}

}  // namespace

void scaled_fp8_quant(const TensorView& x, const TensorView& out, float inv_scale) {
  if (x.numel() == 0) return;
  if (x.ndim == 0) {  // a scalar
    static_cast<uint8_t*>(out.data)[0] =
        float_to_e4m3_bits(load_float(x.data, x.dtype, 0) * inv_scale);
    return;
  }
  const int64_t cols = x.shape[x.ndim - 1];
  const int64_t rows = x.numel() / cols;
  const int64_t x_step = x.strides[x.ndim - 1], out_step = out.strides[out.ndim - 1];
  parallel_for(0, rows, [&](int64_t r) {
    const int64_t xo = row_offset(x, r), oo = row_offset(out, r);
    uint8_t* dst = static_cast<uint8_t*>(out.data) + oo;
    for (int64_t c = 0; c < cols; ++c) {
      // x * (1 / scale), the reciprocal rounded to f32 first (spec F-37), then saturating RNE.
      dst[c * out_step] =
          float_to_e4m3_bits(load_float(x.data, x.dtype, xo + c * x_step) * inv_scale);
    }
  });
}

}  // namespace mlakit::cpu
