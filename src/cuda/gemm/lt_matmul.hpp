// batched_matmul through cuBLASLt with a plan per problem (docs/kernels/gemm_cuda.md, "Plans"):
// the matmul descriptor, the three matrix layouts and the heuristic's algorithm are made once per
// (sizes, types, transposes, leading dimensions, batch strides, address alignment) and kept, so a
// repeated call costs a hash lookup and one cublasLtMatmul: no heuristic query, no allocation.
#pragma once

#include <cublasLt.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "cuda/gemm/column_major_gemm.hpp"

namespace mlakit::cuda {

// Everything of a ColumnMajorGemm that the algorithm choice depends on (lt_plan_key).
using LtPlanKey = std::array<int64_t, 18>;

struct LtPlanKeyHash {
  size_t operator()(const LtPlanKey& key) const;
};

// cuBLASLt's descriptors of one problem, initialized where they live (cuBLASLt's in-place form),
// and the algorithm its heuristic chose for them.
struct LtPlan {
  cublasLtMatmulDescOpaque_t desc;
  cublasLtMatrixLayoutOpaque_t a_layout;
  cublasLtMatrixLayoutOpaque_t b_layout;
  cublasLtMatrixLayoutOpaque_t d_layout;  // also C's (beta = 0: C is not read)
  cublasLtMatmulAlgo_t algo;
  bool has_algo = false;  // false: cuBLASLt offered none for this problem
};

// The plans of one cuBLAS context (one device and stream; its mutex guards the cache).
class LtPlanCache {
 public:
  // The plan of `gemm` for at most `workspace_bytes` of workspace; made on first use (one
  // heuristic query: host work only, so safe during graph capture). Holds at most kMaxPlans;
  // a full cache is emptied before the next plan is made.
  LtPlan& plan(cublasLtHandle_t handle, const ColumnMajorGemm& gemm, size_t workspace_bytes,
               const char* op);
  size_t size() const { return plans_.size(); }

  // Why 1024: an engine's distinct GEMM problems are its decode token counts (<= max_num_seqs x
  // decode_threshold values, for two GEMMs) and, for the up-projections, its prefill row counts;
  // 1024 plans of ~0.5 KiB cover a serving run's working set in 0.5 MiB. Beyond it, a rare shape
  // re-plans (one heuristic query, tens of microseconds) instead of growing the cache unbounded.
  static constexpr size_t kMaxPlans = 1024;

 private:
  std::unordered_map<LtPlanKey, LtPlan, LtPlanKeyHash> plans_;
};

// Runs `gemm` with cuBLASLt on `stream` using its cached plan and `workspace` (workspace_bytes,
// stream-ordered, never allocated here). Returns false, running nothing, when cuBLASLt has no
// algorithm for the problem (the caller then uses cublasGemmStridedBatchedEx).
bool lt_matmul(cublasLtHandle_t handle, LtPlanCache& cache, const ColumnMajorGemm& gemm,
               void* workspace, size_t workspace_bytes, cudaStream_t stream, const char* op);

}  // namespace mlakit::cuda
