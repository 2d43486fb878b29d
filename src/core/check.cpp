#include "core/check.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

namespace mlakit::detail {

void fail(ErrorCode code, const std::string& message) { throw Error(code, message); }

namespace {
DimsText dims_text(int ndim, const int64_t* values) {
  DimsText d;
  d.ndim = ndim;
  for (int i = 0; i < ndim && i < kMaxDims; ++i) d.dims[i] = values[i];
  return d;
}
}  // namespace

std::ostream& operator<<(std::ostream& os, const DimsText& d) {
  os << '[';
  for (int i = 0; i < d.ndim && i < kMaxDims; ++i) os << (i ? ", " : "") << d.dims[i];
  return os << ']';
}

std::ostream& operator<<(std::ostream& os, const DeviceText& d) {
  if (d.device.is_cpu()) return os << "cpu";
  return os << "cuda:" << d.device.index;
}

std::ostream& operator<<(std::ostream& os, const ViewText& v) {
  return os << v.shape << ' ' << dtype_name(v.dtype) << ' ' << DeviceText{v.device};
}

DimsText shape_string(const TensorView& t) { return dims_text(t.ndim, t.shape); }
DimsText strides_string(const TensorView& t) { return dims_text(t.ndim, t.strides); }
ViewText view_text(const TensorView& t) { return {shape_string(t), t.dtype, t.device}; }

void check_ndim(const char* op, const char* name, const TensorView& t, int ndim) {
  require(t.ndim == ndim, ErrorCode::kInvalidArgument, op, ": ", name, " must have ", ndim,
          " dimensions, got ", t.ndim, " (shape ", shape_string(t), ")");
}

void check_dtype(const char* op, const char* name, const TensorView& t,
                 std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (t.dtype == d) return;
  std::string expected;
  for (DType d : allowed) expected += (expected.empty() ? "" : " or ") + std::string(dtype_name(d));
  fail(ErrorCode::kInvalidArgument,
       str_cat(op, ": ", name, " must have dtype ", expected, ", got ", dtype_name(t.dtype)));
}

void check_size(const char* op, const char* name, const TensorView& t, int dim, int64_t expected) {
  require(t.size(dim) == expected, ErrorCode::kInvalidArgument, op, ": ", name, ".shape[", dim,
          "] must equal ", expected, ", got ", t.size(dim), " (shape ", shape_string(t), ")");
}

void check_min_size(const char* op, const char* name, const TensorView& t, int dim,
                    int64_t minimum) {
  require(t.size(dim) >= minimum, ErrorCode::kInvalidArgument, op, ": ", name, ".shape[", dim,
          "] must be at least ", minimum, ", got ", t.size(dim), " (shape ", shape_string(t), ")");
}

void check_size_matches(const char* op, const char* name, const TensorView& t, int dim,
                        const char* ref_name, const TensorView& ref, int ref_dim,
                        const char* what) {
  require(t.size(dim) == ref.size(ref_dim), ErrorCode::kInvalidArgument, op, ": ", name, ".shape[",
          dim, "] must equal ", ref_name, ".shape[", ref_dim, "] (", what,
          ") = ", ref.size(ref_dim), ", got ", t.size(dim), " (shape ", shape_string(t), ")");
}

void check_inner_contiguous(const char* op, const char* name, const TensorView& t) {
  require(t.ndim == 0 || t.numel() == 0 || t.shape[t.ndim - 1] <= 1 || t.strides[t.ndim - 1] == 1,
          ErrorCode::kInvalidArgument, op, ": ", name,
          " must be contiguous in its last dimension, got stride ",
          t.ndim ? t.strides[t.ndim - 1] : 0);
}

void check_contiguous(const char* op, const char* name, const TensorView& t) {
  require(t.is_contiguous(), ErrorCode::kInvalidArgument, op, ": ", name,
          " must be contiguous, got ", view_text(t), " with non-dense strides");
}

void check_storage(const char* op, const char* name, const TensorView& t) {
  require(t.ndim >= 0 && t.ndim <= kMaxDims, ErrorCode::kInvalidArgument, op, ": ", name,
          " has an invalid rank ", t.ndim);
  for (int d = 0; d < t.ndim; ++d) {
    require(t.shape[d] >= 0, ErrorCode::kInvalidArgument, op, ": ", name,
            " must have non-negative sizes, got ", shape_string(t));
    require(t.strides[d] >= 0, ErrorCode::kInvalidArgument, op, ": ", name,
            " must have non-negative strides, got stride ", t.strides[d], " in dimension ", d);
  }
  const int64_t count = t.numel();
  if (count > 0) {
    // Every element offset (and its byte offset) must be representable: the kernels index with
    // int64 arithmetic. numel() saturates at INT64_MAX when the element count overflows.
    bool overflow = count == std::numeric_limits<int64_t>::max();
    int64_t last = 0, reach = 0, bytes = 0;
    for (int d = 0; d < t.ndim; ++d) {
      overflow = overflow || __builtin_mul_overflow(t.shape[d] - 1, t.strides[d], &reach) ||
                 __builtin_add_overflow(last, reach, &last);
    }
    overflow = overflow || __builtin_add_overflow(last, int64_t{1}, &last) ||
               __builtin_mul_overflow(last, t.element_size(), &bytes);
    require(!overflow, ErrorCode::kInvalidArgument, op, ": ", name,
            " spans more than 2^63 bytes (shape ", shape_string(t), ", strides ", strides_string(t),
            ")");
  }
  require(count == 0 || t.data != nullptr, ErrorCode::kInvalidArgument, op, ": ", name,
          " has no data pointer but ", count, " elements");
}

void check_device(const char* op, const char* name, const TensorView& t, Device expected) {
  require(t.device == expected, ErrorCode::kInvalidArgument, op, ": ", name, " must be on ",
          device_text(expected), ", got ", device_text(t.device));
}

void check_float_activation(const char* op, const char* name, const TensorView& t) {
  check_dtype(op, name, t, {DType::kF32, DType::kF16, DType::kBF16});
}

void check_positive_finite(const char* op, const char* name, float value) {
  require(std::isfinite(value) && value > 0.0f, ErrorCode::kInvalidArgument, op, ": ", name,
          " must be finite and > 0, got ", value);
}

namespace {

// A scale tensor's checks; `count_ok` says whether its shape holds the values the op takes,
// `expected` describes them.
void check_scale_view(const char* op, const char* name, const TensorView& t, Device device,
                      bool (*count_ok)(const TensorView&, int64_t), int64_t batch,
                      const std::string& expected) {
  check_storage(op, name, t);
  check_dtype(op, name, t, {DType::kF32});
  require(count_ok(t, batch), ErrorCode::kInvalidArgument, op, ": ", name, " must have ", expected,
          ", got shape ", shape_string(t));
  check_device(op, name, t, device);
  // 4: the f32 load the kernels issue needs its natural alignment.
  require(reinterpret_cast<uintptr_t>(t.data) % 4 == 0, ErrorCode::kInvalidArgument, op, ": ", name,
          " data must be 4-byte aligned (an f32 element)");
}

}  // namespace

void check_scale_tensor(const char* op, const char* name, const TensorView& t, Device device) {
  check_scale_view(
      op, name, t, device, [](const TensorView& v, int64_t) { return v.numel() == 1; }, 0,
      "exactly one element");
}

void check_request_scale_tensor(const char* op, const char* name, const TensorView& t,
                                Device device, int64_t batch) {
  check_scale_view(
      op, name, t, device,
      [](const TensorView& v, int64_t b) {
        return v.numel() == 1 || (v.ndim == 1 && v.shape[0] == b);
      },
      batch, str_cat("exactly one element or the shape [B] = [", batch, "] (one per request)"));
}

float host_scale_value(const TensorView& t) {
  float value = 0.0f;
  std::memcpy(&value, t.data, sizeof(value));
  return value;
}

bool views_overlap(const TensorView& a, const TensorView& b) {
  // Byte ranges as integers. A view not validated yet (null data, a negative or overflowing
  // extent) touches nothing here, as an empty one does: its own check reports it.
  auto range = [](const TensorView& t, uintptr_t* first, uintptr_t* last) {
    *first = *last = reinterpret_cast<uintptr_t>(t.data);
    if (t.data == nullptr || t.ndim < 0 || t.ndim > kMaxDims || t.numel() <= 0) return;
    int64_t last_elem = 0;
    for (int d = 0; d < t.ndim; ++d) {
      int64_t step = 0;
      if (t.shape[d] < 1 || t.strides[d] < 0 ||
          __builtin_mul_overflow(t.shape[d] - 1, t.strides[d], &step) ||
          __builtin_add_overflow(last_elem, step, &last_elem)) {
        return;
      }
    }
    int64_t bytes = 0;
    if (__builtin_mul_overflow(last_elem + 1, static_cast<int64_t>(t.element_size()), &bytes)) {
      return;
    }
    *last += static_cast<uintptr_t>(bytes);
  };
  uintptr_t a0, a1, b0, b1;
  range(a, &a0, &a1);
  range(b, &b0, &b1);
  return a0 < b1 && b0 < a1;
}

void check_scale_apart(const char* op, const TensorView& scale, const char* name,
                       const TensorView& written, const char* scale_name) {
  require(!views_overlap(scale, written), ErrorCode::kInvalidArgument, op, ": ", scale_name,
          " must not overlap ", name);
}

}  // namespace mlakit::detail

namespace mlakit::detail {

Device common_device(const char* op, std::initializer_list<NamedTensor> tensors) {
  if (tensors.size() == 0) return Device::cpu();
  const NamedTensor& first = *tensors.begin();
  for (const NamedTensor& t : tensors) {
    require(t.tensor->device == first.tensor->device, ErrorCode::kInvalidArgument, op, ": ", t.name,
            " is on ", device_text(t.tensor->device), " but ", first.name, " is on ",
            device_text(first.tensor->device), "; all tensors must be on one device");
  }
  return first.tensor->device;
}

bool has_unique_addresses(const TensorView& t) {
  if (t.data == nullptr || t.ndim < 0 || t.ndim > kMaxDims || t.numel() <= 0) return true;
  std::array<int, kMaxDims> dims{};
  int count = 0;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.strides[d] < 0) return true;  // check_storage's to report
    if (t.shape[d] > 1) dims[count++] = d;
  }
  for (int i = 1; i < count; ++i)  // insertion sort by stride (at most kMaxDims entries)
    for (int j = i; j > 0 && t.strides[dims[j]] < t.strides[dims[j - 1]]; --j)
      std::swap(dims[j], dims[j - 1]);
  int64_t max_offset = -1;  // the last offset the smaller dimensions reach (-1: none yet)
  for (int i = 0; i < count; ++i) {
    const int d = dims[i];
    if (t.strides[d] == 0 || t.strides[d] <= max_offset) return false;
    int64_t step = 0;
    if (__builtin_mul_overflow(t.shape[d] - 1, t.strides[d], &step) ||
        __builtin_add_overflow(std::max<int64_t>(max_offset, 0), step, &max_offset)) {
      return true;  // an extent past int64: check_storage's to report
    }
  }
  return true;
}

void check_no_self_overlap(const char* op, const char* name, const TensorView& t) {
  require(has_unique_addresses(t), ErrorCode::kInvalidArgument, op, ": ", name,
          " must not overlap itself (each output element needs its own storage), got shape ",
          shape_string(t), " with strides ", strides_string(t));
}

void check_outputs_apart(const char* op, std::initializer_list<NamedTensor> outputs,
                         std::initializer_list<NamedTensor> inputs) {
  auto apart = [&](const NamedTensor& out, const NamedTensor& other) {
    require(out.tensor == nullptr || other.tensor == nullptr ||
                !views_overlap(*out.tensor, *other.tensor),
            ErrorCode::kInvalidArgument, op, ": ", out.name, " must not overlap ", other.name);
  };
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    if (o->tensor != nullptr) check_no_self_overlap(op, o->name, *o->tensor);
    for (auto other = o + 1; other != outputs.end(); ++other) apart(*o, *other);
    for (const NamedTensor& in : inputs) apart(*o, in);
  }
}

void unsupported_device(const char* op, Device device) {
#ifdef MLAKIT_WITH_CUDA
  const char* why = " (the CUDA backend does not implement this op yet)";
#else
  const char* why = " (mlakit was built without CUDA)";  // a CPU-only build has no CUDA backend
#endif
  fail(ErrorCode::kUnsupported, str_cat(op, ": no kernel for ", device_name(device),
                                        " in this build", device.is_cuda() ? why : ""));
}

}  // namespace mlakit::detail
