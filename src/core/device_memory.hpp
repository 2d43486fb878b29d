// Device memory for Tensor: implemented by the CUDA backend when it is built, otherwise every call
// throws ErrorCode::kUnsupported.
#pragma once

#include <cstdint>

#include "mlakit/types.hpp"

namespace mlakit::detail {

void* device_malloc(Device device, int64_t bytes);
void device_free(Device device, void* ptr) noexcept;
void device_memset_zero(Device device, void* ptr, int64_t bytes);
// Copies `bytes` between any two devices (host included) on `stream` (cudaMemcpyAsync with
// cudaMemcpyDefault); with a pageable host side it returns once the source has been read.
void device_copy(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes,
                 Stream stream);
// Waits for all work on `device`.
void device_synchronize(Device device);

}  // namespace mlakit::detail
