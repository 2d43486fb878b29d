// Cache ops (spec A.3, A.7): backend-independent argument checks, then device dispatch.
//
// The checks here read only tensor metadata (shape, dtype, strides, device), so a CUDA backend
// reuses them unchanged. Checks of index *values* (slots, request ids, block ids, positions) read
// the index tensors and therefore live with each backend's kernel (src/cpu/cache_ops.cpp).
#include "cpu/cache_ops.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/check.hpp"
#include "cpu/elementwise.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"
#include "ops/cache_write_with_q_rope.hpp"

#ifdef MLAKIT_WITH_CUDA
#include "cuda/cache/launch.hpp"
#endif

namespace mlakit::ops {
namespace {

using detail::require;

constexpr const char* kConcatOp = "concat_and_cache_mla";
constexpr const char* kConcatWithQRopeOp = "concat_and_cache_mla_with_q_rope";
constexpr const char* kGatherOp = "gather_and_maybe_dequant_cache";
constexpr const char* kCpGatherOp = "cp_gather_cache";
constexpr const char* kGatherRowsOp = "gather_rows_and_maybe_dequant";

void check_index_tensor(const char* op, const char* name, const TensorView& t, int ndim,
                        DType dtype) {
  detail::check_storage(op, name, t);
  detail::check_ndim(op, name, t, ndim);
  detail::check_dtype(op, name, t, {dtype});
}

// Writes to distinct cache slots must not touch the same bytes (the kernels write slots in
// parallel). With the entry contiguous, this holds when, ordering the block and offset dimensions
// by stride, the smaller stride steps over a whole entry and the larger one over all entries of
// the smaller dimension. Dimensions of size 1 never step.
void check_cache_entries_disjoint(const char* op, const char* name, const TensorView& cache) {
  std::pair<int64_t, int64_t> dims[2] = {{cache.strides[0], cache.shape[0]},
                                         {cache.strides[1], cache.shape[1]}};
  if (dims[0].first > dims[1].first) std::swap(dims[0], dims[1]);
  const int64_t width = cache.shape[2];
  const bool inner_ok = dims[0].second <= 1 || dims[0].first >= width;
  const bool outer_ok =
      dims[1].second <= 1 || dims[1].first >= dims[0].first * std::max<int64_t>(dims[0].second, 1);
  require(inner_ok && outer_ok, ErrorCode::kInvalidArgument, op, ": ", name,
          " entries must not overlap, got strides [", cache.strides[0], ", ", cache.strides[1],
          ", ", cache.strides[2], "] for shape ", detail::shape_string(cache));
}

// Rows of a [rows, width] output written in parallel must not overlap.
void check_rows_disjoint(const char* op, const char* name, const TensorView& t) {
  require(t.shape[0] <= 1 || t.strides[0] >= t.shape[1], ErrorCode::kInvalidArgument, op, ": ",
          name, " rows must not overlap: row stride must be >= ", t.shape[1], ", got ",
          t.strides[0]);
}

void check_fp8_scale(const char* op, const char* name, float scale) {
  require(std::isfinite(scale) && scale > 0.0f, ErrorCode::kInvalidArgument, op, ": ", name,
          " must be finite and > 0 for kv_cache_dtype fp8_e4m3, got ", scale);
}

// Block tables, lengths and starts of a gather over `batch` requests.
void check_gather_indices(const char* op, const TensorView& block_table,
                          const TensorView& cu_seq_lens,
                          const std::optional<TensorView>& seq_starts, int64_t batch) {
  check_index_tensor(op, "block_table", block_table, 2, DType::kI32);
  detail::check_min_size(op, "block_table", block_table, 0, batch);
  check_index_tensor(op, "cu_seq_lens", cu_seq_lens, 1, DType::kI32);
  detail::check_min_size(op, "cu_seq_lens", cu_seq_lens, 0, batch + 1);
  if (seq_starts) {
    check_index_tensor(op, "seq_starts", *seq_starts, 1, DType::kI32);
    detail::check_min_size(op, "seq_starts", *seq_starts, 0, batch);
  }
}

// kv_c and k_pe widths make up the cache entry: L + R for auto and fp8_e4m3, 512 + 64 for
// fp8_ds_mla. The message names the widths and the cache, not only the cache.
void check_entry_widths(const TensorView& kv_c, const TensorView& k_pe, const TensorView& kv_cache,
                        KvCacheDType kv_dtype) {
  const char* op = kConcatOp;
  const int64_t rank = kv_c.size(1), rope = k_pe.size(1);
  if (kv_dtype == KvCacheDType::kFp8DsMla) {
    require(rank == kDsMlaKvLoraRank && rope == kDsMlaRopeDim, ErrorCode::kInvalidArgument, op,
            ": kv_c.shape[1] and k_pe.shape[1] must be 512 and 64 for kv_cache_dtype fp8_ds_mla "
            "(the only dims its 656-byte entry holds), got ",
            rank, " and ", rope);
    return;
  }
  detail::check_storage(op, "kv_cache", kv_cache);
  detail::check_ndim(op, "kv_cache", kv_cache, 3);
  int64_t sum = 0;  // an empty kv_c may claim any width: the sum may overflow
  const bool overflow = __builtin_add_overflow(rank, rope, &sum);
  if (!overflow && sum == kv_cache.size(2))
    return;  // the message below costs a stream: build
             // it only on failure
  detail::fail(
      ErrorCode::kInvalidArgument,
      detail::str_cat(op,
                      ": kv_c.shape[1] + k_pe.shape[1] (L + R) must add up to the cache "
                      "entry width kv_cache.shape[2] = ",
                      kv_cache.size(2), ", got ", rank, " + ", rope,
                      overflow ? std::string(" (overflows int64)") : detail::str_cat(" = ", sum)));
}

// Everything but the scale (checked by the caller: a float here, a tensor's metadata on CUDA).
void validate_concat_and_cache_mla(const TensorView& kv_c, const TensorView& k_pe,
                                   const TensorView& kv_cache, const TensorView& slot_mapping,
                                   KvCacheDType kv_dtype) {
  const char* op = kConcatOp;
  detail::check_storage(op, "kv_c", kv_c);
  detail::check_storage(op, "k_pe", k_pe);
  detail::check_ndim(op, "kv_c", kv_c, 2);
  detail::check_ndim(op, "k_pe", k_pe, 2);
  detail::check_float_activation(op, "kv_c", kv_c);
  require(k_pe.dtype == kv_c.dtype, ErrorCode::kInvalidArgument, op,
          ": k_pe must have the dtype of kv_c (", dtype_name(kv_c.dtype), "), got ",
          dtype_name(k_pe.dtype));
  detail::check_inner_contiguous(op, "kv_c", kv_c);
  detail::check_inner_contiguous(op, "k_pe", k_pe);
  // int64 only, as the spec's slot_mapping: i32 would cap the cache at 2^31 slots.
  check_index_tensor(op, "slot_mapping", slot_mapping, 1, DType::kI64);
  const int64_t num_tokens = slot_mapping.size(0);
  detail::check_min_size(op, "kv_c", kv_c, 0, num_tokens);
  detail::check_min_size(op, "k_pe", k_pe, 0, num_tokens);
  if (kv_dtype == KvCacheDType::kFp8DsMla) {
    require(is_float16(kv_c.dtype), ErrorCode::kInvalidArgument, op,
            ": kv_c must have dtype f16 or bf16 for fp8_ds_mla (the rope part is stored in the "
            "16-bit input dtype), got ",
            dtype_name(kv_c.dtype));
  }
  check_entry_widths(kv_c, k_pe, kv_cache, kv_dtype);
  const MlaDims dims{.kv_lora_rank = kv_c.size(1), .qk_rope_head_dim = k_pe.size(1)};
  check_kv_cache(op, kv_cache, kv_dtype, dims);
  if (kv_dtype == KvCacheDType::kAuto) {
    require(kv_cache.dtype == kv_c.dtype, ErrorCode::kInvalidArgument, op,
            ": kv_cache must have the dtype of kv_c (", dtype_name(kv_c.dtype),
            ") for kv_cache_dtype auto, got ", dtype_name(kv_cache.dtype));
  }
  check_cache_entries_disjoint(op, "kv_cache", kv_cache);
  detail::check_outputs_apart(op, {{"kv_cache", &kv_cache}},
                              {{"kv_c", &kv_c}, {"k_pe", &k_pe}, {"slot_mapping", &slot_mapping}});
}

// The rope parts of concat_and_cache_mla_with_q_rope: [Td, N, R] views of one dtype and shape,
// dst's elements distinct (heads R or more apart, tokens N heads or more apart).
void validate_q_rope(const TensorView& src, const TensorView& dst) {
  const char* op = kConcatWithQRopeOp;
  detail::check_storage(op, "q_rope_src", src);
  detail::check_storage(op, "q_rope_dst", dst);
  detail::check_ndim(op, "q_rope_src", src, 3);
  detail::check_ndim(op, "q_rope_dst", dst, 3);
  detail::check_float_activation(op, "q_rope_src", src);
  require(dst.dtype == src.dtype, ErrorCode::kInvalidArgument, op,
          ": q_rope_dst must have the dtype of q_rope_src (", dtype_name(src.dtype), "), got ",
          dtype_name(dst.dtype));
  for (int d = 0; d < 3; ++d) detail::check_size(op, "q_rope_dst", dst, d, src.shape[d]);
  detail::check_inner_contiguous(op, "q_rope_src", src);
  detail::check_inner_contiguous(op, "q_rope_dst", dst);
  if (dst.numel() == 0) return;
  const bool heads_apart = dst.shape[1] == 1 || dst.strides[1] >= dst.shape[2];
  const bool tokens_apart =
      dst.shape[0] == 1 || dst.strides[0] >= (dst.shape[1] - 1) * dst.strides[1] + dst.shape[2];
  require(heads_apart && tokens_apart, ErrorCode::kInvalidArgument, op,
          ": q_rope_dst elements must not overlap, got strides ", detail::strides_string(dst),
          " for shape ", detail::shape_string(dst));
  detail::check_outputs_apart(op, {{"q_rope_dst", &dst}}, {{"q_rope_src", &src}});
}

// Everything but the scale (checked by the caller).
void validate_gather_and_maybe_dequant_cache(const TensorView& src_cache, const TensorView& dst,
                                             const TensorView& block_table,
                                             const TensorView& cu_seq_lens,
                                             const TensorView& token_to_seq, int64_t num_tokens,
                                             KvCacheDType kv_dtype,
                                             const std::optional<TensorView>& seq_starts) {
  const char* op = kGatherOp;
  detail::check_storage(op, "dst", dst);
  detail::check_ndim(op, "dst", dst, 2);
  detail::check_float_activation(op, "dst", dst);
  detail::check_inner_contiguous(op, "dst", dst);
  // Only the entry width matters for auto and fp8_e4m3: the whole entry is dequantized alike.
  MlaDims dims{.kv_lora_rank = dst.size(1), .qk_rope_head_dim = 0};
  if (kv_dtype == KvCacheDType::kFp8DsMla) {
    detail::check_size(op, "dst", dst, 1, kDsMlaKvLoraRank + kDsMlaRopeDim);
    require(is_float16(dst.dtype), ErrorCode::kInvalidArgument, op,
            ": dst must have dtype f16 or bf16 for fp8_ds_mla (the rope part is stored in the "
            "16-bit activation dtype and copied bit for bit), got ",
            dtype_name(dst.dtype));
    dims = MlaDims{.kv_lora_rank = kDsMlaKvLoraRank, .qk_rope_head_dim = kDsMlaRopeDim};
  } else {
    detail::check_storage(op, "src_cache", src_cache);
    detail::check_ndim(op, "src_cache", src_cache, 3);
    detail::check_size_matches(op, "src_cache", src_cache, 2, "dst", dst, 1,
                               "the entry width L + R");
  }
  check_kv_cache(op, "src_cache", src_cache, kv_dtype, dims);
  check_rows_disjoint(op, "dst", dst);

  check_index_tensor(op, "cu_seq_lens", cu_seq_lens, 1, DType::kI32);
  require(cu_seq_lens.size(0) >= 1, ErrorCode::kInvalidArgument, op,
          ": cu_seq_lens must have batch_size + 1 >= 1 elements, got 0");
  check_gather_indices(op, block_table, cu_seq_lens, seq_starts, cu_seq_lens.size(0) - 1);
  check_index_tensor(op, "token_to_seq", token_to_seq, 1, DType::kI32);
  require(num_tokens >= 0 && num_tokens <= dst.size(0) && num_tokens <= token_to_seq.size(0),
          ErrorCode::kInvalidArgument, op,
          ": num_tokens must be in [0, min(dst.shape[0] = ", dst.size(0),
          ", token_to_seq.shape[0] = ", token_to_seq.size(0), ")], got ", num_tokens);
  detail::check_outputs_apart(op, {{"dst", &dst}},
                              {{"src_cache", &src_cache},
                               {"block_table", &block_table},
                               {"cu_seq_lens", &cu_seq_lens},
                               {"token_to_seq", &token_to_seq},
                               {"seq_starts", seq_starts ? &*seq_starts : nullptr}});
}

void validate_cp_gather_cache(const TensorView& src_cache, const TensorView& dst,
                              const TensorView& block_table, const TensorView& cu_seq_lens,
                              int64_t batch_size, const std::optional<TensorView>& seq_starts) {
  const char* op = kCpGatherOp;
  detail::check_storage(op, "src_cache", src_cache);
  detail::check_ndim(op, "src_cache", src_cache, 3);
  detail::check_dtype(op, "src_cache", src_cache,
                      {DType::kF32, DType::kF16, DType::kBF16, DType::kU8, DType::kFp8E4m3});
  detail::check_inner_contiguous(op, "src_cache", src_cache);
  require(src_cache.size(1) > 0, ErrorCode::kInvalidArgument, op,
          ": src_cache block_size (shape[1]) must be > 0");
  detail::check_storage(op, "dst", dst);
  detail::check_ndim(op, "dst", dst, 2);
  require(dst.dtype == src_cache.dtype, ErrorCode::kInvalidArgument, op,
          ": src_cache and dst must have the same dtype, got src_cache ",
          dtype_name(src_cache.dtype), " and dst ", dtype_name(dst.dtype));
  detail::check_size(op, "dst", dst, 1, src_cache.size(2));
  detail::check_inner_contiguous(op, "dst", dst);
  check_rows_disjoint(op, "dst", dst);
  check_index_tensor(op, "cu_seq_lens", cu_seq_lens, 1, DType::kI32);
  require(batch_size >= 0 && batch_size < cu_seq_lens.size(0), ErrorCode::kInvalidArgument, op,
          ": batch_size must be in [0, cu_seq_lens.shape[0] - 1 = ", cu_seq_lens.size(0) - 1,
          "], got ", batch_size);
  check_gather_indices(op, block_table, cu_seq_lens, seq_starts, batch_size);
  detail::check_outputs_apart(op, {{"dst", &dst}},
                              {{"src_cache", &src_cache},
                               {"block_table", &block_table},
                               {"cu_seq_lens", &cu_seq_lens},
                               {"seq_starts", seq_starts ? &*seq_starts : nullptr}});
}

// src: [rows, entry_width] rows of a cache's entries; dst: [>= num_tokens, L + R] activations.
void validate_gather_rows_and_maybe_dequant(const TensorView& src, const TensorView& dst,
                                            const TensorView& row_index, KvCacheDType kv_dtype,
                                            float scale) {
  const char* op = kGatherRowsOp;
  detail::check_storage(op, "src", src);
  detail::check_ndim(op, "src", src, 2);
  detail::check_inner_contiguous(op, "src", src);
  detail::check_storage(op, "dst", dst);
  detail::check_ndim(op, "dst", dst, 2);
  detail::check_float_activation(op, "dst", dst);
  detail::check_inner_contiguous(op, "dst", dst);
  check_rows_disjoint(op, "dst", dst);
  switch (kv_dtype) {
    case KvCacheDType::kAuto:
      detail::check_float_activation(op, "src", src);
      detail::check_size(op, "src", src, 1, dst.size(1));
      break;
    case KvCacheDType::kFp8E4m3:
      detail::check_dtype(op, "src", src, {DType::kU8, DType::kFp8E4m3});
      detail::check_size(op, "src", src, 1, dst.size(1));
      check_fp8_scale(op, "scale", scale);
      break;
    case KvCacheDType::kFp8DsMla:
      detail::check_dtype(op, "src", src, {DType::kU8});
      detail::check_size(op, "src", src, 1, kDsMlaEntryBytes);
      detail::check_size(op, "dst", dst, 1, kDsMlaKvLoraRank + kDsMlaRopeDim);
      require(is_float16(dst.dtype), ErrorCode::kInvalidArgument, op,
              ": dst must have dtype f16 or bf16 for fp8_ds_mla, got ", dtype_name(dst.dtype));
      break;
  }
  check_index_tensor(op, "row_index", row_index, 1, DType::kI32);
  detail::check_min_size(op, "dst", dst, 0, row_index.size(0));
  detail::check_outputs_apart(op, {{"dst", &dst}}, {{"src", &src}, {"row_index", &row_index}});
}

}  // namespace

void concat_and_cache_mla(const TensorView& kv_c, const TensorView& k_pe,
                          const TensorView& kv_cache, const TensorView& slot_mapping,
                          KvCacheDType kv_cache_dtype, float scale,
                          [[maybe_unused]] Stream stream) {
  const Device device = detail::common_device(
      kConcatOp,
      {{"kv_c", &kv_c}, {"k_pe", &k_pe}, {"kv_cache", &kv_cache}, {"slot_mapping", &slot_mapping}});
  validate_concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype);
  if (kv_cache_dtype == KvCacheDType::kFp8E4m3) check_fp8_scale(kConcatOp, "scale", scale);
  if (device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    return cuda::concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype,
                                      cuda::ScaleSource{.value = scale}, stream);
#else
    detail::unsupported_device(kConcatOp, device);
#endif
  }
  cpu::concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale);
}

void concat_and_cache_mla(const TensorView& kv_c, const TensorView& k_pe,
                          const TensorView& kv_cache, const TensorView& slot_mapping,
                          KvCacheDType kv_cache_dtype, const TensorView& scale, Stream stream) {
  const Device device = detail::common_device(
      kConcatOp,
      {{"kv_c", &kv_c}, {"k_pe", &k_pe}, {"kv_cache", &kv_cache}, {"slot_mapping", &slot_mapping}});
  detail::check_scale_tensor(kConcatOp, "scale", scale, device);
  detail::check_scale_apart(kConcatOp, scale, "kv_cache", kv_cache);
  if (!device.is_cuda()) {  // a host scale: read now, checked as the float form checks it
    return concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype,
                                detail::host_scale_value(scale), stream);
  }
  validate_concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype);
#ifdef MLAKIT_WITH_CUDA
  cuda::concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype,
                             cuda::ScaleSource{.device = static_cast<const float*>(scale.data)},
                             stream);
#else
  (void)stream;
  detail::unsupported_device(kConcatOp, device);
#endif
}

void concat_and_cache_mla_with_q_rope(const TensorView& kv_c, const TensorView& k_pe,
                                      const TensorView& kv_cache, const TensorView& slot_mapping,
                                      KvCacheDType kv_cache_dtype, float scale,
                                      const TensorView& q_rope_src, const TensorView& q_rope_dst,
                                      [[maybe_unused]] Stream stream) {
  const Device device = detail::common_device(kConcatWithQRopeOp, {{"kv_c", &kv_c},
                                                                   {"k_pe", &k_pe},
                                                                   {"kv_cache", &kv_cache},
                                                                   {"slot_mapping", &slot_mapping},
                                                                   {"q_rope_src", &q_rope_src},
                                                                   {"q_rope_dst", &q_rope_dst}});
  validate_concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype);
  if (kv_cache_dtype == KvCacheDType::kFp8E4m3) check_fp8_scale(kConcatOp, "scale", scale);
  validate_q_rope(q_rope_src, q_rope_dst);
  if (device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    return cuda::concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype,
                                      cuda::ScaleSource{.value = scale}, q_rope_src, q_rope_dst,
                                      stream);
#else
    detail::unsupported_device(kConcatWithQRopeOp, device);
#endif
  }
  cpu::concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale);
  cpu::copy(q_rope_src, q_rope_dst);
}

namespace {

// The device all tensors of a gather live on (seq_starts too, when given).
Device gather_device(const TensorView& src_cache, const TensorView& dst,
                     const TensorView& block_table, const TensorView& cu_seq_lens,
                     const TensorView& token_to_seq, const std::optional<TensorView>& seq_starts) {
  const Device device = detail::common_device(kGatherOp, {{"src_cache", &src_cache},
                                                          {"dst", &dst},
                                                          {"block_table", &block_table},
                                                          {"cu_seq_lens", &cu_seq_lens},
                                                          {"token_to_seq", &token_to_seq}});
  if (seq_starts) detail::check_device(kGatherOp, "seq_starts", *seq_starts, device);
  return device;
}

}  // namespace

void gather_and_maybe_dequant_cache(const TensorView& src_cache, const TensorView& dst,
                                    const TensorView& block_table, const TensorView& cu_seq_lens,
                                    const TensorView& token_to_seq, int64_t num_tokens,
                                    KvCacheDType kv_dtype, float scale,
                                    const std::optional<TensorView>& seq_starts,
                                    [[maybe_unused]] Stream stream) {
  const Device device =
      gather_device(src_cache, dst, block_table, cu_seq_lens, token_to_seq, seq_starts);
  validate_gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq,
                                          num_tokens, kv_dtype, seq_starts);
  if (kv_dtype == KvCacheDType::kFp8E4m3) check_fp8_scale(kGatherOp, "scale", scale);
  if (device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    return cuda::gather_and_maybe_dequant_cache(
        src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens, kv_dtype,
        cuda::ScaleSource{.value = scale}, seq_starts, stream);
#else
    detail::unsupported_device(kGatherOp, device);
#endif
  }
  cpu::gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq,
                                      num_tokens, kv_dtype, scale, seq_starts);
}

void gather_and_maybe_dequant_cache(const TensorView& src_cache, const TensorView& dst,
                                    const TensorView& block_table, const TensorView& cu_seq_lens,
                                    const TensorView& token_to_seq, int64_t num_tokens,
                                    KvCacheDType kv_dtype, const TensorView& scale,
                                    const std::optional<TensorView>& seq_starts, Stream stream) {
  const Device device =
      gather_device(src_cache, dst, block_table, cu_seq_lens, token_to_seq, seq_starts);
  detail::check_scale_tensor(kGatherOp, "scale", scale, device);
  detail::check_scale_apart(kGatherOp, scale, "dst", dst);
  if (!device.is_cuda()) {  // a host scale: read now, checked as the float form checks it
    return gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq,
                                          num_tokens, kv_dtype, detail::host_scale_value(scale),
                                          seq_starts, stream);
  }
  validate_gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq,
                                          num_tokens, kv_dtype, seq_starts);
#ifdef MLAKIT_WITH_CUDA
  cuda::gather_and_maybe_dequant_cache(
      src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens, kv_dtype,
      cuda::ScaleSource{.device = static_cast<const float*>(scale.data)}, seq_starts, stream);
#else
  (void)stream;
  detail::unsupported_device(kGatherOp, device);
#endif
}

void cp_gather_cache(const TensorView& src_cache, const TensorView& dst,
                     const TensorView& block_table, const TensorView& cu_seq_lens,
                     int64_t batch_size, const std::optional<TensorView>& seq_starts,
                     [[maybe_unused]] Stream stream) {
  const Device device = detail::common_device(kCpGatherOp, {{"src_cache", &src_cache},
                                                            {"dst", &dst},
                                                            {"block_table", &block_table},
                                                            {"cu_seq_lens", &cu_seq_lens}});
  if (seq_starts) detail::check_device(kCpGatherOp, "seq_starts", *seq_starts, device);
  validate_cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts);
  if (device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    return cuda::cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts,
                                 stream);
#else
    detail::unsupported_device(kCpGatherOp, device);
#endif
  }
  cpu::cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts);
}

void gather_rows_and_maybe_dequant(const TensorView& src, const TensorView& dst,
                                   const TensorView& row_index, KvCacheDType kv_dtype, float scale,
                                   [[maybe_unused]] Stream stream) {
  const Device device = detail::common_device(
      kGatherRowsOp, {{"src", &src}, {"dst", &dst}, {"row_index", &row_index}});
  validate_gather_rows_and_maybe_dequant(src, dst, row_index, kv_dtype, scale);
  if (device.is_cuda()) {
#ifdef MLAKIT_WITH_CUDA
    return cuda::gather_rows_and_maybe_dequant(src, dst, row_index, kv_dtype, scale, stream);
#else
    detail::unsupported_device(kGatherRowsOp, device);
#endif
  }
  cpu::gather_rows_and_maybe_dequant(src, dst, row_index, kv_dtype, scale);
}

}  // namespace mlakit::ops
