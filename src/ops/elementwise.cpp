#include "cpu/elementwise.hpp"

#include "core/check.hpp"
#include "core/device_memory.hpp"
#include "mlakit/ops.hpp"

#ifdef MLAKIT_WITH_CUDA
#include "cuda/elementwise/launch.hpp"
#endif

namespace mlakit::ops {

void copy(const TensorView& src, const TensorView& dst, [[maybe_unused]] Stream stream) {
  constexpr const char* kOp = "copy";
  detail::check_storage(kOp, "src", src);
  detail::check_storage(kOp, "dst", dst);
  detail::require(src.ndim == dst.ndim, ErrorCode::kInvalidArgument, kOp,
                  ": src and dst must have the same rank, got ", detail::view_text(src), " and ",
                  detail::view_text(dst));
  for (int d = 0; d < src.ndim; ++d) detail::check_size(kOp, "dst", dst, d, src.shape[d]);
  detail::check_outputs_apart(kOp, {{"dst", &dst}}, {{"src", &src}});
  if (!(src.device == dst.device)) {  // a transfer: raw bytes, same dtype, dense on both sides
    detail::require(src.dtype == dst.dtype, ErrorCode::kInvalidArgument, kOp,
                    ": a copy between devices keeps the dtype, got ", dtype_name(src.dtype), " to ",
                    dtype_name(dst.dtype));
    detail::check_contiguous(kOp, "src", src);
    detail::check_contiguous(kOp, "dst", dst);
    if (src.numel() == 0) return;
    detail::device_copy(dst.data, dst.device, src.data, src.device,
                        src.numel() * src.element_size(), stream);
    return;
  }
  detail::check_float_activation(kOp, "src", src);
  detail::check_float_activation(kOp, "dst", dst);
  const Device device = detail::common_device(kOp, {{"src", &src}, {"dst", &dst}});
  if (device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    return cuda::copy(src, dst, stream);
#else
    detail::unsupported_device(kOp, device);
#endif
  }
  cpu::copy(src, dst);
}

void fill_zero(const TensorView& dst, [[maybe_unused]] Stream stream) {
  constexpr const char* kOp = "fill_zero";
  detail::check_storage(kOp, "dst", dst);
  if (dst.device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    return cuda::fill_zero(dst, stream);
#else
    detail::unsupported_device(kOp, dst.device);
#endif
  }
  cpu::fill_zero(dst);
}

}  // namespace mlakit::ops
