#include "cuda/common/runtime.hpp"

#include <algorithm>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/check.hpp"

namespace mlakit::cuda {

namespace {

// The device the innermost live DeviceGuard of this thread made current; -1 outside every guard.
thread_local int t_guarded_device = -1;

// For error messages: never throws (-1 when even cudaGetDevice fails).
int device_for_message() {
  if (t_guarded_device >= 0) return t_guarded_device;
  int device = -1;
  cudaGetDevice(&device);
  return device;
}

}  // namespace

void check_cuda(cudaError_t status, const char* op, const char* what) {
  if (status == cudaSuccess) return;
  detail::fail(ErrorCode::kBackend,
               detail::str_cat(op, ": ", what, " failed on cuda:", device_for_message(), ": ",
                               cudaGetErrorString(status)));
}

void check_launch(const char* op, const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return;
  detail::fail(ErrorCode::kBackend,
               detail::str_cat(op, ": launch of ", kernel, " failed on cuda:", device_for_message(),
                               ": ", cudaGetErrorString(status)));
}

void fail_launch(const char* op, const char* kernel, cudaError_t status) {
  cudaGetLastError();
  detail::fail(ErrorCode::kBackend,
               detail::str_cat(op, ": launch of ", kernel, " failed on cuda:", device_for_message(),
                               ": ", cudaGetErrorString(status)));
}

bool is_capturing(cudaStream_t stream, const char* op) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &status), op, "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

int current_device(const char* op) {
  if (t_guarded_device >= 0) return t_guarded_device;
  int device = 0;
  check_cuda(cudaGetDevice(&device), op, "cudaGetDevice");
  return device;
}

DeviceGuard::DeviceGuard(Device device, const char* op) : outer_guarded_(t_guarded_device) {
  detail::require(device.is_cuda(), ErrorCode::kInternal, op, ": DeviceGuard for ",
                  detail::device_text(device));
  previous_ = current_device(op);
  if (previous_ != device.index) {
    check_cuda(cudaSetDevice(device.index), op, "cudaSetDevice");
    switched_ = true;
  }
  t_guarded_device = device.index;
}

DeviceGuard::~DeviceGuard() {
  if (switched_) cudaSetDevice(previous_);
  t_guarded_device = outer_guarded_;
}

void set_max_dynamic_smem(const void* kernel, int bytes, const char* op) {
  static std::mutex mutex;
  static std::vector<std::tuple<const void*, int, int>> done;  // (kernel, device, bytes)
  const int device = current_device(op);
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& [k, d, b] : done) {
    if (k == kernel && d == device && b >= bytes) return;
  }
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), op,
             "cudaFuncSetAttribute(max dynamic shared memory)");
  done.emplace_back(kernel, device, bytes);
}

int multiprocessor_count(const char* op) {
  static std::mutex mutex;
  static std::vector<int> counts;  // by device index; 0 = not read yet
  const int device = current_device(op);
  std::lock_guard<std::mutex> lock(mutex);
  if (device >= static_cast<int>(counts.size())) counts.resize(device + 1, 0);
  if (counts[device] == 0) {
    check_cuda(cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device), op,
               "cudaDeviceGetAttribute(multiprocessor count)");
  }
  return counts[device];
}

int64_t grid_blocks(int64_t items, int64_t items_per_block) {
  const int64_t blocks = (items + items_per_block - 1) / items_per_block;
  return std::clamp<int64_t>(blocks, 1, kMaxGridBlocks);
}

}  // namespace mlakit::cuda
