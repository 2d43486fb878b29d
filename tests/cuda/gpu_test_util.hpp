// Helpers of the GPU tests: skipping without a device, moving dense tensors between host and
// device, mirroring a view of a host buffer onto its device copy, and exact comparisons.
//
// The GPU tests run each op twice on the same bytes, once through the CPU backend (verified
// against independent references in tests/cpu) and once through the CUDA backend, and compare
// whole buffers, so untouched padding and poisoned slots are checked too.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "mlakit/dtype.hpp"
#include "mlakit/types.hpp"

namespace mlakit::test {

inline bool has_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// Skips the current test, saying why, on a machine without a CUDA device.
#define MLAKIT_SKIP_WITHOUT_GPU()                                                           \
  do {                                                                                      \
    if (!::mlakit::test::has_gpu())                                                         \
      GTEST_SKIP() << "no CUDA device on this machine (cudaGetDeviceCount failed or is 0)"; \
  } while (0)

inline int64_t storage_bytes(const Tensor& t) { return t.numel() * dtype_size(t.view().dtype); }

// A dense device copy of a dense host tensor.
inline Tensor to_device(const Tensor& host) {
  const TensorView& v = host.view();
  Tensor device =
      Tensor::empty(std::span<const int64_t>(v.shape, v.ndim), v.dtype, Device::cuda(0));
  if (storage_bytes(host) > 0) {
    EXPECT_EQ(cudaMemcpy(device.view().data, v.data, storage_bytes(host), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  return device;
}

// A dense host copy of a dense device tensor (waits for the device).
inline Tensor to_host(const Tensor& device) {
  const TensorView& v = device.view();
  Tensor host = Tensor::empty(std::span<const int64_t>(v.shape, v.ndim), v.dtype);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (storage_bytes(device) > 0) {
    EXPECT_EQ(cudaMemcpy(host.view().data, v.data, storage_bytes(device), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  return host;
}

// The view of `device_storage` that `view` is of `host_storage`: same byte offset, shape, strides.
inline TensorView mirror(const TensorView& view, const Tensor& host_storage,
                         const Tensor& device_storage) {
  TensorView v = view;
  const auto offset =
      static_cast<const char*>(view.data) - static_cast<const char*>(host_storage.view().data);
  v.data = static_cast<char*>(device_storage.view().data) + offset;
  v.device = device_storage.view().device;
  return v;
}

// A host tensor and its device copy, for tests that build views into both.
struct Mirrored {
  Tensor host;
  Tensor device;
  explicit Mirrored(Tensor h) : host(std::move(h)), device(to_device(host)) {}
  TensorView on_device(const TensorView& host_view) const {
    return mirror(host_view, host, device);
  }
};

// Two NaN encodings of a dtype count as equal (GPU arithmetic makes the canonical NaN 0x7fffffff,
// x86 makes 0xffc00000 and keeps payloads); every other value must match bit for bit.
inline bool is_nan_bits(DType dtype, const uint8_t* p) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return std::isnan(load_float(p, dtype, 0));
    case DType::kFp8E4m3:
    case DType::kU8:  // used for fp8 codes only where the caller says so
      return (*p & 0x7f) == 0x7f;
    default:
      return false;
  }
}

// Compares two host buffers of `dtype` elements bit for bit (NaN == NaN when nan_equal), naming
// the first differing element and counting the others.
inline ::testing::AssertionResult same_bits(const Tensor& expected, const Tensor& actual,
                                            bool nan_equal = true) {
  const DType dtype = expected.view().dtype;
  const int64_t elem = dtype_size(dtype), n = expected.numel();
  if (actual.numel() != n || actual.view().dtype != dtype) {
    return ::testing::AssertionFailure() << "buffers differ in size or dtype";
  }
  const auto* e = static_cast<const uint8_t*>(expected.view().data);
  const auto* a = static_cast<const uint8_t*>(actual.view().data);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* ei = e + i * elem;
    const uint8_t* ai = a + i * elem;
    if (std::memcmp(ei, ai, elem) == 0) continue;
    if (nan_equal && is_nan_bits(dtype, ei) && is_nan_bits(dtype, ai)) continue;
    if (first < 0) first = i;
    ++bad;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  auto bits = [&](const uint8_t* p) {
    uint64_t v = 0;
    std::memcpy(&v, p, elem);
    return v;
  };
  return ::testing::AssertionFailure()
         << bad << " of " << n << " " << dtype_name(dtype) << " elements differ; first at element "
         << first << ": expected bits 0x" << std::hex << bits(e + first * elem) << ", got 0x"
         << bits(a + first * elem) << std::dec;
}

}  // namespace mlakit::test
