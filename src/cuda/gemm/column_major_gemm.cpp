#include "cuda/gemm/column_major_gemm.hpp"

namespace mlakit::cuda {

namespace {

// Logical matrix x (rows x cols, stored row-major or column-major) as a cuBLAS operand that
// stands for x, or for x^T when `transpose`. cuBLAS sees a row-major matrix as its transpose
// stored column-major (cols x rows).
ColumnMajorOperand operand(const detail::GemmOperand& x, int64_t rows, int64_t cols,
                           bool transpose) {
  ColumnMajorOperand o;
  o.data = x.data;
  o.type = cuda_type(x.dtype);
  o.op = x.col_major != transpose ? CUBLAS_OP_N : CUBLAS_OP_T;
  o.rows = x.col_major ? rows : cols;
  o.cols = x.col_major ? cols : rows;
  o.ld = x.ld;
  o.batch_stride = x.batch_stride;
  return o;
}

}  // namespace

cudaDataType cuda_type(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

ColumnMajorGemm column_major_gemm(const detail::GemmOperand& a, const detail::GemmOperand& w,
                                  const detail::GemmOperand& c, const detail::BatchedGemm& g) {
  ColumnMajorGemm cm;
  cm.k = g.k;
  cm.batch = g.batch;
  if (c.col_major) {  // c = A W
    cm.m = g.m;
    cm.n = g.n;
    cm.a = operand(a, g.m, g.k, /*transpose=*/false);
    cm.b = operand(w, g.k, g.n, /*transpose=*/false);
  } else {  // c^T = W^T A^T
    cm.m = g.n;
    cm.n = g.m;
    cm.a = operand(w, g.k, g.n, /*transpose=*/true);
    cm.b = operand(a, g.m, g.k, /*transpose=*/true);
  }
  cm.d = c.data;
  cm.d_type = cuda_type(c.dtype);
  cm.ldd = c.ld;
  cm.batch_stride_d = c.batch_stride;
  return cm;
}

}  // namespace mlakit::cuda
