// CPU batched GEMM through a single-threaded sgemm per tile (cpu/sgemm.hpp,
// docs/kernels/gemm_cpu.md).
#pragma once

#include "ops/matmul.hpp"

namespace mlakit::cpu {

// c[b] = a[b] @ w[b] for a problem validated by detail::describe_batched_matmul. f32 operands go
// to sgemm in place; f16/bf16 operands are widened to f32 first (exactly) and a 16-bit c is
// rounded from the f32 result (nearest-even). Work is spread over the pool's threads in tiles of
// c, each one single-threaded sgemm call; no process-wide setting is changed.
void batched_gemm(const detail::BatchedGemm& gemm);

}  // namespace mlakit::cpu
