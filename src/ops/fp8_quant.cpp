// ops::scaled_fp8_quant and ops::dynamic_scaled_fp8_quant: validation and dispatch by device.
#include "cpu/fp8_quant.hpp"

#include <cmath>
#include <cstring>

#include "core/check.hpp"
#include "cpu/abs_max.hpp"
#include "cpu/elementwise.hpp"
#include "mlakit/ops.hpp"

#ifdef MLAKIT_WITH_CUDA
#include "cuda/elementwise/launch.hpp"
#endif

namespace mlakit::ops {

using detail::require;

namespace {

constexpr const char* kQuantOp = "scaled_fp8_quant";
constexpr const char* kDynamicOp = "dynamic_scaled_fp8_quant";
// 448: the largest finite e4m3 value; a dynamic scale maps amax(|input|) onto it.
constexpr float kE4m3Max = 448.0f;

// input: any float dtype; out: fp8 (or u8) of input's shape. Returns their device.
Device validate_quant(const char* op, const TensorView& input, const TensorView& out) {
  const Device device = detail::common_device(op, {{"input", &input}, {"out", &out}});
  detail::check_storage(op, "input", input);
  detail::check_storage(op, "out", out);
  detail::check_float_activation(op, "input", input);
  detail::check_dtype(op, "out", out, {DType::kFp8E4m3, DType::kU8});
  detail::check_ndim(op, "out", out, input.ndim);
  for (int d = 0; d < input.ndim; ++d)
    detail::check_size_matches(op, "out", out, d, "input", input, d, "out has input's shape");
  detail::check_outputs_apart(op, {{"out", &out}}, {{"input", &input}});
  return device;
}

// 1 / scale rounded to f32, after checking that both are finite and > 0 (the kernels multiply by
// the reciprocal, which must be finite too: scale > ~2.9e-39).
float checked_inverse(float scale) {
  const float inv_scale = 1.0f / scale;
  require(std::isfinite(scale) && scale > 0.0f && std::isfinite(inv_scale),
          ErrorCode::kInvalidArgument, kQuantOp,
          ": scale must be finite and > 0 with a finite reciprocal, got ", scale);
  return inv_scale;
}

}  // namespace

void scaled_fp8_quant(const TensorView& input, const TensorView& out, float scale, Stream stream) {
  const Device device = validate_quant(kQuantOp, input, out);
  const float inv_scale = checked_inverse(scale);
  if (device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    return cuda::scaled_fp8_quant(input, out, inv_scale, stream);
#else
    (void)stream;  // no CUDA backend in this build
    detail::unsupported_device(kQuantOp, device);
#endif
  }
  cpu::scaled_fp8_quant(input, out, inv_scale);
}

void scaled_fp8_quant(const TensorView& input, const TensorView& out, const TensorView& scale,
                      Stream stream) {
  const Device device = validate_quant(kQuantOp, input, out);
  detail::check_scale_tensor(kQuantOp, "scale", scale, device);
  detail::check_scale_apart(kQuantOp, scale, "out", out);
  if (!device.is_cuda()) {  // a host scale: read now, checked as the float form checks it
    return scaled_fp8_quant(input, out, detail::host_scale_value(scale), stream);
  }
#ifdef MLAKIT_WITH_CUDA
  cuda::scaled_fp8_quant(input, out, static_cast<const float*>(scale.data),
                         /*zero_scale_gives_zero=*/false, stream);
#else
  (void)stream;
  detail::unsupported_device(kQuantOp, device);
#endif
}

void dynamic_scaled_fp8_quant(const TensorView& input, const TensorView& out,
                              const TensorView& scale, Stream stream) {
  const Device device = validate_quant(kDynamicOp, input, out);
  detail::check_scale_tensor(kDynamicOp, "scale", scale, device);
  // scale is written before the codes are computed from input and written to out: sharing memory
  // with either would quantize a changed input or hand back codes as the scale.
  require(!detail::views_overlap(scale, input) && !detail::views_overlap(scale, out),
          ErrorCode::kInvalidArgument, kDynamicOp, ": scale must not overlap input or out");
  if (device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    auto* scale_data = static_cast<float*>(scale.data);
    cuda::dynamic_fp8_scale(input, scale_data, stream);
    return cuda::scaled_fp8_quant(input, out, scale_data, /*zero_scale_gives_zero=*/true, stream);
#else
    (void)stream;
    detail::unsupported_device(kDynamicOp, device);
#endif
  }
  const float value = cpu::abs_max(input) / kE4m3Max;  // f32 division, as the GPU's
  std::memcpy(scale.data, &value, sizeof(value));
  if (value == 0.0f) {  // every element is +-0 (or there is none): every code 0
    cpu::fill_zero(out);
    return;
  }
  const float inv_scale = 1.0f / value;
  require(std::isfinite(value) && std::isfinite(inv_scale), ErrorCode::kInvalidArgument, kDynamicOp,
          ": the scale amax(|input|) / 448 = ", value,
          " has no finite reciprocal: input holds inf or NaN, or only magnitudes below ~1.3e-36 "
          "(scale was written, out was not)");
  cpu::scaled_fp8_quant(input, out, inv_scale);
}

}  // namespace mlakit::ops
