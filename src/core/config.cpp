#include "mlakit/config.hpp"

#include "core/check.hpp"

namespace mlakit {

using detail::require;

void MlaDims::validate() const {
  require(num_heads > 0, ErrorCode::kInvalidArgument, "MlaDims: num_heads must be > 0, got ",
          num_heads);
  require(kv_lora_rank > 0, ErrorCode::kInvalidArgument, "MlaDims: kv_lora_rank must be > 0, got ",
          kv_lora_rank);
  require(qk_rope_head_dim > 0, ErrorCode::kInvalidArgument,
          "MlaDims: qk_rope_head_dim must be > 0, got ", qk_rope_head_dim);
  require(qk_nope_head_dim > 0, ErrorCode::kInvalidArgument,
          "MlaDims: qk_nope_head_dim must be > 0, got ", qk_nope_head_dim);
  require(v_head_dim > 0, ErrorCode::kInvalidArgument, "MlaDims: v_head_dim must be > 0, got ",
          v_head_dim);
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
