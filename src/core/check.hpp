// Argument validation shared by every op and backend. Messages follow DESIGN.md §4:
// "<op>: <argument> <what was expected>, got <what was given>".
#pragma once

#include <initializer_list>
#include <sstream>
#include <string>

#include "mlakit/error.hpp"
#include "mlakit/types.hpp"

namespace mlakit::detail {

template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void fail(ErrorCode code, const std::string& message);

template <class... Args>
void require(bool condition, ErrorCode code, const Args&... args) {
  if (!condition) fail(code, str_cat(args...));
}

std::string shape_string(const TensorView& t);    // "[4, 16, 576]"
std::string strides_string(const TensorView& t);  // "[9216, 576, 1]"

void check_ndim(const char* op, const char* name, const TensorView& t, int ndim);
void check_dtype(const char* op, const char* name, const TensorView& t,
                 std::initializer_list<DType> allowed);
void check_size(const char* op, const char* name, const TensorView& t, int dim, int64_t expected);
void check_min_size(const char* op, const char* name, const TensorView& t, int dim,
                    int64_t minimum);
// t.shape[dim] equals ref.shape[ref_dim]; the message names both tensors and `what` the size is
// ("<op>: out.shape[2] must equal q.shape[2] (num_heads) = 16, got 8").
void check_size_matches(const char* op, const char* name, const TensorView& t, int dim,
                        const char* ref_name, const TensorView& ref, int ref_dim, const char* what);
// The innermost dimension has stride 1 (or size <= 1).
void check_inner_contiguous(const char* op, const char* name, const TensorView& t);
void check_contiguous(const char* op, const char* name, const TensorView& t);
// Non-empty tensors must have a data pointer and an extent whose byte offsets fit in int64;
// non-negative sizes and strides only.
void check_storage(const char* op, const char* name, const TensorView& t);
void check_device(const char* op, const char* name, const TensorView& t, Device expected);
void check_float_activation(const char* op, const char* name, const TensorView& t);  // f32/f16/bf16
// A scale factor: finite and > 0.
void check_positive_finite(const char* op, const char* name, float value);

}  // namespace mlakit::detail

namespace mlakit::detail {

struct NamedTensor {
  const char* name;
  const TensorView* tensor;
};
// All tensors of one op call must be on one device; returns it (kCpu for an empty list).
Device common_device(const char* op, std::initializer_list<NamedTensor> tensors);
// Throws kUnsupported: `op` has no kernel for `device` in this build.
[[noreturn]] void unsupported_device(const char* op, Device device);

}  // namespace mlakit::detail
