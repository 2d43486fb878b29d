// Device memory in a build without CUDA: there is no device to allocate on.
#include "core/check.hpp"
#include "core/device_memory.hpp"

namespace mlakit::detail {

void* device_malloc(Device device, int64_t bytes) {
  fail(ErrorCode::kUnsupported, str_cat("cannot allocate ", bytes, " bytes on ",
                                        device_name(device), ": mlakit was built without CUDA"));
}

void device_free(Device, void*) noexcept {}

void device_memset_zero(Device device, void*, int64_t) {
  fail(ErrorCode::kUnsupported,
       str_cat("cannot use ", device_name(device), ": mlakit was built without CUDA"));
}

void device_copy(void*, Device dst_device, const void*, Device src_device, int64_t, Stream) {
  fail(ErrorCode::kUnsupported,
       str_cat("cannot copy from ", device_name(src_device), " to ", device_name(dst_device),
               ": mlakit was built without CUDA"));
}

void device_synchronize(Device) {}

void* pinned_host_malloc(int64_t bytes) {
  fail(ErrorCode::kUnsupported, str_cat("cannot allocate ", bytes,
                                        " bytes of pinned memory: mlakit was built without CUDA"));
}

void pinned_host_free(void*) noexcept {}

void* event_create(Device device) {
  fail(ErrorCode::kUnsupported, str_cat("cannot create an event on ", device_name(device),
                                        ": mlakit was built without CUDA"));
}

void event_destroy(Device, void*) noexcept {}

void event_record(Device device, void*, Stream) {
  fail(ErrorCode::kUnsupported, str_cat("cannot record an event on ", device_name(device),
                                        ": mlakit was built without CUDA"));
}

void event_synchronize(void*) {}

}  // namespace mlakit::detail
