// ops::abs_max: validation and dispatch by device.
#include "cpu/abs_max.hpp"

#include "core/check.hpp"
#include "mlakit/ops.hpp"

#ifdef MLAKIT_WITH_CUDA
#include "cuda/elementwise/launch.hpp"
#endif

namespace mlakit::ops {

float abs_max(const TensorView& x, Stream stream) {
  constexpr const char* kOp = "abs_max";
  detail::check_storage(kOp, "x", x);
  detail::check_float_activation(kOp, "x", x);
#ifdef MLAKIT_WITH_CUDA
  if (x.device.is_cuda()) return cuda::abs_max(x, stream);
#else
  (void)stream;
#endif
  if (!x.device.is_cpu()) detail::unsupported_device(kOp, x.device);
  return cpu::abs_max(x);
}

}  // namespace mlakit::ops
