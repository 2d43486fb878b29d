// Primitive MLA ops. Each op validates its arguments (shapes, dtypes, strides, devices, index
// ranges) and dispatches on the device of its tensors: all tensors of one call live on one device;
// index tensors (block tables, slot mappings, lengths) too. Bad input throws mlakit::Error naming
// the op and the argument; nothing is read or written out of bounds.
//
// Parameter names are those of the C ABI (mlakit.h) and of the Python package (vLLM's), so that
// an error message names the argument the same way in every language.
//
// LSE convention (DESIGN.md §3): float32, natural log; an empty key set gives out = 0 and
// lse = -inf; +inf inputs are treated as -inf. Layouts (the shape comment of every LSE says
// which): prefill and merge LSEs are [N, T] (heads x tokens), decode LSEs are [B, s_q, N].
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "mlakit/config.hpp"
#include "mlakit/plan.hpp"
#include "mlakit/types.hpp"

namespace mlakit::ops {

// ---- Cache write (spec A.3) ---------------------------------------------------------------------
// kv_c:         [T', L]  activation dtype; row stride may exceed L
// k_pe:         [T', R]  activation dtype; any row stride
// kv_cache:     [num_blocks, block_size, entry_width]  (see kv_cache.hpp)
// slot_mapping: i64 [T], T <= T'; slot < 0 skips the token; slot >= num_blocks * block_size throws
// L + R must add up to kv_cache's entry (656-byte fp8_ds_mla entries: L = 512, R = 64).
// scale:        per-tensor k_scale for kFp8E4m3 (stored = e4m3(x / scale), saturating); unused
//               otherwise. Must be finite and > 0.
void concat_and_cache_mla(const TensorView& kv_c, const TensorView& k_pe,
                          const TensorView& kv_cache, const TensorView& slot_mapping,
                          KvCacheDType kv_cache_dtype, float scale, Stream stream = {});

// ---- Context gathers (spec A.7) -----------------------------------------------------------------
// Token t < num_tokens of dst comes from request b = token_to_seq[t] at logical position
// pos = t - cu_seq_lens[b] + (seq_starts ? seq_starts[b] : 0), i.e. from block
// block_table[b, pos / block_size]; the column is checked against the table width, the block id
// against num_blocks. Entries are dequantized (fp8: value * scale; ds_mla: tile scales) to dst's
// dtype (f32, f16 or bf16).
// src_cache:    [num_blocks, block_size, entry_width]
// dst:          [>= num_tokens, L + R], row stride may exceed L + R
// block_table:  i32 [B, max_blocks]
// cu_seq_lens:  i32 [B + 1]
// token_to_seq: i32 [>= num_tokens]
// seq_starts:   i32 [B] or absent
void gather_and_maybe_dequant_cache(const TensorView& src_cache, const TensorView& dst,
                                    const TensorView& block_table, const TensorView& cu_seq_lens,
                                    const TensorView& token_to_seq, int64_t num_tokens,
                                    KvCacheDType kv_cache_dtype, float scale,
                                    const std::optional<TensorView>& seq_starts,
                                    Stream stream = {});

// Raw copy (no dequant) of request b's positions [seq_starts[b], seq_starts[b] + len_b) into
// dst rows [cu_seq_lens[b], cu_seq_lens[b + 1]); src and dst must share dtype and entry width.
// src_cache:   [num_blocks, block_size, W]
// dst:         [>= cu_seq_lens[batch_size], W]
// block_table: i32 [>= batch_size, max_blocks]
// cu_seq_lens: i32 [batch_size + 1]
// seq_starts:  i32 [batch_size] or absent
void cp_gather_cache(const TensorView& src_cache, const TensorView& dst,
                     const TensorView& block_table, const TensorView& cu_seq_lens,
                     int64_t batch_size, const std::optional<TensorView>& seq_starts,
                     Stream stream = {});

// ---- LSE merge (spec A.8, C.6) ------------------------------------------------------------------
// output, prefix_output, suffix_output: [T, H, D] (each f32, f16 or bf16, dtypes may differ;
//                                        any strides, D contiguous)
// prefix_lse, suffix_lse: f32 [H, T] (heads x tokens)
// output_lse:             f32 [H, T] or absent
// Both sides empty (-inf/-inf) gives out = 0, lse = -inf. Never produces NaN from finite or
// infinite LSEs. `output` may alias `prefix_output` or `suffix_output`.
void merge_attn_states(const TensorView& output, const std::optional<TensorView>& output_lse,
                       const TensorView& prefix_output, const TensorView& prefix_lse,
                       const TensorView& suffix_output, const TensorView& suffix_lse,
                       Stream stream = {});

// ---- fp8 static quantization (decode q; spec A.6, F-37) ----------------------------------------
// out = e4m3(clamp(input * (1 / scale), -448, 448)); input: any float dtype, out: kFp8E4m3/kU8,
// same shape.
void scaled_fp8_quant(const TensorView& input, const TensorView& out, float scale,
                      Stream stream = {});

// ---- Absorbed MQA decode (spec A.6, C.3, C.4, C.7) ----------------------------------------------
struct DecodeParams {
  float scale = 0.0f;                           // softmax scale from the model (> 0)
  KvCacheDType kv_dtype = KvCacheDType::kAuto;  // kv_cache_dtype of the C and Python APIs
  float q_scale = 1.0f;                         // applies when q is fp8 (kFp8E4m3 or kU8)
  float k_scale = 1.0f;                         // applies to kFp8E4m3 caches
  // L, the latent width: out.shape[3] must equal it, and V = entry[0:L]. 0 takes L from
  // out.shape[3] unchecked (kept for callers that predate the argument; pass L).
  int64_t kv_lora_rank = 0;
};
// Query j of request b (s_q queries) attends keys [0, seq_lens[b] - s_q + j] (bottom-right
// causal); K = entry[0:L+R], V = entry[0:L]. seq_lens count the new tokens too, so every seq_len
// is 0 (out 0, lse -inf) or at least s_q; on the GPU a bad seq_len gives NaN rows and is reported
// by check_device_errors.
// q:               [B, s_q, N, L + R]  activation dtype, or fp8 for fp8 caches
// kv_cache:        [num_blocks, block_size, entry_width]
// block_table:     i32 [B, max_blocks]
// seq_lens:        i32 [B]
// out:             [B, s_q, N, L]  f32, f16 or bf16
// lse:             f32 [B, s_q, N]
// schedule:        plan_mla_decode(...) for the same batch (below)
// split_workspace: f32 with >= mla_decode_workspace_elems(...) elements (partials of the splits)
void mla_decode(const TensorView& q, const TensorView& kv_cache, const TensorView& block_table,
                const TensorView& seq_lens, const TensorView& out, const TensorView& lse,
                const DecodeParams& params, const DecodeSchedule& schedule,
                const TensorView& split_workspace, Stream stream = {});
int64_t mla_decode_workspace_elems(const DecodeSchedule& schedule, int64_t s_q, int64_t num_heads,
                                   int64_t kv_lora_rank);
// The split-KV schedule of one mla_decode call, chosen by the backend of `device`: the one place
// where the caller (e.g. the MlaAttention orchestrator) asks a backend how to cut the keys.
struct DecodePlanShape {
  Device device{};               // where the decode runs
  int64_t batch = 0;             // B
  int64_t s_q = 1;               // queries per request
  int64_t num_heads = 0;         // N
  int64_t block_size = 0;        // tokens per cache block
  int64_t max_seq_len = 0;       // bound on every seq_len, e.g. block_table width x block_size
  bool batch_invariant = false;  // a request's splits depend on its own seq_len only
};
// seq_lens: host copy of the [B] lengths. The CPU plans from them (they must then be the values
// the decode will read); the GPU schedule depends on the shape only (seq_lens may be empty), so a
// captured CUDA graph serves any lengths up to max_seq_len.
DecodeSchedule plan_mla_decode(const DecodePlanShape& shape, std::span<const int32_t> seq_lens);

// Convenience form for host tensors: plans the splits and allocates the workspace itself.
void mla_decode(const TensorView& q, const TensorView& kv_cache, const TensorView& block_table,
                const TensorView& seq_lens, const TensorView& out, const TensorView& lse,
                const DecodeParams& params);

// ---- Varlen MHA prefill, d_qk = P + R, d_v = V, no V padding (spec A.5)
// --------------------------- Request b has queries [cu_seqlens_q[b], cu_seqlens_q[b+1]) and keys
// [cu_seqlens_k[b], cu_seqlens_k[b+1]). K of head n is [k_nope[s, n, :] | k_pe[s, :]] (k_pe shared
// by all heads). Causal masking is bottom-right: query i of a request with sq queries and sk keys
// sees keys [0, sk - sq + i]. A query with no visible key gets out 0 and lse -inf. q: [T, N, P + R]
// k_nope:       [S, N, P]  (any strides, last dim contiguous; e.g. a view of kv_b_proj output)
// k_pe:         [S, R]
// v:            [S, N, V]
// cu_seqlens_q: i32 [B + 1];  cu_seqlens_k: i32 [B + 1]
// out:          [T, N, V]   f32, f16 or bf16 (may differ from q's); head stride may exceed V
// lse:          f32 [N, T] (heads x tokens) or absent
void mla_prefill(const TensorView& q, const TensorView& k_nope, const TensorView& k_pe,
                 const TensorView& v, const TensorView& cu_seqlens_q,
                 const TensorView& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                 float scale, bool causal, const TensorView& out,
                 const std::optional<TensorView>& lse, Stream stream = {});

// ---- Elementwise helpers
// ------------------------------------------------------------------------- dst = src converted to
// dst's dtype (f32/f16/bf16, RNE); same shape, any strides.
void copy(const TensorView& src, const TensorView& dst, Stream stream = {});
// Every element of dst becomes 0 (any dtype, any strides).
void fill_zero(const TensorView& dst, Stream stream = {});

// ---- Device-side index checks
// ------------------------------------------------------------------------ The index tensors of
// GPU ops (slot_mapping, block tables, token_to_seq, cu_seqlens, ...) live in device memory, and
// reading them on the host would synchronize and break CUDA-graph capture. So the CUDA kernels
// check every index they read: a bad one is skipped (nothing out of bounds is read or written)
// and recorded in a per-device error word. check_device_errors waits for `stream`, then throws
// Error(kOutOfRange) naming every kind of bad index recorded on `device` since the last call, and
// clears the record. Call it where a synchronization is fine (a step end, after a graph replay).
// A no-op for the CPU, whose ops check indices on the host and throw at once. mla_decode also
// turns the output rows of a request with a bad block id or seq_len into NaN.
void check_device_errors(Device device, Stream stream = {});

// ---- GEMMs (BLAS on CPU, cuBLAS on GPU)
// ---------------------------------------------------------- c[b] = a[b] @ w[b] for every batch
// index b, f32 accumulation. a: [batch, M, K]  w: [batch, K, Ncol]  c: [batch, M, Ncol] Any
// strides; the innermost dimension of each operand must be contiguous or the second one (a
// transposed matrix). Used for q absorption (a = q_nope^T per head, w = W_UK_T), the V
// up-projection (a = o_lat^T per head, w = W_UV) and kv_b_proj (batch 1, w = weight^T).
void batched_matmul(const TensorView& a, const TensorView& w, const TensorView& c,
                    Stream stream = {});

}  // namespace mlakit::ops
