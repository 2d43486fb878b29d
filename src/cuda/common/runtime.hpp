// Host-side helpers every CUDA launcher uses: error checks that name the op and the kernel, the
// current-device guard, the caller's stream, and cached device attributes. Plain C++ (no device
// code), so .cpp files of the backend include it too.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mlakit/types.hpp"

namespace mlakit::cuda {

// Throws mlakit::Error(kBackend) "<op>: <what> failed on cuda:N: <CUDA message>" unless success.
void check_cuda(cudaError_t status, const char* op, const char* what);
// Call right after a <<<...>>> launch: throws kBackend "<op>: launch of <kernel> failed: ..." when
// the launch was refused (bad configuration, no kernel image for this GPU, a sticky error).
void check_launch(const char* op, const char* kernel);
// A launch call returned `status` (launch.cuh): clears the runtime's last error (a later
// check_launch must not report it again) and throws as check_launch does.
[[noreturn]] void fail_launch(const char* op, const char* kernel, cudaError_t status);

inline cudaStream_t as_cuda_stream(Stream stream) {
  return static_cast<cudaStream_t>(stream.handle);
}

// True while `stream` is being captured into a CUDA graph (work must then not allocate or sync).
bool is_capturing(cudaStream_t stream, const char* op);

// Makes `device` current for a scope and restores the caller's device; switches only when needed
// (cudaGetDevice/cudaSetDevice neither synchronize nor break graph capture). While it lives, this
// thread's current_device() is `device` without asking the runtime, and a nested guard costs no
// runtime call either. Code inside a guard's scope must not switch devices but through a guard.
class DeviceGuard {
 public:
  DeviceGuard(Device device, const char* op);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  int outer_guarded_ = -1;  // the enclosing guard's device on this thread, -1 for none
  bool switched_ = false;
};

// The device current on this thread: the innermost live DeviceGuard's (no runtime call), else
// cudaGetDevice's answer. Every per-device lookup of the backend goes through it, so an op that
// holds a guard asks the runtime once per call (docs/perf-notes.md, "Engine path").
int current_device(const char* op);

// Raises `kernel`'s dynamic shared-memory limit to `bytes` on the current device, once per (kernel,
// device): later calls cost a lookup instead of a driver call on every launch. Not a stream
// operation (graph-capture safe).
void set_max_dynamic_smem(const void* kernel, int bytes, const char* op);

// Streaming multiprocessors of the current device (cached per device; read once).
int multiprocessor_count(const char* op);

// Blocks of a grid-stride loop: enough to give each of `items` work items its own slot with
// `items_per_block` per block, capped at kMaxGridBlocks (the loop in the kernel covers the rest);
// at least 1.
int64_t grid_blocks(int64_t items, int64_t items_per_block);
// Why 2^20: with 256 threads a block, 2^28 threads in flight are far beyond what an H200 keeps
// resident (132 SMs x 2048 threads), and the cap keeps grid.x well inside 2^31 - 1.
inline constexpr int64_t kMaxGridBlocks = int64_t{1} << 20;

}  // namespace mlakit::cuda
