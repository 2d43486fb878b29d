// The primitive ops of ops.hpp behind the C ABI: each converts its DLTensors and forwards.
#include "mlakit/ops.hpp"

#include "capi/boundary.hpp"

using mlakit::Stream;
using mlakit::capi::guarded;
using mlakit::capi::to_kv_cache_dtype;
using mlakit::capi::to_optional_view;
using mlakit::capi::to_view;

extern "C" {

MLAKIT_API mlakit_status_t mlakit_concat_and_cache_mla(const DLTensor* kv_c, const DLTensor* k_pe,
                                                       const DLTensor* kv_cache,
                                                       const DLTensor* slot_mapping,
                                                       int32_t kv_cache_dtype,
                                                       float scale, void* stream) {
  constexpr const char* kOp = "concat_and_cache_mla";
  return guarded(kOp, [&] {
    mlakit::ops::concat_and_cache_mla(
        to_view(kOp, "kv_c", kv_c), to_view(kOp, "k_pe", k_pe), to_view(kOp, "kv_cache", kv_cache),
        to_view(kOp, "slot_mapping", slot_mapping), to_kv_cache_dtype(kOp, kv_cache_dtype), scale,
        Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_gather_and_maybe_dequant_cache(
    const DLTensor* src_cache, const DLTensor* dst, const DLTensor* block_table,
    const DLTensor* cu_seq_lens, const DLTensor* token_to_seq, int64_t num_tokens,
    int32_t kv_cache_dtype, float scale, const DLTensor* seq_starts,
    void* stream) {
  constexpr const char* kOp = "gather_and_maybe_dequant_cache";
  return guarded(kOp, [&] {
    mlakit::ops::gather_and_maybe_dequant_cache(
        to_view(kOp, "src_cache", src_cache), to_view(kOp, "dst", dst),
        to_view(kOp, "block_table", block_table), to_view(kOp, "cu_seq_lens", cu_seq_lens),
        to_view(kOp, "token_to_seq", token_to_seq), num_tokens,
        to_kv_cache_dtype(kOp, kv_cache_dtype), scale,
        to_optional_view(kOp, "seq_starts", seq_starts), Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_cp_gather_cache(const DLTensor* src_cache, const DLTensor* dst,
                                                  const DLTensor* block_table,
                                                  const DLTensor* cu_seq_lens, int64_t batch_size,
                                                  const DLTensor* seq_starts, void* stream) {
  constexpr const char* kOp = "cp_gather_cache";
  return guarded(kOp, [&] {
    mlakit::ops::cp_gather_cache(to_view(kOp, "src_cache", src_cache), to_view(kOp, "dst", dst),
                                 to_view(kOp, "block_table", block_table),
                                 to_view(kOp, "cu_seq_lens", cu_seq_lens), batch_size,
                                 to_optional_view(kOp, "seq_starts", seq_starts), Stream{stream});
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
    mlakit::ops::merge_attn_states(
        to_view(kOp, "output", output), to_optional_view(kOp, "output_lse", output_lse),
        to_view(kOp, "prefix_output", prefix_output), to_view(kOp, "prefix_lse", prefix_lse),
        to_view(kOp, "suffix_output", suffix_output), to_view(kOp, "suffix_lse", suffix_lse),
        Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_scaled_fp8_quant(const DLTensor* input, const DLTensor* out,
                                                   float scale, void* stream) {
  constexpr const char* kOp = "scaled_fp8_quant";
  return guarded(kOp, [&] {
    mlakit::ops::scaled_fp8_quant(to_view(kOp, "input", input), to_view(kOp, "out", out), scale,
                                  Stream{stream});
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
    mlakit::ops::mla_prefill(to_view(kOp, "q", q), to_view(kOp, "k_nope", k_nope),
                             to_view(kOp, "k_pe", k_pe), to_view(kOp, "v", v),
                             to_view(kOp, "cu_seqlens_q", cu_seqlens_q),
                             to_view(kOp, "cu_seqlens_k", cu_seqlens_k), max_seqlen_q,
                             max_seqlen_k, scale, causal != 0, to_view(kOp, "out", out),
                             to_optional_view(kOp, "lse", lse), Stream{stream});
  });
}

}  // extern "C"
