// ops::prepare_stream: per-stream backend state created ahead of graph capture.
#include "core/check.hpp"
#include "mlakit/ops.hpp"

#ifdef MLAKIT_WITH_CUDA
#include "cuda/common/runtime.hpp"
#include "cuda/gemm/cublas_context.hpp"
#endif

namespace mlakit::ops {

void prepare_stream(Device device, Stream stream) {
  constexpr const char* kOp = "prepare_stream";
#ifdef MLAKIT_WITH_CUDA
  if (device.is_cuda()) {
    cuda::prepare_cublas(device, cuda::as_cuda_stream(stream), kOp);
    return;
  }
#else
  (void)stream;
#endif
  if (!device.is_cpu()) detail::unsupported_device(kOp, device);
}

}  // namespace mlakit::ops
