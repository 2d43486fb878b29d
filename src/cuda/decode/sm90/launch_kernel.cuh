// Launch of one mma.sync decode configuration (kernel.cuh): raises its dynamic shared-memory limit
// and launches it on the grid the launcher computed, overlapped with the stream's previous kernel
// (launch.cuh). Compiled once per configuration in instantiations/*.cu.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/launch.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda/decode/sm90/instantiations.cuh"
#include "cuda/decode/sm90/kernel.cuh"

namespace mlakit::cuda::decode_sm90 {

template <class Cfg, class Kernel>
void launch_with_smem(Kernel kernel, const DecodeKernelParams& params, dim3 grid,
                      cudaStream_t stream) {
  set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes, "mla_decode");
  launch_kernel_overlapped("mla_decode", "mla_decode_sm90_kernel", kernel, grid, dim3(kThreads),
                           Cfg::kSmemBytes, stream, params);
}

template <class Cfg>
void launch_decode_kernel(const DecodeKernelParams& params, dim3 grid, cudaStream_t stream) {
  launch_with_smem<Cfg>(&mla_decode_sm90_kernel<Cfg>, params, grid, stream);
}

}  // namespace mlakit::cuda::decode_sm90
