// The per-input-type entry of the prefill kernel: declared here for launch.cu, defined in
// launch_kernel.cuh and instantiated in instantiations/<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/elements.cuh"
#include "cuda/prefill/params.cuh"
#include "mlakit/dtype.hpp"

namespace mlakit::cuda::prefill {

inline constexpr const char* kPrefillOp = "mla_prefill";

// In: F16 or BF16; out_dtype: f32, f16 or bf16.
template <class In>
void launch_prefill_kernel(const PrefillParams& p, DType out_dtype, cudaStream_t stream);

}  // namespace mlakit::cuda::prefill
