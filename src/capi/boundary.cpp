#include "capi/boundary.hpp"

#include <cstring>
#include <limits>

namespace mlakit::capi {

using detail::require;

namespace {

// The message of the last failed call of this thread.
thread_local std::string t_last_error;

std::string dtype_string(DLDataType dtype) {
  return detail::str_cat("(code ", static_cast<int>(dtype.code), ", bits ",
                         static_cast<int>(dtype.bits), ", lanes ", dtype.lanes, ")");
}

}  // namespace

Device to_device(const char* op, const char* name, int32_t device_type, int32_t device_id) {
  switch (device_type) {
    case kDLCPU:
    case kDLCUDAHost:  // pinned host memory: ordinary host memory for the CPU backend
      return Device::cpu();
    case kDLCUDA:
      require(device_id >= 0, ErrorCode::kInvalidArgument, op, ": ", name,
              " has a negative CUDA device id ", device_id);
      return Device::cuda(device_id);
    default:
      detail::fail(
          ErrorCode::kUnsupported,
          detail::str_cat(op, ": ", name, " lives on DLPack device type ", device_type,
                          "; mlakit supports kDLCPU (1), kDLCUDA (2) and kDLCUDAHost (3)"));
  }
}

Device to_device(const char* op, const char* name, DLDevice device) {
  // A C caller may store any int in the enum field; reading it as DLDeviceType would be undefined
  // for values outside the enumeration's range, so its bytes are read as the int they are.
  static_assert(sizeof(device.device_type) == sizeof(int32_t));
  int32_t device_type = 0;
  std::memcpy(&device_type, &device.device_type, sizeof(device_type));
  return to_device(op, name, device_type, device.device_id);
}

mlakit_status_t record_error(mlakit_status_t status, const char* message) noexcept {
  try {
    t_last_error = message;
  } catch (...) {
    t_last_error.clear();  // no memory for the message: the status still tells what happened
  }
  return status;
}

DType to_dtype(const char* op, const char* name, DLDataType dtype) {
  require(dtype.lanes == 1, ErrorCode::kInvalidArgument, op, ": ", name,
          " must have scalar elements (lanes 1), got dtype ", dtype_string(dtype));
  const int bits = dtype.bits;
  switch (dtype.code) {
    case kDLFloat:
      if (bits == 32) return DType::kF32;
      if (bits == 16) return DType::kF16;
      break;
    case kDLBfloat:
      if (bits == 16) return DType::kBF16;
      break;
    case kDLFloat8_e4m3fn:
      if (bits == 8) return DType::kFp8E4m3;
      break;
    case kDLUInt:
      if (bits == 8) return DType::kU8;
      break;
    case kDLInt:
      if (bits == 32) return DType::kI32;
      if (bits == 64) return DType::kI64;
      break;
    default:
      break;
  }
  detail::fail(
      ErrorCode::kInvalidArgument,
      detail::str_cat(op, ": ", name, " has unsupported DLPack dtype ", dtype_string(dtype),
                      "; expected float32, float16, bfloat16, float8_e4m3fn, uint8, "
                      "int32 or int64"));
}

DLDataType to_dl_dtype(DType dtype) {
  auto make = [](uint8_t code, uint8_t bits) { return DLDataType{code, bits, 1}; };
  switch (dtype) {
    case DType::kF32:
      return make(kDLFloat, 32);
    case DType::kF16:
      return make(kDLFloat, 16);
    case DType::kBF16:
      return make(kDLBfloat, 16);
    case DType::kFp8E4m3:
      return make(kDLFloat8_e4m3fn, 8);
    case DType::kU8:
      return make(kDLUInt, 8);
    case DType::kI32:
      return make(kDLInt, 32);
    case DType::kI64:
      return make(kDLInt, 64);
  }
  detail::fail(ErrorCode::kInternal,
               detail::str_cat("to_dl_dtype: unknown DType ", static_cast<int>(dtype)));
}

TensorView to_view(const char* op, const char* name, const DLTensor* tensor) {
  require_pointer(op, name, tensor);
  const DLTensor& t = *tensor;
  require(t.ndim >= 0 && t.ndim <= kMaxDims, ErrorCode::kInvalidArgument, op, ": ", name,
          " must have at most ", kMaxDims, " dimensions, got ", t.ndim);
  require(t.ndim == 0 || t.shape != nullptr, ErrorCode::kInvalidArgument, op, ": ", name, " has ",
          t.ndim, " dimensions but a NULL shape");

  TensorView view;
  view.dtype = to_dtype(op, name, t.dtype);
  view.device = to_device(op, name, t.device);
  view.ndim = t.ndim;
  int64_t dense_stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    view.shape[d] = t.shape[d];
    require(view.shape[d] >= 0, ErrorCode::kInvalidArgument, op, ": ", name,
            " has a negative size ", view.shape[d], " in dimension ", d);
    view.strides[d] = t.strides != nullptr ? t.strides[d] : dense_stride;
    // Saturates on overflow: only a tensor with zero elements or one that check_storage rejects
    // (its extent overflows) can have such sizes.
    if (__builtin_mul_overflow(dense_stride, view.shape[d], &dense_stride)) {
      dense_stride = std::numeric_limits<int64_t>::max();
    }
  }

  // A NULL data pointer stays NULL whatever byte_offset says (check_storage then refuses a view
  // with elements): NULL + offset would be a small non-NULL address, read as the tensor's data.
  if (t.data == nullptr) return view;
  const auto base = reinterpret_cast<uintptr_t>(t.data);
  uintptr_t address = 0;
  require(!__builtin_add_overflow(base, t.byte_offset, &address), ErrorCode::kInvalidArgument, op,
          ": ", name, " data + byte_offset (", t.byte_offset, ") wraps around the address space");
  require(address % static_cast<uintptr_t>(dtype_size(view.dtype)) == 0,
          ErrorCode::kInvalidArgument, op, ": ", name, " (data + byte_offset) must be aligned to ",
          dtype_size(view.dtype), " bytes, its element size");
  view.data = reinterpret_cast<void*>(address);
  return view;
}

std::optional<TensorView> to_optional_view(const char* op, const char* name,
                                           const DLTensor* tensor) {
  if (tensor == nullptr) return std::nullopt;
  return to_view(op, name, tensor);
}

KvCacheDType to_kv_cache_dtype(const char* op, int32_t value) {
  switch (value) {
    case MLAKIT_KV_CACHE_AUTO:
      return KvCacheDType::kAuto;
    case MLAKIT_KV_CACHE_FP8_E4M3:
      return KvCacheDType::kFp8E4m3;
    case MLAKIT_KV_CACHE_FP8_DS_MLA:
      return KvCacheDType::kFp8DsMla;
    default:
      detail::fail(ErrorCode::kInvalidArgument,
                   detail::str_cat(op, ": kv_cache_dtype must be 0 (auto), 1 (fp8_e4m3) or ",
                                   "2 (fp8_ds_mla), got ", value));
  }
}

QueryLenSupport to_query_len_support(const char* op, int32_t value) {
  switch (value) {
    case MLAKIT_QUERY_LEN_SINGLE_ONLY:
      return QueryLenSupport::kSingleOnly;
    case MLAKIT_QUERY_LEN_UNIFORM:
      return QueryLenSupport::kUniform;
    case MLAKIT_QUERY_LEN_VARLEN:
      return QueryLenSupport::kVarlen;
    default:
      detail::fail(ErrorCode::kInvalidArgument,
                   detail::str_cat(op, ": query_len_support must be 0 (single_only), ",
                                   "1 (uniform) or 2 (varlen), got ", value));
  }
}

ChunkPolicy to_chunk_policy(const char* op, int32_t value) {
  switch (value) {
    case MLAKIT_CHUNK_EQUAL_SHARE:
      return ChunkPolicy::kEqualShare;
    case MLAKIT_CHUNK_PACKED:
      return ChunkPolicy::kPacked;
    default:
      detail::fail(ErrorCode::kInvalidArgument,
                   detail::str_cat(op, ": chunk_policy must be 0 (equal_share) or 1 (packed), ",
                                   "got ", value));
  }
}

}  // namespace mlakit::capi

extern "C" MLAKIT_API const char* mlakit_last_error(void) {
  return mlakit::capi::t_last_error.c_str();
}
