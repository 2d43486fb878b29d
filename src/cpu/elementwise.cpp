#include "cpu/elementwise.hpp"

#include <cstring>

#include "cpu/parallel.hpp"
#include "cpu/strided.hpp"

namespace mlakit::cpu {

namespace {
// Rows of the innermost dimension; each row is handled as one unit of work.
int64_t row_count(const TensorView& t) {
  return t.ndim == 0 ? 1 : t.numel() / (t.shape[t.ndim - 1] ? t.shape[t.ndim - 1] : 1);
}
}  // namespace

void copy(const TensorView& src, const TensorView& dst) {
  if (dst.numel() == 0) return;
  const int64_t inner = dst.ndim ? dst.shape[dst.ndim - 1] : 1;
  const int64_t src_inner_stride = src.ndim ? src.strides[src.ndim - 1] : 1;
  const int64_t dst_inner_stride = dst.ndim ? dst.strides[dst.ndim - 1] : 1;
  parallel_for(0, row_count(dst), [&](int64_t row) {
    const int64_t s0 = strided_offset(src, row * inner);
    const int64_t d0 = strided_offset(dst, row * inner);
    if (src.dtype == dst.dtype && src_inner_stride == 1 && dst_inner_stride == 1) {
      std::memcpy(dst.element_ptr(d0), src.element_ptr(s0), inner * dst.element_size());
      return;
    }
    for (int64_t i = 0; i < inner; ++i) {
      store_float(dst.data, dst.dtype, d0 + i * dst_inner_stride,
                  load_float(src.data, src.dtype, s0 + i * src_inner_stride));
    }
  });
}

void fill_zero(const TensorView& dst) {
  if (dst.numel() == 0) return;
  const int64_t inner = dst.ndim ? dst.shape[dst.ndim - 1] : 1;
  const int64_t inner_stride = dst.ndim ? dst.strides[dst.ndim - 1] : 1;
  const int64_t elem = dst.element_size();
  parallel_for(0, row_count(dst), [&](int64_t row) {
    const int64_t d0 = strided_offset(dst, row * inner);
    if (inner_stride == 1) {
      std::memset(dst.element_ptr(d0), 0, inner * elem);
      return;
    }
    for (int64_t i = 0; i < inner; ++i)
      std::memset(dst.element_ptr(d0 + i * inner_stride), 0, elem);
  });
}

}  // namespace mlakit::cpu
