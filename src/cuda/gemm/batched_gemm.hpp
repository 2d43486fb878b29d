// ops::batched_matmul on the GPU through cuBLAS (docs/kernels/gemm_cuda.md).
#pragma once

#include "mlakit/types.hpp"
#include "ops/matmul.hpp"

namespace mlakit::cuda {

// c[b] = a[b] @ w[b] for a problem validated by detail::describe_batched_matmul, on `device`,
// enqueued on `stream` (one cublasGemmStridedBatchedEx, f32 accumulation; no host sync).
//
// Operand types: cuBLAS needs a and w of one type. When they differ, the f32 one is rounded
// (nearest even) to the other's 16-bit type, or, for f16 with bf16, both are widened to f32,
// into a per-(device, stream) scratch buffer; c is written directly when it is f32 or the operand
// type, else through an f32 scratch tile and a rounding copy. The scratch grows (allocates) only
// outside graph capture: run a call once before capturing it.
void batched_gemm(const detail::BatchedGemm& gemm, Device device, Stream stream);

}  // namespace mlakit::cuda
