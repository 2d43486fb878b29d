// The C ABI boundary: every exported function runs its body through guarded(), which turns any
// exception into a status code and the thread's last-error message; DLTensors become TensorViews
// through to_view().
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <new>
#include <optional>
#include <string>

#include "core/check.hpp"
#include "mlakit/config.hpp"
#include "mlakit/error.hpp"
#include "mlakit/mlakit.h"
#include "mlakit/plan.hpp"
#include "mlakit/types.hpp"

namespace mlakit::capi {

// Stores `message` as this thread's last error and returns `status`. Never throws.
mlakit_status_t record_error(mlakit_status_t status, const char* message) noexcept;

// Runs body(); MLAKIT_OK if it returns, else the status of what it threw (message recorded).
// `op` names the function in messages of exceptions that do not come from mlakit.
template <class Body>
mlakit_status_t guarded(const char* op, Body&& body) noexcept {
  try {
    body();
    return MLAKIT_OK;
  } catch (const Error& e) {
    const int code = static_cast<int>(e.code());
    const bool known = code >= MLAKIT_ERROR_INVALID_ARGUMENT && code <= MLAKIT_ERROR_INTERNAL;
    return record_error(known ? static_cast<mlakit_status_t>(code) : MLAKIT_ERROR_INTERNAL,
                        e.what());
  } catch (const std::bad_alloc&) {
    return record_error(MLAKIT_ERROR_BACKEND, (std::string(op) + ": out of memory").c_str());
  } catch (const std::exception& e) {
    return record_error(MLAKIT_ERROR_INTERNAL, (std::string(op) + ": " + e.what()).c_str());
  } catch (...) {
    return record_error(MLAKIT_ERROR_INTERNAL, (std::string(op) + ": unknown exception").c_str());
  }
}

// A DLPack device as a Device (pinned host memory is the CPU); `name` is the argument in
// messages. Throws kInvalidArgument for a negative CUDA id, kUnsupported for other device types.
Device to_device(const char* op, const char* name, DLDevice device);
// The same for a device given as a DLDeviceType value (any int) and an id.
Device to_device(const char* op, const char* name, int32_t device_type, int32_t device_id);

// A borrowed DLTensor as a TensorView (data + byte_offset, strides in elements, NULL strides =
// dense; NULL data stays NULL whatever byte_offset is). Throws kInvalidArgument for NULL, rank > 4,
// lanes != 1, unknown dtypes, negative sizes, a byte_offset that wraps the address space or a
// misaligned address; kUnsupported for devices other than CPU, pinned host and CUDA.
TensorView to_view(const char* op, const char* name, const DLTensor* tensor);
// nullopt for NULL, else to_view().
std::optional<TensorView> to_optional_view(const char* op, const char* name,
                                           const DLTensor* tensor);

// A DLTensor argument and its name in messages.
struct NamedDLTensor {
  const char* name;
  const DLTensor* tensor;
};

// to_view() of each argument, strictly in the order given, so that the first bad argument is the
// one reported (the arguments of a function call are evaluated in no fixed order).
template <size_t N>
std::array<TensorView, N> to_views(const char* op, const NamedDLTensor (&tensors)[N]) {
  std::array<TensorView, N> views;
  for (size_t i = 0; i < N; ++i) views[i] = to_view(op, tensors[i].name, tensors[i].tensor);
  return views;
}

KvCacheDType to_kv_cache_dtype(const char* op, int32_t value);
QueryLenSupport to_query_len_support(const char* op, int32_t value);
ChunkPolicy to_chunk_policy(const char* op, int32_t value);
DType to_dtype(const char* op, const char* name, DLDataType dtype);
// The DLPack type of `dtype` (to_dtype's inverse; u8 stays uint8).
DLDataType to_dl_dtype(DType dtype);

// Throws kInvalidArgument naming `name` when `pointer` is NULL.
inline void require_pointer(const char* op, const char* name, const void* pointer) {
  detail::require(pointer != nullptr, ErrorCode::kInvalidArgument, op, ": ", name,
                  " must not be NULL");
}

// Throws kInvalidArgument unless count >= 0 (a host array length).
inline void require_count(const char* op, const char* name, int64_t count) {
  detail::require(count >= 0, ErrorCode::kInvalidArgument, op, ": ", name, " must be >= 0, got ",
                  count);
}

// A request count that sizes a host query_start_loc of count + 1 int32 offsets: in
// [0, 2^31 - 1], checked before any entry is read (count + 1 overflowed int64 for INT64_MAX).
inline void require_request_count(const char* op, const char* name, int64_t count) {
  require_count(op, name, count);
  detail::require(count <= std::numeric_limits<int32_t>::max(), ErrorCode::kInvalidArgument, op,
                  ": ", name, " must be at most 2147483647 (int32 offsets), got ", count);
}

}  // namespace mlakit::capi

// The opaque handles of mlakit.h.
struct mlakit_plan {
  mlakit::Plan plan;
};
struct mlakit_decode_schedule {
  mlakit::DecodeSchedule schedule;
};
