// Launch of one decode configuration: raises its dynamic shared-memory limit and launches it on the
// grid the launcher computed. Compiled once per configuration in instantiations/*.cu; the launcher
// checks for errors.
#pragma once

#include <cuda_runtime.h>

#include "cuda/decode/sm90/instantiations.cuh"
#include "cuda/decode/sm90/kernel.cuh"

namespace mlakit::cuda::decode_sm90 {

template <class Cfg>
void launch_decode_kernel(const DecodeKernelParams& params, dim3 grid, cudaStream_t stream) {
  const auto kernel = &mla_decode_sm90_kernel<Cfg>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  kernel<<<grid, kThreads, Cfg::kSmemBytes, stream>>>(params);
}

}  // namespace mlakit::cuda::decode_sm90
