// Views of the layer inputs shared by the entry points of MlaAttention.
#pragma once

#include "core/check.hpp"
#include "mlakit/types.hpp"

namespace mlakit::detail {

// k_pe may be [T, R] or [T, 1, R] (vLLM passes the unsqueezed form); returns the 2-D view.
inline TensorView squeeze_k_pe(const char* op, const TensorView& k_pe) {
  if (k_pe.ndim != 3) return k_pe;
  require(k_pe.shape[1] == 1, ErrorCode::kInvalidArgument, op,
          ": k_pe must be [T, R] or [T, 1, R], got ", shape_string(k_pe));
  TensorView t = k_pe;
  t.ndim = 2;
  t.shape[1] = k_pe.shape[2];
  t.strides[1] = k_pe.strides[2];
  return t;
}

}  // namespace mlakit::detail
