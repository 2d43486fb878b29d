// Parameters of the elementwise kernels: a strided tensor walked as rows of units.
//
// After merging the dimensions both views traverse alike (layout.hpp), a tensor is `rows` rows
// (up to 3 outer dimensions) of `units_per_row` units; a unit is one vector access (a Pack of
// elements, or a raw run of bytes) or a single element when the innermost stride is not 1.
// All offsets are in bytes.
#pragma once

#include <cstdint>

namespace mlakit::cuda {

inline constexpr int kMaxOuterDims = 3;  // kMaxDims (4) minus the innermost dimension

struct RowsLayout {
  int64_t rows = 0;
  int64_t units_per_row = 0;
  int outer_ndim = 0;
  int64_t outer_shape[kMaxOuterDims] = {};      // innermost outer dimension last
  int64_t src_outer_bytes[kMaxOuterDims] = {};  // byte stride of each outer dimension in src
  int64_t dst_outer_bytes[kMaxOuterDims] = {};  // ... in dst
  int64_t src_unit_bytes = 0;                   // bytes between consecutive units of a src row
  int64_t dst_unit_bytes = 0;                   // ... of a dst row
};

struct ElementwiseParams {
  const char* src = nullptr;  // unused by fill_zero
  char* dst = nullptr;
  RowsLayout layout;
};

}  // namespace mlakit::cuda
