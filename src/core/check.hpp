// Argument validation shared by every op and backend. Messages follow DESIGN.md §4:
// "<op>: <argument> <what was expected>, got <what was given>".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
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

// Message pieces that format themselves only when streamed into a message (str_cat): passed to
// require(), they cost a copy of a few integers when the check passes, where a std::string would
// cost an ostringstream on every call (docs/perf-notes.md, "Engine path").
struct DimsText {  // "[4, 16, 576]"
  int ndim = 0;
  int64_t dims[kMaxDims] = {};
};
std::ostream& operator<<(std::ostream& os, const DimsText& d);
struct DeviceText {  // "cpu", "cuda:0" (as device_name)
  Device device;
};
std::ostream& operator<<(std::ostream& os, const DeviceText& d);
struct ViewText {  // "[4, 16, 576] bf16 cpu" (as TensorView::to_string)
  DimsText shape;
  DType dtype = DType::kF32;
  Device device{};
};
std::ostream& operator<<(std::ostream& os, const ViewText& v);

DimsText shape_string(const TensorView& t);    // "[4, 16, 576]"
DimsText strides_string(const TensorView& t);  // "[9216, 576, 1]"
inline DeviceText device_text(Device device) { return {device}; }
ViewText view_text(const TensorView& t);

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
// A scale given as a tensor (ops.hpp, "Scales as tensors"): dtype f32, exactly one element (any
// shape), on `device`, its address 4-byte aligned. Reads no element.
void check_scale_tensor(const char* op, const char* name, const TensorView& t, Device device);
// check_scale_tensor's checks, but one element (any shape) or a one-dimensional [batch] tensor
// (any stride): one scale per request of a batch.
void check_request_scale_tensor(const char* op, const char* name, const TensorView& t,
                                Device device, int64_t batch);
// The value of a host scale tensor that check_scale_tensor accepted.
float host_scale_value(const TensorView& t);
// True when the byte ranges two views can touch intersect. Empty views touch nothing, and so do
// views no check has accepted yet (null data, negative strides, an extent that overflows).
bool views_overlap(const TensorView& a, const TensorView& b);
// A scale tensor (named `scale_name`) must not share memory with the op's output `written` (named
// `name`): the CUDA kernels read the scale on the device while they write the output.
void check_scale_apart(const char* op, const TensorView& scale, const char* name,
                       const TensorView& written, const char* scale_name = "scale");

}  // namespace mlakit::detail

namespace mlakit::detail {

struct NamedTensor {
  const char* name;
  const TensorView* tensor;
};
// All tensors of one op call must be on one device; returns it (kCpu for an empty list).
Device common_device(const char* op, std::initializer_list<NamedTensor> tensors);
// True when distinct indices of `t` address distinct elements, by a sufficient condition: ordered
// by stride, every dimension of size > 1 steps past the last element the smaller ones reach. (A
// few interleaved layouts that are unique, e.g. shape [3, 3] with strides [3, 2], fail it.) Empty
// views, and views no check has accepted yet (null data, negative strides), count as unique: their
// own checks report them.
bool has_unique_addresses(const TensorView& t);
// An output whose indices collide (a stride 0 on a dimension of size > 1, or rows closer than
// their width) would be written by several kernel threads at once, in an order of their own:
// "<op>: <name> must not overlap itself (each output element needs its own storage), got shape
// [..] with strides [..]". Zero-size views are accepted whatever their strides.
void check_no_self_overlap(const char* op, const char* name, const TensorView& t);
// An op's outputs must share no memory with each other or with its inputs, nor overlap themselves
// (check_no_self_overlap): its kernels read the inputs while writing the outputs, in an order of
// their own, so an overlap would give a result that depends on that order. Empty views touch
// nothing (views_overlap); a null `tensor` (an absent optional argument) is skipped.
void check_outputs_apart(const char* op, std::initializer_list<NamedTensor> outputs,
                         std::initializer_list<NamedTensor> inputs);
// Throws kUnsupported: `op` has no kernel for `device` in this build; for a CUDA device the message
// says why: a CPU-only build has no CUDA backend, or the CUDA backend lacks the op.
[[noreturn]] void unsupported_device(const char* op, Device device);

}  // namespace mlakit::detail
