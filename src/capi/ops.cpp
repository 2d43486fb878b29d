// The primitive ops of ops.hpp behind the C ABI: each converts its DLTensors and forwards.
#include "mlakit/ops.hpp"

#include "capi/boundary.hpp"

using mlakit::Stream;
using mlakit::capi::guarded;
using mlakit::capi::to_device;
using mlakit::capi::to_kv_cache_dtype;
using mlakit::capi::to_optional_view;
using mlakit::capi::to_view;
using mlakit::capi::to_views;

extern "C" {

MLAKIT_API mlakit_status_t mlakit_concat_and_cache_mla(const DLTensor* kv_c, const DLTensor* k_pe,
                                                       const DLTensor* kv_cache,
                                                       const DLTensor* slot_mapping,
                                                       int32_t kv_cache_dtype, float scale,
                                                       void* stream) {
  constexpr const char* kOp = "concat_and_cache_mla";
  return guarded(kOp, [&] {
    const auto [kv_c_view, k_pe_view, kv_cache_view, slot_mapping_view] = to_views(
        kOp,
        {{"kv_c", kv_c}, {"k_pe", k_pe}, {"kv_cache", kv_cache}, {"slot_mapping", slot_mapping}});
    mlakit::ops::concat_and_cache_mla(kv_c_view, k_pe_view, kv_cache_view, slot_mapping_view,
                                      to_kv_cache_dtype(kOp, kv_cache_dtype), scale,
                                      Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_gather_and_maybe_dequant_cache(
    const DLTensor* src_cache, const DLTensor* dst, const DLTensor* block_table,
    const DLTensor* cu_seq_lens, const DLTensor* token_to_seq, int64_t num_tokens,
    int32_t kv_cache_dtype, float scale, const DLTensor* seq_starts, void* stream) {
  constexpr const char* kOp = "gather_and_maybe_dequant_cache";
  return guarded(kOp, [&] {
    const auto [src_cache_view, dst_view, block_table_view, cu_seq_lens_view, token_to_seq_view] =
        to_views(kOp, {{"src_cache", src_cache},
                       {"dst", dst},
                       {"block_table", block_table},
                       {"cu_seq_lens", cu_seq_lens},
                       {"token_to_seq", token_to_seq}});
    const std::optional<mlakit::TensorView> seq_starts_view =
        to_optional_view(kOp, "seq_starts", seq_starts);
    mlakit::ops::gather_and_maybe_dequant_cache(
        src_cache_view, dst_view, block_table_view, cu_seq_lens_view, token_to_seq_view, num_tokens,
        to_kv_cache_dtype(kOp, kv_cache_dtype), scale, seq_starts_view, Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_concat_and_cache_mla_tensor_scale(
    const DLTensor* kv_c, const DLTensor* k_pe, const DLTensor* kv_cache,
    const DLTensor* slot_mapping, int32_t kv_cache_dtype, const DLTensor* scale, void* stream) {
  constexpr const char* kOp = "concat_and_cache_mla";
  return guarded(kOp, [&] {
    const auto [kv_c_view, k_pe_view, kv_cache_view, slot_mapping_view, scale_view] =
        to_views(kOp, {{"kv_c", kv_c},
                       {"k_pe", k_pe},
                       {"kv_cache", kv_cache},
                       {"slot_mapping", slot_mapping},
                       {"scale", scale}});
    mlakit::ops::concat_and_cache_mla(kv_c_view, k_pe_view, kv_cache_view, slot_mapping_view,
                                      to_kv_cache_dtype(kOp, kv_cache_dtype), scale_view,
                                      Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_gather_and_maybe_dequant_cache_tensor_scale(
    const DLTensor* src_cache, const DLTensor* dst, const DLTensor* block_table,
    const DLTensor* cu_seq_lens, const DLTensor* token_to_seq, int64_t num_tokens,
    int32_t kv_cache_dtype, const DLTensor* scale, const DLTensor* seq_starts, void* stream) {
  constexpr const char* kOp = "gather_and_maybe_dequant_cache";
  return guarded(kOp, [&] {
    const auto [src_cache_view, dst_view, block_table_view, cu_seq_lens_view, token_to_seq_view,
                scale_view] = to_views(kOp, {{"src_cache", src_cache},
                                             {"dst", dst},
                                             {"block_table", block_table},
                                             {"cu_seq_lens", cu_seq_lens},
                                             {"token_to_seq", token_to_seq},
                                             {"scale", scale}});
    const std::optional<mlakit::TensorView> seq_starts_view =
        to_optional_view(kOp, "seq_starts", seq_starts);
    mlakit::ops::gather_and_maybe_dequant_cache(
        src_cache_view, dst_view, block_table_view, cu_seq_lens_view, token_to_seq_view, num_tokens,
        to_kv_cache_dtype(kOp, kv_cache_dtype), scale_view, seq_starts_view, Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_cp_gather_cache(const DLTensor* src_cache, const DLTensor* dst,
                                                  const DLTensor* block_table,
                                                  const DLTensor* cu_seq_lens, int64_t batch_size,
                                                  const DLTensor* seq_starts, void* stream) {
  constexpr const char* kOp = "cp_gather_cache";
  return guarded(kOp, [&] {
    const auto [src_cache_view, dst_view, block_table_view, cu_seq_lens_view] =
        to_views(kOp, {{"src_cache", src_cache},
                       {"dst", dst},
                       {"block_table", block_table},
                       {"cu_seq_lens", cu_seq_lens}});
    const std::optional<mlakit::TensorView> seq_starts_view =
        to_optional_view(kOp, "seq_starts", seq_starts);
    mlakit::ops::cp_gather_cache(src_cache_view, dst_view, block_table_view, cu_seq_lens_view,
                                 batch_size, seq_starts_view, Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_merge_attn_states(const DLTensor* output,
                                                    const DLTensor* prefix_output,
                                                    const DLTensor* prefix_lse,
                                                    const DLTensor* suffix_output,
                                                    const DLTensor* suffix_lse,
                                                    const DLTensor* output_lse, void* stream) {
  constexpr const char* kOp = "merge_attn_states";
  return guarded(kOp, [&] {
    const mlakit::TensorView output_view = to_view(kOp, "output", output);
    const std::optional<mlakit::TensorView> output_lse_view =
        to_optional_view(kOp, "output_lse", output_lse);
    const auto [prefix_output_view, prefix_lse_view, suffix_output_view, suffix_lse_view] =
        to_views(kOp, {{"prefix_output", prefix_output},
                       {"prefix_lse", prefix_lse},
                       {"suffix_output", suffix_output},
                       {"suffix_lse", suffix_lse}});
    mlakit::ops::merge_attn_states(output_view, output_lse_view, prefix_output_view,
                                   prefix_lse_view, suffix_output_view, suffix_lse_view,
                                   Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_dcp_lse_combine(const DLTensor* partial_out,
                                                  const DLTensor* partial_lse_tokens_heads,
                                                  const DLTensor* out,
                                                  const DLTensor* out_lse_tokens_heads,
                                                  void* stream) {
  constexpr const char* kOp = "dcp_lse_combine";
  return guarded(kOp, [&] {
    const std::optional<mlakit::TensorView> out_lse_view =
        to_optional_view(kOp, "out_lse_tokens_heads", out_lse_tokens_heads);
    const auto [partial_out_view, partial_lse_view, out_view] =
        to_views(kOp, {{"partial_out", partial_out},
                       {"partial_lse_tokens_heads", partial_lse_tokens_heads},
                       {"out", out}});
    mlakit::ops::dcp_lse_combine(partial_out_view, partial_lse_view, out_view, out_lse_view,
                                 Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_dcp_lse_correct(const DLTensor* partial_out,
                                                  const DLTensor* all_lse_tokens_heads,
                                                  int64_t rank, const DLTensor* corrected,
                                                  void* stream) {
  constexpr const char* kOp = "dcp_lse_correct";
  return guarded(kOp, [&] {
    const auto [partial_out_view, all_lse_view, corrected_view] =
        to_views(kOp, {{"partial_out", partial_out},
                       {"all_lse_tokens_heads", all_lse_tokens_heads},
                       {"corrected", corrected}});
    mlakit::ops::dcp_lse_correct(partial_out_view, all_lse_view, rank, corrected_view,
                                 Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_scaled_fp8_quant(const DLTensor* input, const DLTensor* out,
                                                   float scale, void* stream) {
  constexpr const char* kOp = "scaled_fp8_quant";
  return guarded(kOp, [&] {
    const auto [input_view, out_view] = to_views(kOp, {{"input", input}, {"out", out}});
    mlakit::ops::scaled_fp8_quant(input_view, out_view, scale, Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_scaled_fp8_quant_tensor_scale(const DLTensor* input,
                                                                const DLTensor* out,
                                                                const DLTensor* scale,
                                                                void* stream) {
  constexpr const char* kOp = "scaled_fp8_quant";
  return guarded(kOp, [&] {
    const auto [input_view, out_view, scale_view] =
        to_views(kOp, {{"input", input}, {"out", out}, {"scale", scale}});
    mlakit::ops::scaled_fp8_quant(input_view, out_view, scale_view, Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_dynamic_scaled_fp8_quant(const DLTensor* input,
                                                           const DLTensor* out,
                                                           const DLTensor* scale, void* stream) {
  constexpr const char* kOp = "dynamic_scaled_fp8_quant";
  return guarded(kOp, [&] {
    const auto [input_view, out_view, scale_view] =
        to_views(kOp, {{"input", input}, {"out", out}, {"scale", scale}});
    mlakit::ops::dynamic_scaled_fp8_quant(input_view, out_view, scale_view, Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_mla_prefill(const DLTensor* q, const DLTensor* k_nope,
                                              const DLTensor* k_pe, const DLTensor* v,
                                              const DLTensor* cu_seqlens_q,
                                              const DLTensor* cu_seqlens_k, int64_t max_seqlen_q,
                                              int64_t max_seqlen_k, float scale, int32_t causal,
                                              const DLTensor* out, const DLTensor* lse,
                                              void* stream) {
  constexpr const char* kOp = "mla_prefill";
  return guarded(kOp, [&] {
    const auto [q_view, k_nope_view, k_pe_view, v_view, cu_seqlens_q_view, cu_seqlens_k_view,
                out_view] = to_views(kOp, {{"q", q},
                                           {"k_nope", k_nope},
                                           {"k_pe", k_pe},
                                           {"v", v},
                                           {"cu_seqlens_q", cu_seqlens_q},
                                           {"cu_seqlens_k", cu_seqlens_k},
                                           {"out", out}});
    const std::optional<mlakit::TensorView> lse_view = to_optional_view(kOp, "lse", lse);
    mlakit::ops::mla_prefill(q_view, k_nope_view, k_pe_view, v_view, cu_seqlens_q_view,
                             cu_seqlens_k_view, max_seqlen_q, max_seqlen_k, scale, causal != 0,
                             out_view, lse_view, Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_check_device_errors(int32_t device_type, int32_t device_id,
                                                      void* stream) {
  constexpr const char* kOp = "check_device_errors";
  return guarded(kOp, [&] {
    mlakit::ops::check_device_errors(to_device(kOp, "device", device_type, device_id),
                                     Stream{stream});
  });
}

}  // extern "C"
