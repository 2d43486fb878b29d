// cuBLAS state for batched_matmul, one per (device, stream): a cuBLAS handle bound to the stream,
// a cuBLASLt handle with its plan cache, their shared 32 MiB workspace, and a scratch buffer for
// mixed-dtype calls (docs/kernels/gemm_cuda.md).
//
// Keyed by stream, not by thread: the workspace and the scratch are stream-ordered memory, so two
// streams sharing them could race, while calls on one stream are ordered anyway. A mutex per
// context serializes host threads that enqueue on the same stream.
//
// Everything here is allocated at the first call on a (device, stream) and when the scratch must
// grow; both must happen outside CUDA-graph capture (a capturing call that would allocate throws
// and says so). Contexts live until the process ends (never freed: CUDA may already be shut down
// when static destructors run).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "cuda/gemm/lt_matmul.hpp"
#include "mlakit/types.hpp"

namespace mlakit::cuda {

// cuBLAS's recommended workspace on Hopper (cublasSetWorkspace documentation): 32 MiB.
inline constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

struct CublasContext {
  std::mutex mutex;                 // held for a whole batched_matmul call
  cublasHandle_t handle = nullptr;  // cublasGemmStridedBatchedEx: problems cuBLASLt has no plan for
  cublasLtHandle_t lt = nullptr;
  LtPlanCache lt_plans;
  void* workspace = nullptr;  // kCublasWorkspaceBytes, used by both handles (stream-ordered)
  void* scratch = nullptr;
  int64_t scratch_bytes = 0;
};

// The context of (current device, stream), created on first use. `op` names the caller in errors.
CublasContext& cublas_context(cudaStream_t stream, const char* op);

// Makes ctx.scratch hold at least `bytes`. Growing frees the old buffer (cudaFree waits for the
// device) and allocates a new one; throws kUnsupported instead when the stream is capturing.
void reserve_scratch(CublasContext& ctx, int64_t bytes, cudaStream_t stream, const char* op);

// Creates the context of (device, stream) if it does not exist yet (outside graph capture).
void prepare_cublas(Device device, cudaStream_t stream, const char* op);

// Throws mlakit::Error(kBackend) "<op>: <what> failed: <cuBLAS status>" unless success.
void check_cublas(cublasStatus_t status, const char* op, const char* what);

}  // namespace mlakit::cuda
