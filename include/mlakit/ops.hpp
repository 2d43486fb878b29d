// Primitive MLA ops. Each op validates its arguments (shapes, dtypes, strides, devices, index
// ranges) and dispatches on the device of its tensors: all tensors of one call live on one device;
// index tensors (block tables, slot mappings, lengths) too. Bad input throws mlakit::Error naming
// the op and the argument; nothing is read or written out of bounds. An op's outputs share no
// memory with its inputs or with each other ("out must not overlap lse"; merge_attn_states alone
// allows out to be one of its inputs exactly, for in-place merging), and no output overlaps itself
// (a stride 0 on a dimension of size > 1, or rows closer than their width: "out must not overlap
// itself"; the test is a sufficient one, so a few unique interleaved layouts are refused too). A
// view with no element is accepted whatever its strides (NumPy 2 gives a zero-size array zero
// strides).
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
#include "mlakit/dcp.hpp"
#include "mlakit/plan.hpp"
#include "mlakit/types.hpp"

namespace mlakit::ops {

// ---- Scales as tensors
// --------------------------------------------------------------------------- concat_and_cache_mla,
// gather_and_maybe_dequant_cache and scaled_fp8_quant also come in a form that takes `const
// TensorView& scale` where the float form takes `float scale`, as vLLM passes its k_scale and
// activation scales: f32, exactly one element (any shape: [], [1], ...), on the device of the op's
// other tensors, 4-byte aligned, not overlapping the op's output (kv_cache, dst, out). Bad
// metadata throws kInvalidArgument naming `scale`, like every argument check.
// - CPU: the value is read at once and the call proceeds as the float form (same checks, same
//   errors, same results).
// - CUDA: the kernel reads the value when it runs. The call reads nothing on the host, does not
//   synchronize and allocates nothing, so it can be captured in a CUDA graph whose replays use the
//   value the tensor holds at each replay. Results are bit for bit those of the float form with
//   that value. A value the float form would reject (not finite and > 0) cannot throw at run time:
//   the kernel writes NaN instead (NaN e4m3 codes into the cache or out, NaN rows from a
//   dequantizing gather), never a finite wrong number, and records it for check_device_errors.
// The value is used, and so checked, only where the float form uses it (kv_cache_dtype fp8_e4m3
// for the cache ops).

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
// scale:        f32 one-element tensor on kv_c's device ("Scales as tensors" above)
void concat_and_cache_mla(const TensorView& kv_c, const TensorView& k_pe,
                          const TensorView& kv_cache, const TensorView& slot_mapping,
                          KvCacheDType kv_cache_dtype, const TensorView& scale, Stream stream = {});

// ---- Context gathers (spec A.7) -----------------------------------------------------------------
// Token t < num_tokens of dst comes from request b = token_to_seq[t] at logical position
// pos = t - cu_seq_lens[b] + (seq_starts ? seq_starts[b] : 0), i.e. from block
// block_table[b, pos / block_size]; the column is checked against the table width, the block id
// against num_blocks. Entries are dequantized (fp8: value * scale; ds_mla: tile scales) to dst's
// dtype (f32, f16 or bf16). fp8_ds_mla rope values are copied bit for bit: dst must have the
// 16-bit dtype the cache was written from (the 656-byte entry does not record it, so a bf16-written
// cache read into an f16 dst reinterprets the rope bits; the caller keeps the two alike).
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
// scale:        f32 one-element tensor on dst's device ("Scales as tensors" above)
void gather_and_maybe_dequant_cache(const TensorView& src_cache, const TensorView& dst,
                                    const TensorView& block_table, const TensorView& cu_seq_lens,
                                    const TensorView& token_to_seq, int64_t num_tokens,
                                    KvCacheDType kv_cache_dtype, const TensorView& scale,
                                    const std::optional<TensorView>& seq_starts,
                                    Stream stream = {});

// token_to_seq[t] = the request b with cu_seq_lens[b] <= t < cu_seq_lens[b + 1], for every
// t < num_tokens: the row -> request map the gather above takes, built where the tensors live so
// that a step's plan uploads one offset per request instead of one entry per gathered row.
// cu_seq_lens:  i32 [B + 1]: 0, non-decreasing, cu_seq_lens[B] >= num_tokens (checked on the CPU;
//               on the GPU a row outside every request gets -1, which the gather reports)
// token_to_seq: i32 [>= num_tokens]
void fill_token_to_seq(const TensorView& cu_seq_lens, const TensorView& token_to_seq,
                       int64_t num_tokens, Stream stream = {});

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
// infinite LSEs. `output` may be `prefix_output` or `suffix_output` exactly (same view), and
// `output_lse` may be `prefix_lse` or `suffix_lse` exactly; any other overlap (output with an LSE,
// output_lse with a state, a partial overlap) throws.
void merge_attn_states(const TensorView& output, const std::optional<TensorView>& output_lse,
                       const TensorView& prefix_output, const TensorView& prefix_lse,
                       const TensorView& suffix_output, const TensorView& suffix_lse,
                       Stream stream = {});

// ---- fp8 static quantization (decode q; spec A.6, F-37) ----------------------------------------
// out = e4m3(clamp(input * (1 / scale), -448, 448)), the reciprocal rounded to f32 first;
// input: any float dtype, out: kFp8E4m3/kU8, same shape. scale must be finite and > 0 with a
// finite reciprocal.
void scaled_fp8_quant(const TensorView& input, const TensorView& out, float scale,
                      Stream stream = {});
// scale: f32 one-element tensor on input's device ("Scales as tensors" above)
void scaled_fp8_quant(const TensorView& input, const TensorView& out, const TensorView& scale,
                      Stream stream = {});
// Dynamic per-tensor quantization: scale = amax(|input|) / 448 in f32 (448: the largest finite
// e4m3 value) is written into `scale`, then out = scaled_fp8_quant(input, out, scale). An all-zero
// or empty input gives scale 0 and every code 0. On CUDA both steps run on the device (a memset
// and three kernels): no host read, no synchronization, no allocation; capturable. A scale with
// no finite reciprocal (input holds inf or NaN, or only magnitudes below ~1.3e-36): the CPU
// writes scale and throws kInvalidArgument before writing out; CUDA writes scale and NaN codes
// and records it for check_device_errors.
// input: any float dtype, any strides; out: kFp8E4m3/kU8 of input's shape
// scale: f32 one-element tensor on input's device (written), not overlapping input or out
void dynamic_scaled_fp8_quant(const TensorView& input, const TensorView& out,
                              const TensorView& scale, Stream stream = {});

// ---- Absorbed MQA decode (spec A.6, C.3, C.4, C.7) ----------------------------------------------
struct DecodeParams {
  float scale = 0.0f;                           // softmax scale from the model (> 0)
  KvCacheDType kv_dtype = KvCacheDType::kAuto;  // kv_cache_dtype of the C and Python APIs
  float q_scale = 1.0f;                         // applies when q is fp8 (kFp8E4m3 or kU8)
  float k_scale = 1.0f;                         // applies to kFp8E4m3 caches
  // L, the latent width: out.shape[3] must equal it, and V = entry[0:L]. 0 takes L from
  // out.shape[3] unchecked (kept for callers that predate the argument; pass L).
  int64_t kv_lora_rank = 0;
  // q_scale and k_scale as tensors ("Scales as tensors" above, with one difference: f32 of one
  // element (any shape) or a one-dimensional [B] tensor of one value per request, any stride
  // >= 0), as vLLM and FlashMLA pass descale_q / descale_k; set, they replace the float of the
  // same name.
  // Not overlapping out, lse or split_workspace. CPU: every value is read at once and checked as
  // the float is (finite and > 0, even where it does not apply; "q_scale[b]" names a bad one).
  // CUDA: the kernel reads them when it runs (capturable; replays use the values then held); a
  // value that is not finite and > 0 makes the rows of the requests it belongs to NaN and is
  // recorded for check_device_errors.
  std::optional<TensorView> q_scale_tensor = std::nullopt;  // f32 [1] or [B], on q's device
  std::optional<TensorView> k_scale_tensor = std::nullopt;  // f32 [1] or [B], on q's device
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
// schedule:        plan_mla_decode(...) for the same batch (below): host splits for the CPU,
//                  device-planned (shape only) for CUDA
// split_workspace: f32 with >= mla_decode_workspace_elems(...) elements (partial results; on
//                  CUDA also the work plan the GPU computes from seq_lens), 16-byte aligned on
//                  CUDA. On CUDA the call allocates nothing and never synchronizes: capturable in
//                  a CUDA graph, whose replays follow new seq_lens and block tables.
void mla_decode(const TensorView& q, const TensorView& kv_cache, const TensorView& block_table,
                const TensorView& seq_lens, const TensorView& out, const TensorView& lse,
                const DecodeParams& params, const DecodeSchedule& schedule,
                const TensorView& split_workspace, Stream stream = {});
int64_t mla_decode_workspace_elems(const DecodeSchedule& schedule, int64_t s_q, int64_t num_heads,
                                   int64_t kv_lora_rank);
// The split-KV schedule of one mla_decode call, chosen by the backend of `device`: the one place
// where the caller (e.g. the MlaAttention orchestrator) asks a backend how to cut the keys. CPU:
// a kHostSplits schedule from the host seq_lens. CUDA: a kDevicePlanned schedule from the shape
// only; the GPU cuts the batch's key tiles into near-equal shares per SM at run time, crossing
// request boundaries (docs/kernels/decode_sm90.md, "Schedule"). batch_invariant: every request is
// cut by its own seq_len only, so its out and lse bits do not depend on the rest of the batch or
// on B (at some cost in speed; on the GPU also in workspace).
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
// the decode will read; one above max_seq_len throws kInvalidArgument naming its index); the GPU
// schedule depends on the shape only (seq_lens may be empty), so a captured CUDA graph serves any
// lengths up to max_seq_len (a longer one is a bad index: NaN rows and the device error word).
DecodeSchedule plan_mla_decode(const DecodePlanShape& shape, std::span<const int32_t> seq_lens);
// Plans ahead, for schedules the device plans at run time (kDevicePlanned): writes the work plan
// for the device seq_lens into split_workspace now, on `stream`, and returns the schedule marked
// planned_ahead, with which every mla_decode of the same seq_lens (unchanged since) and
// split_workspace skips planning, e.g. every layer of one engine step. Other schedules are
// returned as they are. Not graph-capturable by itself is no concern: plan_step calls it before
// the layers (and before a graph replay).
// block_table:     i32 [B, max_blocks] (its width bounds the lengths, as in mla_decode)
// seq_lens:        i32 [B] on the device
// split_workspace: f32 with >= mla_decode_workspace_elems(schedule, s_q, N, kv_lora_rank) elements
DecodeSchedule mla_decode_plan_ahead(const DecodeSchedule& schedule, const TensorView& block_table,
                                     const TensorView& seq_lens, int64_t block_size,
                                     int64_t kv_lora_rank, const TensorView& split_workspace,
                                     Stream stream = {});

// The largest mla_decode_workspace_elems of any schedule plan_mla_decode returns for `shape`, over
// all seq_lens up to shape.max_seq_len: sizes an engine's workspace up front.
int64_t mla_decode_max_workspace_elems(const DecodePlanShape& shape, int64_t kv_lora_rank);

// Convenience form: plans with plan_mla_decode's choice (max_seq_len = block_table width x
// block_size, at most 2^31 - 1) and allocates the workspace itself. For CUDA tensors it runs on
// the default stream and waits for it before returning (it frees the workspace): not graph-safe,
// and slower than the scheduled form with a reused workspace.
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

// Creates, outside any CUDA-graph capture, what the ops of `device` keep per stream (CUDA: the
// cuBLAS handle and workspace of batched_matmul), so that a later capture on `stream` allocates
// nothing. plan_step calls it; idempotent, and cheap after the first call. A no-op on the CPU.
void prepare_stream(Device device, Stream stream = {});

// max |x| over every element of x (f32/f16/bf16, any strides, any device): NaN when an element is
// NaN, 0 for an empty x. The result is read on the host, so a GPU call synchronizes `stream`:
// for calibration (MlaAttention::calculate_kv_scales), not inside a captured graph.
float abs_max(const TensorView& x, Stream stream = {});

// ---- Device-side index checks
// ------------------------------------------------------------------------ The index tensors of
// GPU ops (slot_mapping, block tables, token_to_seq, cu_seqlens, ...) live in device memory, and
// reading them on the host would synchronize and break CUDA-graph capture. So the CUDA kernels
// check every index they read: a bad one is skipped (nothing out of bounds is read or written)
// and recorded in a per-device error word. check_device_errors waits for `stream`, then throws
// Error(kOutOfRange) naming every kind of bad index recorded on `device` since the last call, and
// clears the record. Call it where a synchronization is fine (a step end, after a graph replay).
// A no-op for the CPU, whose ops check indices on the host and throw at once. mla_decode also
// turns the output rows of a request with a bad block id or seq_len into NaN. Scales read on the
// device ("Scales as tensors") that are not finite and > 0 are recorded and reported here too.
void check_device_errors(Device device, Stream stream = {});

// ---- GEMMs (BLAS on CPU, cuBLAS on GPU)
// ---------------------------------------------------------- c[b] = a[b] @ w[b] for every batch
// index b, f32 accumulation. a: [batch, M, K]  w: [batch, K, Ncol]  c: [batch, M, Ncol] Any
// strides; the innermost dimension of each operand must be contiguous or the second one (a
// transposed matrix). Used for q absorption (a = q_nope^T per head, w = W_UK_T), the V
// up-projection (a = o_lat^T per head, w = W_UV) and kv_b_proj (batch 1, w = weight^T).
void batched_matmul(const TensorView& a, const TensorView& w, const TensorView& c,
                    Stream stream = {});

// ---- Decode context parallelism (spec A.3, A.9, B.7, C.6; docs/dcp.md) --------------------------
// The cache slot of every token on DCP rank dcp.rank (placement in mlakit/dcp.hpp): -1 for a
// token another rank owns or with a negative position (padding); otherwise
// block_table[r, j / block_size] * block_size + j % block_size, with r = token_to_req[t] and j
// the token's local position. Feed the result to concat_and_cache_mla. A request out of range, a
// column beyond the table or a negative block id: the CPU throws; the GPU writes -1 for that token
// and records it for check_device_errors.
// positions:    i64 [T] global position of each token in its request
// token_to_req: i32 [T] request (block-table row) of each token
// block_table:  i32 [R, max_blocks] this rank's table
// slot_mapping: i64 [T] (output)
void dcp_slot_mapping(const TensorView& positions, const TensorView& token_to_req,
                      const TensorView& block_table, int64_t block_size, const DcpConfig& dcp,
                      const TensorView& slot_mapping, Stream stream = {});

// The LSE-corrected combine of W partial attention results over disjoint key sets (spec A.9:
// the math of vLLM's cp_lse_ag_out_rs, without the collectives; spec C.6): for every (t, h)
//   lse = ln sum_k exp(lse_k),   out = sum_k exp(lse_k - lse) * out_k
// with f32 weights, summed in f32 in rank order and rounded once to out's dtype. LSEs of NaN or
// +inf read as -inf (an empty key set). A rank of weight 0 is never read, so the NaN or garbage
// of a rank holding no key of a request cannot reach the result (F-5, F-10, F-12); all ranks
// empty gives out 0 and lse -inf.
// partial_out:              [W, T, H, D]  f32, f16 or bf16; any strides, D contiguous
// partial_lse_tokens_heads: f32 [W, T, H]; any strides
// out:                      [T, H, D]  f32, f16 or bf16; any strides, D contiguous; must not
//                           overlap partial_out
// out_lse_tokens_heads:     f32 [T, H] or absent
void dcp_lse_combine(const TensorView& partial_out, const TensorView& partial_lse_tokens_heads,
                     const TensorView& out, const std::optional<TensorView>& out_lse_tokens_heads,
                     Stream stream = {});

// One rank's half of the combine, before a reduce-scatter sums the ranks' results (vLLM's
// correct_attn_out): with lse combined from the W rows of all_lse_tokens_heads as above,
//   corrected[t, k, n, :] = exp(all_lse[rank, t, h] - lse[t, h]) * partial_out[t, h, :],
//   h = k * (H / W) + n,
// i.e. the heads grouped by the rank k that keeps them after the reduce-scatter; 0 where the
// weight is 0 (partial_out not read). Summing `corrected` over the ranks gives dcp_lse_combine's
// out (to f32 rounding when corrected is f32).
// partial_out:          [T, H, D]  f32, f16 or bf16; any strides, D contiguous
// all_lse_tokens_heads: f32 [W, T, H]; row k is rank k's lse; any strides
// corrected:            [T, W, H / W, D]  f32, f16 or bf16; any strides, D contiguous; must not
//                       overlap partial_out
void dcp_lse_correct(const TensorView& partial_out, const TensorView& all_lse_tokens_heads,
                     int64_t rank, const TensorView& corrected, Stream stream = {});

// dst row t = src row row_index[t], dequantized as gather_and_maybe_dequant_cache does (cast for
// kAuto, fp8 * scale for kFp8E4m3, tile scales for kFp8DsMla): the reorganisation of an
// all-gathered DCP context chunk into global token order (B.7 step 3). An index outside
// [0, rows): the CPU throws; the GPU skips the row and records it for check_device_errors.
// src:       [rows, entry_width]  the cache's storage dtype; entry contiguous
// dst:       [>= num_tokens, L + R]  f32, f16 or bf16; last dim contiguous
// row_index: i32 [num_tokens]
void gather_rows_and_maybe_dequant(const TensorView& src, const TensorView& dst,
                                   const TensorView& row_index, KvCacheDType kv_dtype, float scale,
                                   Stream stream = {});

// The row_index of one DCP context chunk for gather_rows_and_maybe_dequant (DcpContextChunk::
// gathered_row of plan_dcp_context_chunks), computed where the tensors live, so that a step uploads
// O(W np) offsets per chunk instead of one index per row. With W = rank_cu_seq_lens.shape[0] and
// I = interleave, row t of request r (cu_seq_lens[r] <= t < cu_seq_lens[r + 1]) is position
// p = seq_starts[r] + t - cu_seq_lens[r], held by rank k = (p / I) % W, and
//   row_index[t] = k * rows_per_rank + rank_cu_seq_lens[k, r]
//                  + dcp_local_position(p, W, I) - seq_starts[r] / W.
// Every non-empty piece starts at a multiple of W I, as plan_dcp_context_chunks' do.
// cu_seq_lens:      i32 [np + 1] the chunk's rows in global token order (0, non-decreasing)
// seq_starts:       i32 [np] first global position of each request's piece
// rank_cu_seq_lens: i32 [W, np + 1] row k: rank k's rows of each request in its slice
// row_index:        i32 [>= num_tokens] (output), num_tokens <= cu_seq_lens[np]
// A row outside every request or a result outside [0, W rows_per_rank): the CPU throws before it
// writes any row (row_index is left as it was); the GPU writes -1, which
// gather_rows_and_maybe_dequant then skips and records.
void dcp_gathered_rows(const TensorView& cu_seq_lens, const TensorView& seq_starts,
                       const TensorView& rank_cu_seq_lens, int64_t rows_per_rank,
                       int64_t interleave, const TensorView& row_index, int64_t num_tokens,
                       Stream stream = {});

}  // namespace mlakit::ops
