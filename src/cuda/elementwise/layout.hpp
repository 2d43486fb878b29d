// Host side of the elementwise kernels: merges the dimensions that src and dst traverse alike and
// describes the result as rows of units (params.cuh).
#pragma once

#include <cstdint>

#include "cuda/elementwise/params.cuh"
#include "mlakit/types.hpp"

namespace mlakit::cuda {

// A view pair with as few dimensions as possible: size-1 dimensions dropped, and a dimension
// merged into the next inner one when both views step over it as one run
// (stride[d] == stride[d + 1] * shape[d + 1] in src and in dst). Strides in elements.
struct MergedDims {
  int ndim = 1;
  int64_t shape[kMaxDims] = {1};
  int64_t src_stride[kMaxDims] = {1};
  int64_t dst_stride[kMaxDims] = {1};

  int64_t inner() const { return shape[ndim - 1]; }
  bool inner_contiguous() const {
    return shape[ndim - 1] == 1 || (src_stride[ndim - 1] == 1 && dst_stride[ndim - 1] == 1);
  }
};

// `src` may be dst itself (fill_zero): then only dst's strides matter.
MergedDims merge_dims(const TensorView& src, const TensorView& dst);

// Rows of `m` (all dimensions but the innermost), with units described by the caller:
// `units_per_row` units a row, `src_unit_bytes` / `dst_unit_bytes` apart.
RowsLayout rows_layout(const MergedDims& m, int64_t src_elem_bytes, int64_t dst_elem_bytes,
                       int64_t units_per_row, int64_t src_unit_bytes, int64_t dst_unit_bytes);

}  // namespace mlakit::cuda
