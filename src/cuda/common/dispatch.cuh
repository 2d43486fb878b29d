// Host-side dispatch from a runtime DType to the element types of elements.cuh.
#pragma once

#include "core/check.hpp"
#include "cuda/common/elements.cuh"
#include "mlakit/dtype.hpp"

namespace mlakit::cuda {

// Calls fn(F32{}), fn(F16{}) or fn(BF16{}) for a float activation dtype.
template <class Fn>
void dispatch_float(const char* op, DType dtype, const Fn& fn) {
  switch (dtype) {
    case DType::kF32:
      return fn(F32{});
    case DType::kF16:
      return fn(F16{});
    case DType::kBF16:
      return fn(BF16{});
    default:
      detail::fail(ErrorCode::kInternal,
                   detail::str_cat(op, ": unexpected dtype ", dtype_name(dtype), " on the GPU"));
  }
}

// Calls fn(F16{}) or fn(BF16{}) for a 16-bit activation dtype.
template <class Fn>
void dispatch_float16(const char* op, DType dtype, const Fn& fn) {
  if (dtype == DType::kF16) return fn(F16{});
  if (dtype == DType::kBF16) return fn(BF16{});
  detail::fail(ErrorCode::kInternal,
               detail::str_cat(op, ": unexpected 16-bit dtype ", dtype_name(dtype), " on the GPU"));
}

}  // namespace mlakit::cuda
