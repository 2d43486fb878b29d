// The per-configuration launch functions of the sm90 decode: declared here for the launcher,
// defined by launch_kernel.cuh (mma.sync) and launch_kernel_wgmma.cuh (wgmma), compiled once each
// in instantiations/<element>_<format>.cu.
#pragma once

#include <cuda_runtime.h>

#include "cuda/decode/sm90/params.cuh"
#include "cuda/decode/sm90/traits.cuh"
#include "cuda/decode/sm90/traits_wgmma.cuh"

namespace mlakit::cuda::decode_sm90 {

// Cfg = Config<rows, format, element> (traits.cuh).
template <class Cfg>
void launch_decode_kernel(const DecodeKernelParams& params, dim3 grid, cudaStream_t stream);

// Cfg = WgmmaConfig<element, format> (traits_wgmma.cuh): 64 rows, native, fp8_e4m3 or fp8_ds_mla
// cache.
template <class Cfg>
void launch_decode_wgmma_kernel(const DecodeKernelParams& params, dim3 grid, cudaStream_t stream);

}  // namespace mlakit::cuda::decode_sm90
