// Version, build description, status names and kv-cache dtype parsing of the C ABI.
#include <string>

#include "capi/boundary.hpp"
#include "cpu/parallel.hpp"

namespace {

#ifdef MLAKIT_WITH_CUDA
constexpr bool kWithCuda = true;
#else
constexpr bool kWithCuda = false;
#endif

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kWithSanitizers = true;
#else
constexpr bool kWithSanitizers = false;
#endif

#if defined(_OPENMP)
constexpr bool kWithOpenMp = true;
#else
constexpr bool kWithOpenMp = false;
#endif

std::string make_build_info() {
  auto flag = [](bool on) { return on ? "true" : "false"; };
  return mlakit::detail::str_cat("{\"version\": \"", MLAKIT_VERSION,
                                 "\", \"abi\": ", MLAKIT_C_ABI_VERSION,
                                 ", \"cuda\": ", flag(kWithCuda),
                                 ", \"blas\": \"openblas-openmp\", \"openmp\": ", flag(kWithOpenMp),
                                 ", \"threads\": ", mlakit::cpu::num_threads(),
                                 ", \"sanitizers\": ", flag(kWithSanitizers), "}");
}

}  // namespace

extern "C" {

MLAKIT_API const char* mlakit_version(void) { return MLAKIT_VERSION; }

MLAKIT_API int32_t mlakit_abi_version(void) { return MLAKIT_C_ABI_VERSION; }

MLAKIT_API const char* mlakit_build_info(void) {
  try {
    static const std::string info = make_build_info();  // thread-safe one-time initialisation
    return info.c_str();
  } catch (...) {
    return "{}";  // only when memory for the string cannot be had
  }
}

MLAKIT_API const char* mlakit_status_name(int32_t status) {
  switch (status) {
    case MLAKIT_OK:
      return "ok";
    case MLAKIT_ERROR_INVALID_ARGUMENT:
      return "invalid_argument";
    case MLAKIT_ERROR_OUT_OF_RANGE:
      return "out_of_range";
    case MLAKIT_ERROR_UNSUPPORTED:
      return "unsupported";
    case MLAKIT_ERROR_BACKEND:
      return "backend";
    case MLAKIT_ERROR_INTERNAL:
      return "internal";
  }
  return "unknown";
}

MLAKIT_API mlakit_status_t mlakit_parse_kv_cache_dtype(const char* name, int32_t* kv_cache_dtype) {
  constexpr const char* kOp = "parse_kv_cache_dtype";
  return mlakit::capi::guarded(kOp, [&] {
    mlakit::capi::require_pointer(kOp, "name", name);
    mlakit::capi::require_pointer(kOp, "kv_cache_dtype", kv_cache_dtype);
    switch (mlakit::parse_kv_cache_dtype(name)) {
      case mlakit::KvCacheDType::kAuto:
        *kv_cache_dtype = MLAKIT_KV_CACHE_AUTO;
        break;
      case mlakit::KvCacheDType::kFp8E4m3:
        *kv_cache_dtype = MLAKIT_KV_CACHE_FP8_E4M3;
        break;
      case mlakit::KvCacheDType::kFp8DsMla:
        *kv_cache_dtype = MLAKIT_KV_CACHE_FP8_DS_MLA;
        break;
    }
  });
}

}  // extern "C"
