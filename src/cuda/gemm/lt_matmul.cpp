#include "cuda/gemm/lt_matmul.hpp"

#include "cuda/common/alignment.hpp"
#include "cuda/gemm/cublas_context.hpp"

namespace mlakit::cuda {

namespace {

// cuBLASLt's largest (and default) alignment preference: 256 bytes, cudaMalloc's alignment.
constexpr int64_t kMaxAlignment = 256;

int64_t type_bytes(cudaDataType type) { return type == CUDA_R_32F ? 4 : 2; }

// The alignment (power of two, <= 256 bytes) that every matrix of a batch starts on: the base
// address's and, with more than one matrix, the batch stride's in bytes.
int64_t batch_alignment(const void* data, cudaDataType type, int64_t batch_stride, int64_t batch) {
  const uint64_t stride_bytes =
      batch > 1 ? static_cast<uint64_t>(batch_stride * type_bytes(type)) : 0;
  return common_alignment({address(data), stride_bytes}, kMaxAlignment);
}

// Start alignments of the matrices of a, b and d (C is d).
struct Alignments {
  int64_t a = 0;
  int64_t b = 0;
  int64_t d = 0;
};

Alignments alignments(const ColumnMajorGemm& g) {
  return {batch_alignment(g.a.data, g.a.type, g.a.batch_stride, g.batch),
          batch_alignment(g.b.data, g.b.type, g.b.batch_stride, g.batch),
          batch_alignment(g.d, g.d_type, g.batch_stride_d, g.batch)};
}

LtPlanKey lt_plan_key(const ColumnMajorGemm& g, const Alignments& al) {
  return {g.m,
          g.n,
          g.k,
          g.batch,
          g.a.type,
          g.a.op,
          g.a.ld,
          g.a.batch_stride,
          al.a,
          g.b.type,
          g.b.op,
          g.b.ld,
          g.b.batch_stride,
          al.b,
          g.d_type,
          g.ldd,
          g.batch_stride_d,
          al.d};
}

template <class T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, T value,
              const char* op) {
  check_cublas(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)), op,
               "cublasLtMatmulDescSetAttribute");
}

template <class T>
void set_layout(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attribute, T value,
                const char* op) {
  check_cublas(cublasLtMatrixLayoutSetAttribute(layout, attribute, &value, sizeof(value)), op,
               "cublasLtMatrixLayoutSetAttribute");
}

template <class T>
void set_preference(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute,
                    T value, const char* op) {
  check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value)), op,
               "cublasLtMatmulPreferenceSetAttribute");
}

// A stored rows x cols column-major matrix (leading dimension ld), `batch` of them batch_stride
// elements apart.
void init_layout(cublasLtMatrixLayout_t layout, cudaDataType type, int64_t rows, int64_t cols,
                 int64_t ld, int64_t batch, int64_t batch_stride, const char* op) {
  check_cublas(cublasLtMatrixLayoutInit(layout, type, static_cast<uint64_t>(rows),
                                        static_cast<uint64_t>(cols), ld),
               op, "cublasLtMatrixLayoutInit");
  set_layout(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<int32_t>(batch), op);
  set_layout(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, batch_stride, op);
}

// Fills `plan` for `g`: descriptors, then the heuristic's best algorithm for the key's alignments
// and the workspace on offer.
void make_plan(LtPlan& plan, const Alignments& al, cublasLtHandle_t handle,
               const ColumnMajorGemm& g, size_t workspace_bytes, const char* op) {
  // f32 accumulation and f32 alpha/beta for every operand type; f32 operands stay plain f32 (no
  // TF32: that would be CUBLAS_COMPUTE_32F_FAST_TF32).
  check_cublas(cublasLtMatmulDescInit(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), op,
               "cublasLtMatmulDescInit");
  set_desc(&plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(g.a.op), op);
  set_desc(&plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(g.b.op), op);
  init_layout(&plan.a_layout, g.a.type, g.a.rows, g.a.cols, g.a.ld, g.batch, g.a.batch_stride, op);
  init_layout(&plan.b_layout, g.b.type, g.b.rows, g.b.cols, g.b.ld, g.batch, g.b.batch_stride, op);
  init_layout(&plan.d_layout, g.d_type, g.m, g.n, g.ldd, g.batch, g.batch_stride_d, op);

  cublasLtMatmulPreferenceOpaque_t pref;
  check_cublas(cublasLtMatmulPreferenceInit(&pref), op, "cublasLtMatmulPreferenceInit");
  set_preference(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                 static_cast<uint64_t>(workspace_bytes), op);
  // The operands' alignments: algorithms that need more are excluded.
  set_preference(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(al.a),
                 op);
  set_preference(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(al.b),
                 op);
  set_preference(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(al.d),
                 op);
  set_preference(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(al.d),
                 op);

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle, &plan.desc, &plan.a_layout, &plan.b_layout,
                                     &plan.d_layout, &plan.d_layout, &pref, 1, &result, &found);
  plan.has_algo = status == CUBLAS_STATUS_SUCCESS && found > 0 &&
                  result.state == CUBLAS_STATUS_SUCCESS && result.workspaceSize <= workspace_bytes;
  if (plan.has_algo) plan.algo = result.algo;
}

}  // namespace

size_t LtPlanKeyHash::operator()(const LtPlanKey& key) const {
  // FNV-1a over the fields: cheap, and distinct shapes spread well enough for a few hundred keys.
  uint64_t h = 14695981039346656037ull;  // FNV-1a 64-bit offset basis
  for (int64_t v : key) {
    h ^= static_cast<uint64_t>(v);
    h *= 1099511628211ull;  // FNV-1a 64-bit prime
  }
  return static_cast<size_t>(h);
}

LtPlan& LtPlanCache::plan(cublasLtHandle_t handle, const ColumnMajorGemm& gemm,
                          size_t workspace_bytes, const char* op) {
  const Alignments al = alignments(gemm);
  const LtPlanKey key = lt_plan_key(gemm, al);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  if (plans_.size() >= kMaxPlans) plans_.clear();
  auto [it, inserted] = plans_.try_emplace(key);
  try {
    make_plan(it->second, al, handle, gemm, workspace_bytes, op);
  } catch (...) {
    plans_.erase(it);  // no half-made plan stays behind
    throw;
  }
  return it->second;
}

bool lt_matmul(cublasLtHandle_t handle, LtPlanCache& cache, const ColumnMajorGemm& gemm,
               void* workspace, size_t workspace_bytes, cudaStream_t stream, const char* op) {
  LtPlan& plan = cache.plan(handle, gemm, workspace_bytes, op);
  if (!plan.has_algo) return false;
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(cublasLtMatmul(handle, &plan.desc, &alpha, gemm.a.data, &plan.a_layout, gemm.b.data,
                              &plan.b_layout, &beta, gemm.d, &plan.d_layout, gemm.d, &plan.d_layout,
                              &plan.algo, workspace, workspace_bytes, stream),
               op, "cublasLtMatmul");
  return true;
}

}  // namespace mlakit::cuda
