// Device memory for Tensor: implemented by the CUDA backend when it is built, otherwise every call
// throws ErrorCode::kUnsupported.
#pragma once

#include <cstdint>

#include "mlakit/types.hpp"

namespace mlakit::detail {

void* device_malloc(Device device, int64_t bytes);
void device_free(Device device, void* ptr) noexcept;
void device_memset_zero(Device device, void* ptr, int64_t bytes);

}  // namespace mlakit::detail
