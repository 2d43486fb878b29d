// Devices, streams, the non-owning TensorView and the owning Tensor.
//
// Shapes and strides are in elements (not bytes). A stride may be 0 (broadcast) or larger than the
// dense stride (a slice of a wider tensor). Kernels honour strides unless their documentation says
// a dimension must be contiguous, and then they check it and throw.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "mlakit/dtype.hpp"

namespace mlakit {

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {DeviceType::kCuda, index}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  bool operator==(const Device& o) const {
    return type == o.type && (type == DeviceType::kCpu || index == o.index);
  }
};
std::string device_name(Device device);

// A CUDA stream (cudaStream_t) as an opaque handle; ignored by the CPU backend. nullptr is the
// default stream.
struct Stream {
  void* handle = nullptr;
};

inline constexpr int kMaxDims = 4;  // the deepest tensor MLA needs: q [B, s_q, N, 576]

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device{};
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // elements

  // A dense row-major view.
  static TensorView contiguous(void* data, DType dtype, std::span<const int64_t> shape,
                               Device device = {});
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = {});
  static TensorView strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> strides, Device device = {});

  int64_t size(int dim) const;    // negative dims count from the end
  int64_t stride(int dim) const;  // negative dims count from the end
  int64_t numel() const;
  int64_t element_size() const { return dtype_size(dtype); }
  bool is_contiguous() const;

  template <class T>
  T* data_as() const {
    return static_cast<T*>(data);
  }
  // Address of element `offset` (in elements) from the start.
  void* element_ptr(int64_t offset) const {
    return static_cast<char*>(data) + offset * element_size();
  }

  // Sub-range [start, start + length) of one dimension; shares storage.
  TensorView narrow(int dim, int64_t start, int64_t length) const;
  // Swaps two dimensions; shares storage.
  TensorView transpose(int dim0, int dim1) const;
  // Reinterprets a contiguous view with a new shape of the same element count.
  TensorView reshape(std::initializer_list<int64_t> new_shape) const;
  // Same storage and strides, another element type of the same size (e.g. kU8 <-> kFp8E4m3).
  TensorView with_dtype(DType new_dtype) const;

  std::string to_string() const;  // e.g. "[4, 16, 576] bf16 cpu"
};

// Owning tensor: a TensorView plus shared storage (host memory or, in CUDA builds, device memory).
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(std::span<const int64_t> shape, DType dtype, Device device = {});
  static Tensor empty(std::initializer_list<int64_t> shape, DType dtype, Device device = {});
  // Same as empty() but every byte is zero.
  static Tensor zeros(std::initializer_list<int64_t> shape, DType dtype, Device device = {});

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: a Tensor is usable as a view
  template <class T>
  T* data() const {
    return static_cast<T*>(view_.data);
  }
  int64_t size(int dim) const { return view_.size(dim); }
  int64_t numel() const { return view_.numel(); }
  bool defined() const { return storage_ != nullptr || view_.ndim > 0; }

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

}  // namespace mlakit
