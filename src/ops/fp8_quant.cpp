// ops::scaled_fp8_quant: validation and dispatch by device.
#include "cpu/fp8_quant.hpp"

#include <cmath>

#include "core/check.hpp"
#include "mlakit/ops.hpp"

#ifdef MLAKIT_WITH_CUDA
#include "cuda/elementwise/launch.hpp"
#endif

namespace mlakit::ops {

using detail::require;

void scaled_fp8_quant(const TensorView& input, const TensorView& out, float scale, Stream stream) {
  constexpr const char* kOp = "scaled_fp8_quant";
  const Device device = detail::common_device(kOp, {{"input", &input}, {"out", &out}});
  detail::check_storage(kOp, "input", input);
  detail::check_storage(kOp, "out", out);
  detail::check_float_activation(kOp, "input", input);
  detail::check_dtype(kOp, "out", out, {DType::kFp8E4m3, DType::kU8});
  detail::check_ndim(kOp, "out", out, input.ndim);
  for (int d = 0; d < input.ndim; ++d)
    detail::check_size_matches(kOp, "out", out, d, "input", input, d, "out has input's shape");
  // The kernel multiplies by the f32 reciprocal, which must be finite too (scale > ~2.9e-39).
  const float inv_scale = 1.0f / scale;
  require(std::isfinite(scale) && scale > 0.0f && std::isfinite(inv_scale),
          ErrorCode::kInvalidArgument, kOp,
          ": scale must be finite and > 0 with a finite reciprocal, got ", scale);
  if (device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    return cuda::scaled_fp8_quant(input, out, inv_scale, stream);
#else
    (void)stream;  // no CUDA backend in this build
    detail::unsupported_device(kOp, device);
#endif
  }
  cpu::scaled_fp8_quant(input, out, inv_scale);
}

}  // namespace mlakit::ops
