#include "cuda/gemm/cublas_context.hpp"

#include <map>
#include <memory>
#include <utility>

#include "core/check.hpp"
#include "cuda/common/runtime.hpp"

namespace mlakit::cuda {

namespace {

// Smallest scratch: 4 MiB covers the decode V up-projection of 2048 tokens x 16 heads x 512
// (bf16 a) without growing; larger requests round up to a power of two.
constexpr int64_t kMinScratchBytes = int64_t{4} << 20;

struct Registry {
  std::mutex mutex;
  std::map<std::pair<int, cudaStream_t>, std::unique_ptr<CublasContext>> contexts;
};

// Leaked on purpose: see the header.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

void check_cublas(cublasStatus_t status, const char* op, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  detail::fail(ErrorCode::kBackend,
               detail::str_cat(op, ": ", what, " failed: ", cublasGetStatusString(status)));
}

CublasContext& cublas_context(cudaStream_t stream, const char* op) {
  const int device = current_device(op);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::unique_ptr<CublasContext>& slot = r.contexts[{device, stream}];
  if (slot) return *slot;
  detail::require(!is_capturing(stream, op), ErrorCode::kUnsupported, op,
                  ": the first call on cuda:", device,
                  " with this stream creates its cuBLAS handle and workspace, which cannot happen "
                  "during CUDA-graph capture; run the same call once before capturing");
  auto ctx = std::make_unique<CublasContext>();
  check_cublas(cublasCreate(&ctx->handle), op, "cublasCreate");
  check_cublas(cublasSetStream(ctx->handle, stream), op, "cublasSetStream");
  check_cuda(cudaMalloc(&ctx->workspace, kCublasWorkspaceBytes), op,
             "cudaMalloc(cuBLAS workspace)");
  check_cublas(cublasLtCreate(&ctx->lt), op, "cublasLtCreate");
  // After cublasSetStream, which resets the workspace to cuBLAS's own pool.
  check_cublas(cublasSetWorkspace(ctx->handle, ctx->workspace, kCublasWorkspaceBytes), op,
               "cublasSetWorkspace");
  slot = std::move(ctx);
  return *slot;
}

void prepare_cublas(Device device, cudaStream_t stream, const char* op) {
  DeviceGuard guard(device, op);
  cublas_context(stream, op);
}

void reserve_scratch(CublasContext& ctx, int64_t bytes, cudaStream_t stream, const char* op) {
  if (bytes <= ctx.scratch_bytes) return;
  detail::require(!is_capturing(stream, op), ErrorCode::kUnsupported, op, ": this call needs ",
                  bytes, " bytes of dtype-conversion scratch but only ", ctx.scratch_bytes,
                  " are reserved for this stream, and growing it cannot happen during CUDA-graph "
                  "capture; run the same call once before capturing");
  int64_t size = kMinScratchBytes;
  while (size < bytes) size *= 2;
  if (ctx.scratch != nullptr) {
    check_cuda(cudaFree(ctx.scratch), op, "cudaFree(scratch)");
    ctx.scratch = nullptr;
    ctx.scratch_bytes = 0;
  }
  check_cuda(cudaMalloc(&ctx.scratch, static_cast<size_t>(size)), op,
             detail::str_cat("cudaMalloc of ", size, " bytes of scratch").c_str());
  ctx.scratch_bytes = size;
}

}  // namespace mlakit::cuda
