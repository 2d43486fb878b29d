#include "mlakit/types.hpp"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/check.hpp"
#include "core/device_memory.hpp"

namespace mlakit {

using detail::fail;
using detail::require;

std::string device_name(Device device) {
  return device.is_cpu() ? std::string("cpu") : detail::str_cat("cuda:", device.index);
}

namespace {
int normalize_dim(const TensorView& t, int dim) {
  const int d = dim < 0 ? dim + t.ndim : dim;
  require(d >= 0 && d < t.ndim, ErrorCode::kInvalidArgument, "dimension ", dim,
          " is out of range for a tensor of rank ", t.ndim);
  return d;
}

TensorView make_dense(void* data, DType dtype, std::span<const int64_t> shape, Device device) {
  require(shape.size() <= static_cast<size_t>(kMaxDims), ErrorCode::kInvalidArgument,
          "tensors have at most ", kMaxDims, " dimensions, got ", shape.size());
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    require(shape[d] >= 0, ErrorCode::kInvalidArgument, "tensor sizes must be >= 0, got ",
            shape[d]);
    t.shape[d] = shape[d];
    t.strides[d] = stride;
    // Saturates on overflow: only a view without elements, or one check_storage rejects (its
    // extent overflows), can have such sizes; the product must not wrap (undefined behaviour).
    if (__builtin_mul_overflow(stride, shape[d], &stride))
      stride = std::numeric_limits<int64_t>::max();
  }
  return t;
}
}  // namespace

TensorView TensorView::contiguous(void* data, DType dtype, std::span<const int64_t> shape,
                                  Device device) {
  return make_dense(data, dtype, shape, device);
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  return make_dense(data, dtype, std::span<const int64_t>(shape.begin(), shape.size()), device);
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> strides, Device device) {
  require(shape.size() == strides.size(), ErrorCode::kInvalidArgument,
          "shape and strides must have the same rank, got ", shape.size(), " and ", strides.size());
  TensorView t = contiguous(data, dtype, shape, device);
  int d = 0;
  for (int64_t s : strides) t.strides[d++] = s;
  return t;
}

int64_t TensorView::size(int dim) const { return shape[normalize_dim(*this, dim)]; }
int64_t TensorView::stride(int dim) const { return strides[normalize_dim(*this, dim)]; }

int64_t TensorView::numel() const {
  for (int d = 0; d < ndim; ++d)
    if (shape[d] == 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    // No tensor has 2^63 elements: a count that overflows saturates, and check_storage rejects it.
    if (__builtin_mul_overflow(n, shape[d], &n)) return std::numeric_limits<int64_t>::max();
  }
  return n;
}

bool TensorView::is_contiguous() const {
  // A view without elements reads nothing, whatever its strides (NumPy 2 gives a zero-size
  // array zero strides).
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    if (__builtin_mul_overflow(expected, shape[d], &expected)) return false;
  }
  return true;
}

TensorView TensorView::narrow(int dim, int64_t start, int64_t length) const {
  const int d = normalize_dim(*this, dim);
  // length <= size - start: start + length could wrap past int64 and pass.
  require(start >= 0 && length >= 0 && start <= shape[d] && length <= shape[d] - start,
          ErrorCode::kInvalidArgument, "narrow(", dim, ", ", start, ", ", length,
          ") is out of range for size ", shape[d]);
  TensorView t = *this;
  // A view without a data pointer keeps none: NULL + offset would be a small non-NULL address that
  // the ops' "no data pointer" check lets through.
  if (length > 0 && data != nullptr) t.data = element_ptr(start * strides[d]);
  t.shape[d] = length;
  return t;
}

TensorView TensorView::transpose(int dim0, int dim1) const {
  const int a = normalize_dim(*this, dim0);
  const int b = normalize_dim(*this, dim1);
  TensorView t = *this;
  std::swap(t.shape[a], t.shape[b]);
  std::swap(t.strides[a], t.strides[b]);
  return t;
}

TensorView TensorView::reshape(std::initializer_list<int64_t> new_shape) const {
  require(is_contiguous(), ErrorCode::kInvalidArgument, "reshape needs a contiguous tensor, got ",
          detail::view_text(*this));
  TensorView t = contiguous(data, dtype, new_shape, device);
  require(t.numel() == numel(), ErrorCode::kInvalidArgument, "reshape of ",
          detail::view_text(*this), " to ", detail::shape_string(t), " changes the element count");
  return t;
}

TensorView TensorView::with_dtype(DType new_dtype) const {
  require(dtype_size(new_dtype) == dtype_size(dtype), ErrorCode::kInvalidArgument,
          "with_dtype: ", dtype_name(dtype), " and ", dtype_name(new_dtype),
          " differ in element size");
  TensorView t = *this;
  t.dtype = new_dtype;
  return t;
}

std::string TensorView::to_string() const { return detail::str_cat(detail::view_text(*this)); }

Tensor Tensor::empty(std::span<const int64_t> shape, DType dtype, Device device) {
  Tensor t;
  t.view_ = make_dense(nullptr, dtype, shape, device);
  int64_t bytes = 0;  // numel() saturates at INT64_MAX when the element count overflows
  require(t.view_.numel() < std::numeric_limits<int64_t>::max() &&
              !__builtin_mul_overflow(t.view_.numel(), int64_t{dtype_size(dtype)}, &bytes),
          ErrorCode::kInvalidArgument, "Tensor::empty: shape ", detail::shape_string(t.view_),
          " of ", dtype_name(dtype), " needs more than 2^63 bytes");
  if (bytes == 0) return t;
  if (device.is_cpu()) {
    constexpr size_t kAlignment = 64;  // one cache line; also enough for any SIMD load
    const size_t rounded = (static_cast<size_t>(bytes) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    require(p != nullptr, ErrorCode::kBackend, "host allocation of ", bytes, " bytes failed");
    t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  } else {
    void* p = detail::device_malloc(device, bytes);
    t.storage_ = std::shared_ptr<void>(p, [device](void* q) { detail::device_free(device, q); });
  }
  t.view_.data = t.storage_.get();
  return t;
}

Tensor Tensor::empty(std::initializer_list<int64_t> shape, DType dtype, Device device) {
  return empty(std::span<const int64_t>(shape.begin(), shape.size()), dtype, device);
}

Tensor Tensor::zeros(std::initializer_list<int64_t> shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  const int64_t bytes = t.numel() * dtype_size(dtype);
  if (bytes == 0) return t;
  if (device.is_cpu()) {
    std::memset(t.view_.data, 0, static_cast<size_t>(bytes));
  } else {
    detail::device_memset_zero(device, t.view_.data, bytes);
  }
  return t;
}

}  // namespace mlakit
