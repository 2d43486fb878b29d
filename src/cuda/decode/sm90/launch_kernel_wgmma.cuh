// Launch of the wgmma decode configuration (kernel_wgmma.cuh), like launch_kernel.cuh's; only the
// native-cache instantiation files include it (CuTe headers stay out of the fp8 ones).
#pragma once

#include <cuda_runtime.h>

#include "cuda/decode/sm90/instantiations.cuh"
#include "cuda/decode/sm90/kernel_wgmma.cuh"
#include "cuda/decode/sm90/launch_kernel.cuh"

namespace mlakit::cuda::decode_sm90 {

template <class Cfg>
void launch_decode_wgmma_kernel(const DecodeKernelParams& params, dim3 grid, cudaStream_t stream) {
  launch_with_smem<Cfg>(&mla_decode_sm90_wgmma_kernel<Cfg>, params, grid, stream);
}

}  // namespace mlakit::cuda::decode_sm90
