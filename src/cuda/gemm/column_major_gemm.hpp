// One batched GEMM in cuBLAS's column-major terms, built once from the row-major-or-transposed
// operands of detail::BatchedGemm and run by either cuBLAS entry (cuBLASLt with a cached plan,
// or cublasGemmStridedBatchedEx): docs/kernels/gemm_cuda.md.
#pragma once

#include <cublas_v2.h>

#include <cstdint>

#include "ops/matmul.hpp"

namespace mlakit::cuda {

// A stored column-major matrix of `rows` x `cols` (leading dimension ld >= rows), used as is
// (CUBLAS_OP_N) or transposed (CUBLAS_OP_T); matrix b of the batch starts batch_stride elements
// after matrix b - 1.
struct ColumnMajorOperand {
  const void* data = nullptr;
  cudaDataType type = CUDA_R_32F;
  cublasOperation_t op = CUBLAS_OP_N;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 1;
  int64_t batch_stride = 0;
};

// d[b] (m x n, column-major, ld ldd) = op(a[b]) (m x k) op(b[b]) (k x n), f32 accumulation.
struct ColumnMajorGemm {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  int64_t batch = 0;
  ColumnMajorOperand a;  // [batch] op(a) m x k
  ColumnMajorOperand b;  // [batch] op(b) k x n
  void* d = nullptr;     // [batch] m x n, ldd apart columns, batch_stride_d apart matrices
  cudaDataType d_type = CUDA_R_32F;
  int64_t ldd = 1;
  int64_t batch_stride_d = 0;
};

cudaDataType cuda_type(DType dtype);

// c = a @ w (per batch index) in column-major terms. A column-major c is A W with each operand
// transposed or not by its own orientation; a row-major c is computed as c^T = W^T A^T (operands
// swapped, m and n swapped). a, w and c are in cuBLAS-supported types (batched_gemm.cpp).
ColumnMajorGemm column_major_gemm(const detail::GemmOperand& a, const detail::GemmOperand& w,
                                  const detail::GemmOperand& c, const detail::BatchedGemm& g);

}  // namespace mlakit::cuda
