// Device memory for Tensor in CUDA builds.
#include <cuda_runtime.h>

#include "core/check.hpp"
#include "core/device_memory.hpp"

namespace mlakit::detail {

namespace {
void check_cuda(cudaError_t status, const char* what, Device device) {
  require(status == cudaSuccess, ErrorCode::kBackend, what, " on ", device_text(device),
          " failed: ", cudaGetErrorString(status));
}

// Makes `device` current for the duration of a call and restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device) {
    cudaGetDevice(&previous_);
    check_cuda(cudaSetDevice(device.index), "cudaSetDevice", device);
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};
}  // namespace

void* device_malloc(Device device, int64_t bytes) {
  require(device.is_cuda(), ErrorCode::kInternal, "device_malloc called for ", device_text(device));
  DeviceGuard guard(device);
  void* ptr = nullptr;
  check_cuda(cudaMalloc(&ptr, static_cast<size_t>(bytes)),
             str_cat("cudaMalloc of ", bytes, " bytes").c_str(), device);
  return ptr;
}

void device_free(Device device, void* ptr) noexcept {
  if (ptr == nullptr) return;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device.index);
  cudaFree(ptr);
  cudaSetDevice(previous);
}

void device_memset_zero(Device device, void* ptr, int64_t bytes) {
  DeviceGuard guard(device);
  check_cuda(cudaMemset(ptr, 0, static_cast<size_t>(bytes)), "cudaMemset", device);
}

void device_copy(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes,
                 Stream stream) {
  const Device device = dst_device.is_cuda() ? dst_device : src_device;
  DeviceGuard guard(device);
  check_cuda(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault,
                             static_cast<cudaStream_t>(stream.handle)),
             "cudaMemcpyAsync", device);
}

void* pinned_host_malloc(int64_t bytes) {
  void* ptr = nullptr;
  check_cuda(cudaMallocHost(&ptr, static_cast<size_t>(bytes)),
             str_cat("cudaMallocHost of ", bytes, " bytes").c_str(), Device::cpu());
  return ptr;
}

void pinned_host_free(void* ptr) noexcept {
  if (ptr != nullptr) cudaFreeHost(ptr);
}

void* event_create(Device device) {
  DeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  // Timing off: the event only orders work, and untimed events are cheaper to record and query.
  check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate", device);
  return event;
}

void event_destroy(Device device, void* event) noexcept {
  if (event == nullptr) return;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device.index);
  cudaEventDestroy(static_cast<cudaEvent_t>(event));
  cudaSetDevice(previous);
}

void event_record(Device device, void* event, Stream stream) {
  DeviceGuard guard(device);
  check_cuda(
      cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream.handle)),
      "cudaEventRecord", device);
}

void event_synchronize(void* event) {
  const cudaError_t status = cudaEventSynchronize(static_cast<cudaEvent_t>(event));
  require(status == cudaSuccess, ErrorCode::kBackend,
          "cudaEventSynchronize failed: ", cudaGetErrorString(status));
}

void device_synchronize(Device device) {
  if (!device.is_cuda()) return;
  DeviceGuard guard(device);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", device);
}

}  // namespace mlakit::detail
