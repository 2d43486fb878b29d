// Host-side dispatch from runtime values to template arguments: a DType to the element types of
// elements.cuh, an access width to a byte count.
#pragma once

#include <cstdint>
#include <type_traits>

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

// Calls fn(std::integral_constant<int, kBytes>{}) for an access width from common_alignment
// (alignment.hpp): 16, 8, 4 or 2 bytes; any other width calls it with 1.
template <class Fn>
void dispatch_access_width(int64_t bytes, const Fn& fn) {
  switch (bytes) {
    case 16:
      return fn(std::integral_constant<int, 16>{});
    case 8:
      return fn(std::integral_constant<int, 8>{});
    case 4:
      return fn(std::integral_constant<int, 4>{});
    case 2:
      return fn(std::integral_constant<int, 2>{});
    default:
      return fn(std::integral_constant<int, 1>{});
  }
}

}  // namespace mlakit::cuda
