// CPU batched GEMM through OpenBLAS sgemm (docs/kernels/gemm_cpu.md).
#pragma once

#include "ops/matmul.hpp"

namespace mlakit::cpu {

// c[b] = a[b] @ w[b] for a problem validated by detail::describe_batched_matmul. f32 operands go
// to cblas_sgemm in place; f16/bf16 operands are widened to f32 first (exactly) and a 16-bit c is
// rounded from the f32 result (nearest-even). Work is spread over the OpenMP threads in tiles of
// c, each one single-threaded sgemm call; OpenBLAS itself is set to one thread.
void batched_gemm(const detail::BatchedGemm& gemm);

}  // namespace mlakit::cpu
