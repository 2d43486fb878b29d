#include "core/check.hpp"
#include "mlakit/ops.hpp"

#ifdef MLAKIT_WITH_CUDA
#include "cuda/common/device_errors.hpp"
#endif

namespace mlakit::ops {

void check_device_errors(Device device, [[maybe_unused]] Stream stream) {
  if (device.is_cpu()) return;  // CPU ops throw at the bad index itself
#ifdef MLAKIT_WITH_CUDA
  cuda::check_device_errors(device, stream);
#else
  detail::fail(ErrorCode::kUnsupported,
               detail::str_cat("check_device_errors: ", device_name(device),
                               ": mlakit was built without CUDA"));
#endif
}

}  // namespace mlakit::ops
