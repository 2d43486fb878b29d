// Single-threaded f32 GEMM on the calling thread, through OpenBLAS's OpenMP build. The CPU kernels
// spread GEMMs over the pool's threads themselves (one call per tile, several threads at once), so
// each call must run on its calling thread, start no threads and change no process-wide setting
// (docs/kernels/gemm_cpu.md, "Which OpenBLAS build").
#pragma once

#include <cstdint>
#include <string_view>

namespace mlakit::cpu {

enum class MatrixLayout { kRowMajor, kColMajor };

// c = alpha * op(a) @ op(b) + beta * c, as cblas_sgemm: every matrix in `layout` with leading
// dimension ld*; op(a) is [m, k], op(b) [k, n], c [m, n]; op(x) = x^T when trans_x. With beta 0,
// c is only written (NaN in c does not propagate). Sizes and leading dimensions fit in int32 (the
// callers' validation). OpenBLAS runs it on one thread: the calling thread's OpenMP thread count is
// 1 during the call and restored after (a per-thread setting; no other thread sees it).
void sgemm(MatrixLayout layout, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
           float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
           float* c, int64_t ldc);

// Throws mlakit::Error (kBackend) naming `op` unless the OpenBLAS this process loaded can serve
// sgemm from several threads at once, each call on its own thread: its OpenMP build, or its
// pthreads build set to one thread by the host. Another libopenblas.so.0 loaded first (the three
// Debian builds share that name) takes the place of the one mlakit was linked with; this check
// says so instead of giving wrong results (serial build) or oversubscribed cores (pthreads).
void require_per_thread_blas(std::string_view op);

}  // namespace mlakit::cpu
