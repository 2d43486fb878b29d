// Host <-> device copies and synchronization for `mlakit run --device cuda`. The public mlakit API
// has no copy operation, so a CUDA build uses the CUDA runtime directly; a CPU build reaches
// here only with host tensors (allocating a CUDA tensor already failed with a clear error).
#pragma once

#include <cstdint>
#include <optional>

#include "mlakit/types.hpp"

#if defined(MLAKIT_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace mlakit::cli {

#if defined(MLAKIT_WITH_CUDA)
// Throws mlakit::Error(kBackend) "<what>: <CUDA message>" unless success.
void check_cuda(cudaError_t status, const char* what);
#endif

// Copies `bytes` from host memory `src` to the start of `dst` (host or device).
void copy_to_device(const TensorView& dst, const void* src, int64_t bytes);
// Copies `bytes` from the start of `src` (host or device) to host memory `dst`.
void copy_to_host(void* dst, const TensorView& src, int64_t bytes);
// Waits until the device finished its queued work (no-op on the CPU).
void synchronize(Device device);
// Free memory of a CUDA device in bytes (cudaMemGetInfo); nullopt for the CPU, in a CPU-only
// build, or when the query fails (the run's own allocation then reports the problem).
std::optional<double> device_free_bytes(Device device);

}  // namespace mlakit::cli
