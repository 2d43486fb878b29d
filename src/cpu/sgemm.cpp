#include "cpu/sgemm.hpp"

#include <cblas.h>
#include <omp.h>

#include "core/check.hpp"

namespace mlakit::cpu {
namespace {

// openblas_get_parallel()'s answers (OpenBLAS's cblas.h documents them only as numbers).
constexpr int kSerialBuild = 0;
constexpr int kPthreadsBuild = 1;
constexpr int kOpenMpBuild = 2;

// The OpenMP build sizes a call's team by omp_get_max_threads() of the calling thread (and runs
// alone inside an active parallel region). That count is the calling thread's own (an OpenMP
// internal control variable of its task), so setting it to 1 for the call touches no other thread.
class OneOpenMpThreadOnThisThread {
 public:
  OneOpenMpThreadOnThisThread() : saved_(omp_get_max_threads()) {
    if (saved_ != 1) omp_set_num_threads(1);
  }
  ~OneOpenMpThreadOnThisThread() {
    if (saved_ != 1) omp_set_num_threads(saved_);
  }
  OneOpenMpThreadOnThisThread(const OneOpenMpThreadOnThisThread&) = delete;
  OneOpenMpThreadOnThisThread& operator=(const OneOpenMpThreadOnThisThread&) = delete;

 private:
  int saved_;
};

}  // namespace

void sgemm(MatrixLayout layout, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
           float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
           float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const OneOpenMpThreadOnThisThread one_thread;
  cblas_sgemm(layout == MatrixLayout::kRowMajor ? CblasRowMajor : CblasColMajor,
              trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

void require_per_thread_blas(std::string_view op) {
  const int build = openblas_get_parallel();
  if (build == kOpenMpBuild) return;
  if (build == kPthreadsBuild && openblas_get_num_threads() == 1) return;
  const char* what = build == kSerialBuild ? "the serial build, which is not safe to call from "
                                             "several threads at once"
                     : build == kPthreadsBuild
                         ? "the pthreads build with more than one thread (a process-wide count)"
                         : "a build of unknown threading";
  detail::fail(ErrorCode::kBackend,
               detail::str_cat(op, ": the OpenBLAS loaded in this process (", openblas_get_config(),
                               ") is ", what,
                               "; mlakit's CPU GEMMs need OpenBLAS's OpenMP build, "
                               "as it was linked with. Another libopenblas.so.0 was loaded first: "
                               "load libmlakit_c.so (it carries its own), or set "
                               "OPENBLAS_NUM_THREADS=1 with the pthreads build "
                               "(docs/kernels/gemm_cpu.md)"));
}

}  // namespace mlakit::cpu
