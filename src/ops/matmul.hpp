// batched_matmul as the backends see it: the validated problem, with every operand reduced to a
// BLAS matrix description (pointer, row- or column-major, leading dimension, batch stride).
// Built once by describe_batched_matmul (backend-independent validation, src/ops/matmul.cpp) and
// consumed by the CPU kernel (OpenBLAS) and, later, the CUDA one (cuBLAS takes the same fields).
#pragma once

#include <cstdint>

#include "mlakit/types.hpp"

namespace mlakit::detail {

// Matrix b of the operand starts at element b * batch_stride from `data`; its element (r, c) is at
// r * ld + c (row-major) or r + c * ld (column-major, i.e. a transposed row-major matrix).
// ld >= max(1, columns) for row-major and >= max(1, rows) for column-major, as BLAS requires.
struct GemmOperand {
  void* data = nullptr;
  DType dtype = DType::kF32;  // f32, f16 or bf16
  bool col_major = false;
  int64_t ld = 1;
  int64_t batch_stride = 0;
};

// c[b] = a[b] @ w[b] for b < batch. Sizes fit in int32 (the BLAS integer). Every size may be 0.
struct BatchedGemm {
  int64_t batch = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  GemmOperand a;  // [batch, m, k]
  GemmOperand w;  // [batch, k, n]
  GemmOperand c;  // [batch, m, n]; no two (b, r, c) share an element
};

// Validates the arguments of ops::batched_matmul (shapes, dtypes, layouts, storage, one device)
// and describes the problem; throws mlakit::Error naming the argument otherwise.
BatchedGemm describe_batched_matmul(const TensorView& a, const TensorView& w, const TensorView& c);

}  // namespace mlakit::detail
