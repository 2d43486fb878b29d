#include "mlakit/config.hpp"

#include <cstdint>
#include <limits>
#include <utility>

#include "core/check.hpp"

namespace mlakit {

using detail::require;

void MlaDims::validate() const {
  // At most 2^31 - 1 each: the kernels index heads and widths with int32, and products such as
  // N * (P + V) then stay inside int64.
  constexpr int64_t kLargest = std::numeric_limits<int32_t>::max();
  const std::pair<const char*, int64_t> dims[] = {{"num_heads", num_heads},
                                                  {"kv_lora_rank", kv_lora_rank},
                                                  {"qk_rope_head_dim", qk_rope_head_dim},
                                                  {"qk_nope_head_dim", qk_nope_head_dim},
                                                  {"v_head_dim", v_head_dim}};
  for (const auto& [name, value] : dims) {
    require(value > 0, ErrorCode::kInvalidArgument, "MlaDims: ", name, " must be > 0, got ", value);
    require(value <= kLargest, ErrorCode::kInvalidArgument, "MlaDims: ", name,
            " must be at most 2147483647 (2^31 - 1), got ", value);
  }
}

const char* kv_cache_dtype_name(KvCacheDType dtype) {
  switch (dtype) {
    case KvCacheDType::kAuto:
      return "auto";
    case KvCacheDType::kFp8E4m3:
      return "fp8_e4m3";
    case KvCacheDType::kFp8DsMla:
      return "fp8_ds_mla";
  }
  return "unknown";
}

KvCacheDType parse_kv_cache_dtype(std::string_view name) {
  if (name == "auto" || name == "bfloat16" || name == "float16") return KvCacheDType::kAuto;
  if (name == "fp8" || name == "fp8_e4m3") return KvCacheDType::kFp8E4m3;
  if (name == "fp8_ds_mla") return KvCacheDType::kFp8DsMla;
  detail::fail(ErrorCode::kInvalidArgument,
               detail::str_cat("kv_cache_dtype must be one of auto, bfloat16, float16, fp8, "
                               "fp8_e4m3, fp8_ds_mla, got '",
                               std::string(name), "'"));
}

bool is_fp8(KvCacheDType dtype) { return dtype != KvCacheDType::kAuto; }

}  // namespace mlakit
