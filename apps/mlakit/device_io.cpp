#include "device_io.hpp"

#include <cstring>
#include <string>

#include "mlakit/error.hpp"

#if defined(MLAKIT_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace mlakit::cli {

namespace {

#if !defined(MLAKIT_WITH_CUDA)
[[noreturn]] void no_cuda(Device device) {
  throw Error(ErrorCode::kUnsupported,
              "cannot use " + device_name(device) + ": mlakit was built without CUDA");
}
#endif

}  // namespace

#if defined(MLAKIT_WITH_CUDA)
void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(ErrorCode::kBackend, std::string(what) + ": " + cudaGetErrorString(status));
  }
}
#endif

void copy_to_device(const TensorView& dst, const void* src, int64_t bytes) {
  if (bytes == 0) return;
  if (dst.device.is_cpu()) {
    std::memcpy(dst.data, src, static_cast<size_t>(bytes));
    return;
  }
#if defined(MLAKIT_WITH_CUDA)
  check_cuda(cudaMemcpy(dst.data, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice),
             "cudaMemcpy host to device");
#else
  no_cuda(dst.device);
#endif
}

void copy_to_host(void* dst, const TensorView& src, int64_t bytes) {
  if (bytes == 0) return;
  if (src.device.is_cpu()) {
    std::memcpy(dst, src.data, static_cast<size_t>(bytes));
    return;
  }
#if defined(MLAKIT_WITH_CUDA)
  check_cuda(cudaMemcpy(dst, src.data, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost),
             "cudaMemcpy device to host");
#else
  no_cuda(src.device);
#endif
}

void synchronize(Device device) {
  if (device.is_cpu()) return;
#if defined(MLAKIT_WITH_CUDA)
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#else
  no_cuda(device);
#endif
}

std::optional<double> device_free_bytes([[maybe_unused]] Device device) {
#if defined(MLAKIT_WITH_CUDA)
  if (!device.is_cuda()) return std::nullopt;
  size_t free = 0, total = 0;
  if (cudaSetDevice(device.index) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();  // clear the error, so that the run's own first CUDA call reports its own
    return std::nullopt;
  }
  return static_cast<double>(free);
#else
  return std::nullopt;
#endif
}

}  // namespace mlakit::cli
