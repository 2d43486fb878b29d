#include "mlakit/kv_cache.hpp"

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>

#include "core/check.hpp"

namespace mlakit {

using detail::require;

DType KvCacheSpec::storage_dtype() const {
  return kv_dtype == KvCacheDType::kAuto ? act_dtype : DType::kU8;
}

int64_t KvCacheSpec::entry_width() const {
  return kv_dtype == KvCacheDType::kFp8DsMla ? kDsMlaEntryBytes : dims.entry_dim();
}

int64_t KvCacheSpec::entry_bytes() const { return entry_width() * dtype_size(storage_dtype()); }

std::array<int64_t, 3> KvCacheSpec::cache_shape() const {
  return {num_blocks, block_size, entry_width()};
}

void KvCacheSpec::validate() const {
  dims.validate();
  require(act_dtype == DType::kF32 || act_dtype == DType::kF16 || act_dtype == DType::kBF16,
          ErrorCode::kInvalidArgument, "KvCacheSpec: act_dtype must be f32, f16 or bf16, got ",
          dtype_name(act_dtype));
  require(block_size > 0, ErrorCode::kInvalidArgument, "KvCacheSpec: block_size must be > 0, got ",
          block_size);
  // The decode schedule and kernels count positions within a block in int32.
  require(block_size <= std::numeric_limits<int32_t>::max(), ErrorCode::kInvalidArgument,
          "KvCacheSpec: block_size must be at most 2147483647 (2^31 - 1), got ", block_size);
  require(num_blocks >= 0, ErrorCode::kInvalidArgument,
          "KvCacheSpec: num_blocks must be >= 0, got ", num_blocks);
  if (kv_dtype == KvCacheDType::kFp8DsMla) {
    require(dims.kv_lora_rank == kDsMlaKvLoraRank, ErrorCode::kInvalidArgument,
            "KvCacheSpec: kv_lora_rank must be 512 for fp8_ds_mla, got ", dims.kv_lora_rank);
    require(dims.qk_rope_head_dim == kDsMlaRopeDim, ErrorCode::kInvalidArgument,
            "KvCacheSpec: qk_rope_head_dim must be 64 for fp8_ds_mla, got ", dims.qk_rope_head_dim);
    require(is_float16(act_dtype), ErrorCode::kInvalidArgument,
            "KvCacheSpec: fp8_ds_mla needs a 16-bit activation dtype, got ", dtype_name(act_dtype));
  }
}

void check_kv_cache(const char* op, const TensorView& cache, KvCacheDType kv_dtype,
                    const MlaDims& dims) {
  check_kv_cache(op, "kv_cache", cache, kv_dtype, dims);
}

void check_kv_cache(const char* op, const char* name, const TensorView& cache,
                    KvCacheDType kv_dtype, const MlaDims& dims) {
  detail::check_storage(op, name, cache);
  detail::check_ndim(op, name, cache, 3);
  // The dtype's message names the format too; built only when the dtype is wrong.
  const auto check_format_dtype = [&](std::initializer_list<DType> allowed) {
    for (DType d : allowed)
      if (cache.dtype == d) return;
    const std::string with_format =
        detail::str_cat(name, " (kv_cache_dtype ", kv_cache_dtype_name(kv_dtype), ")");
    detail::check_dtype(op, with_format.c_str(), cache, allowed);
  };
  switch (kv_dtype) {
    case KvCacheDType::kAuto:
      check_format_dtype({DType::kF32, DType::kF16, DType::kBF16});
      detail::check_size(op, name, cache, 2, dims.entry_dim());
      break;
    case KvCacheDType::kFp8E4m3:
      check_format_dtype({DType::kU8, DType::kFp8E4m3});
      detail::check_size(op, name, cache, 2, dims.entry_dim());
      break;
    case KvCacheDType::kFp8DsMla:
      require(dims.kv_lora_rank == kDsMlaKvLoraRank, ErrorCode::kInvalidArgument, op,
              ": kv_lora_rank must be 512 for fp8_ds_mla, got ", dims.kv_lora_rank);
      require(dims.qk_rope_head_dim == kDsMlaRopeDim, ErrorCode::kInvalidArgument, op,
              ": qk_rope_head_dim must be 64 for fp8_ds_mla, got ", dims.qk_rope_head_dim);
      check_format_dtype({DType::kU8});
      detail::check_size(op, name, cache, 2, kDsMlaEntryBytes);
      break;
  }
  detail::check_inner_contiguous(op, name, cache);
  require(cache.size(1) > 0, ErrorCode::kInvalidArgument, op, ": ", name,
          " block_size (shape[1]) must be > 0");
}

}  // namespace mlakit
