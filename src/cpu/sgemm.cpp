#include "cpu/sgemm.hpp"

// Eigen must not start threads of its own (it would with OpenMP; mlakit builds without it).
#define EIGEN_DONT_PARALLELIZE
#include <Eigen/Core>

namespace mlakit::cpu {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using MatrixMap = Eigen::Map<RowMajorMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;

template <class OpA, class OpB>
void multiply(const OpA& op_a, const OpB& op_b, float alpha, float beta, MatrixMap& c) {
  if (beta == 0.0f) {
    c.noalias() = alpha * op_a * op_b;
  } else {
    if (beta != 1.0f) c *= beta;
    c.noalias() += alpha * op_a * op_b;
  }
}

// Row-major c [m, n] = alpha * op(a) @ op(b) + beta * c.
void sgemm_row_major(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                     const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                     int64_t ldc) {
  const ConstMatrixMap a_map(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
  const ConstMatrixMap b_map(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
  MatrixMap c_map(c, m, n, Eigen::OuterStride<>(ldc));
  if (trans_a && trans_b) {
    multiply(a_map.transpose(), b_map.transpose(), alpha, beta, c_map);
  } else if (trans_a) {
    multiply(a_map.transpose(), b_map, alpha, beta, c_map);
  } else if (trans_b) {
    multiply(a_map, b_map.transpose(), alpha, beta, c_map);
  } else {
    multiply(a_map, b_map, alpha, beta, c_map);
  }
}

}  // namespace

void sgemm(MatrixLayout layout, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
           float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
           float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (layout == MatrixLayout::kRowMajor) {
    sgemm_row_major(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    // A column-major matrix is the row-major view of its transpose: c^T = op(b)^T @ op(a)^T.
    sgemm_row_major(trans_b, trans_a, n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
  }
}

}  // namespace mlakit::cpu
