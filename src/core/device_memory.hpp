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

// Page-locked host memory (so that copies from it are truly asynchronous); CUDA builds only.
void* pinned_host_malloc(int64_t bytes);
void pinned_host_free(void* ptr) noexcept;

// A CUDA event on `device` that marks a point of a stream; CUDA builds only.
void* event_create(Device device);
void event_destroy(Device device, void* event) noexcept;
void event_record(Device device, void* event, Stream stream);
// Blocks the host until the work before the last record of `event` is done (at once if never
// recorded).
void event_synchronize(void* event);

}  // namespace mlakit::detail
