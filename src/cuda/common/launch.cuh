// Kernel launches that read their status from the launch call itself (cudaLaunchKernelEx returns
// it), so a launch costs one runtime call instead of two (<<<...>>> plus cudaGetLastError in
// check_launch): docs/perf-notes.md, "Engine path". For .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/common/runtime.hpp"

namespace mlakit::cuda {

namespace launch_internal {
template <class... Params, class... Args>
void launch_kernel_with(bool overlapped, const char* op, const char* name,
                        void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                        cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = overlapped ? 1 : 0;
  const cudaError_t status = cudaLaunchKernelEx(&config, kernel, static_cast<Args&&>(args)...);
  if (status != cudaSuccess) fail_launch(op, name, status);
}
}  // namespace launch_internal

// kernel<<<grid, block, smem_bytes, stream>>>(args...); throws kBackend "<op>: launch of <name>
// failed on cuda:N: <CUDA message>" when the launch is refused (fail_launch).
template <class... Params, class... Args>
void launch_kernel(const char* op, const char* name, void (*kernel)(Params...), dim3 grid,
                   dim3 block, size_t smem_bytes, cudaStream_t stream, Args&&... args) {
  launch_internal::launch_kernel_with(false, op, name, kernel, grid, block, smem_bytes, stream,
                                      static_cast<Args&&>(args)...);
}

// As launch_kernel, as a programmatic dependent launch: the kernel's CTAs may start while the
// stream's previous kernel is finishing (its launch and CTA setup overlap that kernel's tail, also
// inside a CUDA graph). The kernel must call wait_for_prior_grids() (grid_dependency.cuh) before it
// touches global memory.
template <class... Params, class... Args>
void launch_kernel_overlapped(const char* op, const char* name, void (*kernel)(Params...),
                              dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                              Args&&... args) {
  launch_internal::launch_kernel_with(true, op, name, kernel, grid, block, smem_bytes, stream,
                                      static_cast<Args&&>(args)...);
}

}  // namespace mlakit::cuda
