#include "cuda/elementwise/layout.hpp"

namespace mlakit::cuda {

MergedDims merge_dims(const TensorView& src, const TensorView& dst) {
  MergedDims m;
  m.ndim = 0;
  for (int d = 0; d < dst.ndim; ++d) {
    if (dst.shape[d] == 1) continue;
    const int64_t ss = src.strides[d], ds = dst.strides[d];
    if (m.ndim > 0) {
      const int last = m.ndim - 1;
      if (m.src_stride[last] == ss * dst.shape[d] && m.dst_stride[last] == ds * dst.shape[d]) {
        m.shape[last] *= dst.shape[d];
        m.src_stride[last] = ss;
        m.dst_stride[last] = ds;
        continue;
      }
    }
    m.shape[m.ndim] = dst.shape[d];
    m.src_stride[m.ndim] = ss;
    m.dst_stride[m.ndim] = ds;
    ++m.ndim;
  }
  if (m.ndim == 0) {  // a single element
    m.ndim = 1;
    m.shape[0] = 1;
    m.src_stride[0] = m.dst_stride[0] = 1;
  }
  return m;
}

RowsLayout rows_layout(const MergedDims& m, int64_t src_elem_bytes, int64_t dst_elem_bytes,
                       int64_t units_per_row, int64_t src_unit_bytes, int64_t dst_unit_bytes) {
  RowsLayout l;
  l.outer_ndim = m.ndim - 1;
  l.rows = 1;
  for (int d = 0; d < l.outer_ndim; ++d) {
    l.outer_shape[d] = m.shape[d];
    l.src_outer_bytes[d] = m.src_stride[d] * src_elem_bytes;
    l.dst_outer_bytes[d] = m.dst_stride[d] * dst_elem_bytes;
    l.rows *= m.shape[d];
  }
  l.units_per_row = units_per_row;
  l.src_unit_bytes = src_unit_bytes;
  l.dst_unit_bytes = dst_unit_bytes;
  return l;
}

}  // namespace mlakit::cuda
