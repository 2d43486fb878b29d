// Single-threaded f32 GEMM on the calling thread: the CPU kernels spread GEMMs over the pool's
// threads themselves (one call per tile), so each call must neither start threads of its own nor
// change process-wide settings of a BLAS library the host program may also use. Eigen's GEMM
// (header-only, compiled into mlakit with no threading) does neither.
#pragma once

#include <cstdint>

namespace mlakit::cpu {

enum class MatrixLayout { kRowMajor, kColMajor };

// c = alpha * op(a) @ op(b) + beta * c, as cblas_sgemm: every matrix in `layout` with leading
// dimension ld*; op(a) is [m, k], op(b) [k, n], c [m, n]; op(x) = x^T when trans_x. With beta 0,
// c is only written (NaN in c does not propagate).
void sgemm(MatrixLayout layout, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
           float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
           float* c, int64_t ldc);

}  // namespace mlakit::cpu
