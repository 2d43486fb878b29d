// The per-configuration launch functions of the sm90 decode: declared here for the launcher,
// defined by launch_kernel.cuh and compiled once each in instantiations/<element>_<format>.cu.
#pragma once

#include <cuda_runtime.h>

#include "cuda/decode/sm90/params.cuh"
#include "cuda/decode/sm90/traits.cuh"

namespace mlakit::cuda::decode_sm90 {

template <class Cfg>
void launch_decode_kernel(const DecodeKernelParams& params, dim3 grid, cudaStream_t stream);

}  // namespace mlakit::cuda::decode_sm90
