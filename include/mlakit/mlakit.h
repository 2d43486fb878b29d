/* mlakit C ABI: the library for C programs and for bindings (Python ctypes, other FFIs).
 *
 * Conventions (every function):
 *  - Returns a mlakit_status_t; MLAKIT_OK (0) on success. On failure the calling thread's
 *    mlakit_last_error() holds a message naming the function, the argument, what was expected and
 *    what was given. Successful calls leave the message unchanged. No function aborts or lets an
 *    exception escape.
 *  - Tensors are DLPack DLTensors (dlpack.h), borrowed for the duration of the call only: shape
 *    and strides in elements (strides >= 0), strides NULL = dense row-major, byte_offset
 *    honoured, at most 4 dimensions, lanes 1. Element types: float32, float16, bfloat16
 *    (kDLBfloat), float8 e4m3fn (kDLFloat8_e4m3fn; fp8 data may also be given as uint8), uint8,
 *    int32, int64. Devices: kDLCPU (and kDLCUDAHost, pinned host memory, read as host memory) and
 *    kDLCUDA.
 *  - Optional tensors are passed as NULL.
 *  - `stream` is a cudaStream_t for CUDA tensors (NULL = the default stream); CPU calls ignore it
 *    and run synchronously on the calling thread (spreading work over OpenMP threads).
 *  - Shapes below use the names of DESIGN.md: N heads, L = kv_lora_rank (512), R =
 *    qk_rope_head_dim (64), P = qk_nope_head_dim (128), V = v_head_dim (128).
 *  - LSE is float32, natural log. "heads_tokens" LSEs are [N, T], decode LSEs are [B, s_q, N].
 *  - Handles (mlakit_plan_t, mlakit_attention_t, ...) are opaque, created by *_create/make/plan
 *    functions and released by their *_destroy function (NULL is accepted and ignored).
 */
#ifndef MLAKIT_MLAKIT_H_
#define MLAKIT_MLAKIT_H_

#include <stdint.h>

#include "mlakit/dlpack.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define MLAKIT_API __attribute__((visibility("default")))
#else
#define MLAKIT_API
#endif

/* Raised whenever a struct or a signature of this header changes incompatibly. */
#define MLAKIT_C_ABI_VERSION 4

/* ---- Status, errors, version ----------------------------------------------------------------- */

/* Mirrors mlakit::ErrorCode (error.hpp). */
typedef enum mlakit_status {
  MLAKIT_OK = 0,
  MLAKIT_ERROR_INVALID_ARGUMENT = 1, /* a caller-supplied value is wrong (shape, dtype, layout) */
  MLAKIT_ERROR_OUT_OF_RANGE = 2,     /* an index (slot, block id, position) is outside its range */
  MLAKIT_ERROR_UNSUPPORTED = 3,      /* valid, but this build or backend cannot serve it */
  MLAKIT_ERROR_BACKEND = 4,          /* CUDA, BLAS or memory allocation failed */
  MLAKIT_ERROR_INTERNAL = 5,         /* a broken invariant inside mlakit (a bug) */
} mlakit_status_t;

/* Message of the last failed call on this thread ("" if none); valid until the next failing call
 * on the same thread. */
MLAKIT_API const char* mlakit_last_error(void);
/* "ok", "invalid_argument", "out_of_range", "unsupported", "backend", "internal". */
MLAKIT_API const char* mlakit_status_name(int32_t status);
/* Library version, e.g. "0.1.0". */
MLAKIT_API const char* mlakit_version(void);
/* MLAKIT_C_ABI_VERSION of the compiled library (bindings compare it with theirs). */
MLAKIT_API int32_t mlakit_abi_version(void);
/* One-line JSON object describing the build, e.g.
 * {"version": "0.1.0", "abi": 4, "cuda": false, "blas": "openblas", "openmp": true,
 *  "threads": 8, "sanitizers": false}. "threads" is the CPU backend's thread count at the first
 * call (OMP_NUM_THREADS or the number of cores). */
MLAKIT_API const char* mlakit_build_info(void);

/* ---- Enumerations ------------------------------------------------------------------------------
 */
/* Enumerated arguments travel as int32_t (the size of a C enum is the compiler's choice); each
 * such parameter names its enumeration. */

/* Storage format of the paged latent cache (kv_cache.hpp). */
typedef enum mlakit_kv_cache_dtype {
  MLAKIT_KV_CACHE_AUTO = 0,       /* activation dtype, entry [kv_c (L) | k_pe (R)] */
  MLAKIT_KV_CACHE_FP8_E4M3 = 1,   /* e4m3 of x / k_scale, one scale per tensor */
  MLAKIT_KV_CACHE_FP8_DS_MLA = 2, /* DeepSeek's 656-byte entry */
} mlakit_kv_cache_dtype_t;

/* vLLM's names: "auto", "bfloat16", "float16" (= auto), "fp8", "fp8_e4m3", "fp8_ds_mla". */
MLAKIT_API mlakit_status_t mlakit_parse_kv_cache_dtype(const char* name,
                                                       int32_t* kv_cache_dtype /* out */);

typedef enum mlakit_query_len_support {
  MLAKIT_QUERY_LEN_SINGLE_ONLY = 0, /* every decode has q_len 1 */
  MLAKIT_QUERY_LEN_UNIFORM = 1,     /* the decodes of a batch share one q_len */
  MLAKIT_QUERY_LEN_VARLEN = 2,      /* decodes may differ in q_len */
} mlakit_query_len_support_t;

typedef enum mlakit_chunk_policy {
  MLAKIT_CHUNK_EQUAL_SHARE = 0, /* vLLM: each request gets an equal share of the workspace */
  MLAKIT_CHUNK_PACKED = 1,      /* fill each chunk with whole contexts (fewer chunks) */
} mlakit_chunk_policy_t;

/* ---- Cache ops ---------------------------------------------------------------------------------
 */

/* vLLM concat_and_cache_mla. Writes token t (t < T) into slot slot_mapping[t] (< 0 skips).
 * kv_c: [T', L] act (row stride may exceed L); k_pe: [T', R] act; kv_cache: [num_blocks,
 * block_size, entry_width]; slot_mapping: int64 [T]; scale: k_scale of fp8 caches (> 0). */
MLAKIT_API mlakit_status_t mlakit_concat_and_cache_mla(
    const DLTensor* kv_c, const DLTensor* k_pe, const DLTensor* kv_cache,
    const DLTensor* slot_mapping, int32_t kv_cache_dtype /* mlakit_kv_cache_dtype_t */, float scale,
    void* stream);

/* vLLM gather_and_maybe_dequant_cache: row t < num_tokens of dst comes from request
 * b = token_to_seq[t], position t - cu_seq_lens[b] + seq_starts[b] (seq_starts may be NULL),
 * dequantized (fp8: value * scale) to dst's dtype.
 * src_cache: [num_blocks, block_size, entry_width]; dst: [>= num_tokens, L + R] f32/f16/bf16;
 * block_table: int32 [B, max_blocks]; cu_seq_lens: int32 [B + 1]; token_to_seq: int32
 * [>= num_tokens]; seq_starts: int32 [B] or NULL. */
MLAKIT_API mlakit_status_t mlakit_gather_and_maybe_dequant_cache(
    const DLTensor* src_cache, const DLTensor* dst, const DLTensor* block_table,
    const DLTensor* cu_seq_lens, const DLTensor* token_to_seq, int64_t num_tokens,
    int32_t kv_cache_dtype /* mlakit_kv_cache_dtype_t */, float scale, const DLTensor* seq_starts,
    void* stream);

/* The two cache ops above with the scale given as a tensor (ops.hpp "Scales as tensors"): scale is
 * a float32 DLTensor of exactly one element (any shape) on the device of the other tensors, not
 * overlapping kv_cache / dst, as vLLM passes k_scale. CPU: read at once and checked as the float
 * argument is. CUDA: read by the kernel when it runs (no host read, no synchronization, no
 * allocation: capturable in a CUDA graph whose replays use the value the tensor then holds); a
 * value that is not finite and > 0 writes NaN (NaN e4m3 codes into the cache, NaN rows from the
 * gather) and is reported by mlakit_check_device_errors. The value is used only for
 * MLAKIT_KV_CACHE_FP8_E4M3. */
MLAKIT_API mlakit_status_t mlakit_concat_and_cache_mla_tensor_scale(
    const DLTensor* kv_c, const DLTensor* k_pe, const DLTensor* kv_cache,
    const DLTensor* slot_mapping, int32_t kv_cache_dtype /* mlakit_kv_cache_dtype_t */,
    const DLTensor* scale, void* stream);
MLAKIT_API mlakit_status_t mlakit_gather_and_maybe_dequant_cache_tensor_scale(
    const DLTensor* src_cache, const DLTensor* dst, const DLTensor* block_table,
    const DLTensor* cu_seq_lens, const DLTensor* token_to_seq, int64_t num_tokens,
    int32_t kv_cache_dtype /* mlakit_kv_cache_dtype_t */, const DLTensor* scale,
    const DLTensor* seq_starts, void* stream);

/* vLLM cp_gather_cache: raw copy of request b's positions [seq_starts[b], + len_b) into dst rows
 * [cu_seq_lens[b], cu_seq_lens[b + 1]). src_cache: [num_blocks, block_size, W]; dst: [rows, W]
 * of the same dtype; block_table: int32 [>= batch_size, max_blocks]; cu_seq_lens: int32
 * [batch_size + 1]; seq_starts: int32 [batch_size] or NULL. */
MLAKIT_API mlakit_status_t mlakit_cp_gather_cache(const DLTensor* src_cache, const DLTensor* dst,
                                                  const DLTensor* block_table,
                                                  const DLTensor* cu_seq_lens, int64_t batch_size,
                                                  const DLTensor* seq_starts, void* stream);

/* ---- Attention pieces --------------------------------------------------------------------------
 */

/* vLLM merge_attn_states (argument order as vLLM's). output, prefix_output, suffix_output:
 * [T, H, D] f32/f16/bf16; prefix_lse, suffix_lse: f32 [H, T]; output_lse: f32 [H, T] or NULL.
 * Both sides -inf gives output 0 and lse -inf. output may alias prefix_output or suffix_output. */
MLAKIT_API mlakit_status_t mlakit_merge_attn_states(const DLTensor* output,
                                                    const DLTensor* prefix_output,
                                                    const DLTensor* prefix_lse,
                                                    const DLTensor* suffix_output,
                                                    const DLTensor* suffix_lse,
                                                    const DLTensor* output_lse, void* stream);

/* Decode context parallelism (docs/dcp.md): the LSE-corrected combine of W ranks' partial
 * attention results over disjoint key sets, without a communicator (vLLM's cp_lse_ag_out_rs math):
 * lse = ln sum_k exp(lse_k), out = sum_k exp(lse_k - lse) out_k, f32 sums in rank order. An LSE of
 * -inf, NaN or +inf weighs 0 (that rank's out_k is not read); all ranks empty: out 0, lse -inf.
 * partial_out: [W, T, H, D] f32/f16/bf16; partial_lse_tokens_heads: f32 [W, T, H];
 * out: [T, H, D] f32/f16/bf16, not overlapping partial_out;
 * out_lse_tokens_heads: f32 [T, H] or NULL. */
MLAKIT_API mlakit_status_t mlakit_dcp_lse_combine(const DLTensor* partial_out,
                                                  const DLTensor* partial_lse_tokens_heads,
                                                  const DLTensor* out,
                                                  const DLTensor* out_lse_tokens_heads,
                                                  void* stream);

/* One rank's half of that combine, before a reduce-scatter (sum) over the ranks (vLLM's
 * correct_attn_out): corrected[t, k, n, :] = exp(all_lse_tokens_heads[rank, t, h] - lse[t, h])
 * partial_out[t, h, :] with h = k (H / W) + n, 0 where the weight is 0. partial_out: [T, H, D]
 * f32/f16/bf16; all_lse_tokens_heads: f32 [W, T, H] (every rank's, e.g. all-gathered); corrected:
 * [T, W, H / W, D] f32/f16/bf16, not overlapping partial_out. */
MLAKIT_API mlakit_status_t mlakit_dcp_lse_correct(const DLTensor* partial_out,
                                                  const DLTensor* all_lse_tokens_heads,
                                                  int64_t rank, const DLTensor* corrected,
                                                  void* stream);

/* Static per-tensor fp8 quantization: out = e4m3(clamp(input * (1 / scale), -448, 448)).
 * input: any float dtype; out: fp8 e4m3 or uint8, same shape. */
MLAKIT_API mlakit_status_t mlakit_scaled_fp8_quant(const DLTensor* input, const DLTensor* out,
                                                   float scale, void* stream);
/* The same with scale a float32 one-element DLTensor on input's device, not overlapping out, read
 * as the cache ops' tensor scales are (above): on CUDA by the kernel, capturable; a value that is
 * not finite and > 0 with a finite reciprocal writes NaN codes and is reported by
 * mlakit_check_device_errors. */
MLAKIT_API mlakit_status_t mlakit_scaled_fp8_quant_tensor_scale(const DLTensor* input,
                                                                const DLTensor* out,
                                                                const DLTensor* scale,
                                                                void* stream);
/* Dynamic per-tensor fp8 quantization: scale (float32, one element, input's device, not
 * overlapping input or out; written) = amax(|input|) / 448 in f32, then out as
 * mlakit_scaled_fp8_quant_tensor_scale with it. An all-zero or empty input gives scale 0 and
 * every code 0. On CUDA all of it runs on the device (capturable). A scale with no finite
 * reciprocal (inf or NaN in input): the CPU writes scale and returns MLAKIT_ERROR_INVALID_ARGUMENT;
 * CUDA writes NaN codes and reports it through mlakit_check_device_errors. */
MLAKIT_API mlakit_status_t mlakit_dynamic_scaled_fp8_quant(const DLTensor* input,
                                                           const DLTensor* out,
                                                           const DLTensor* scale, void* stream);

/* Device-side index checks (ops.hpp check_device_errors): GPU kernels skip a bad index (slot,
 * block table entry, request id, cu_seqlens) instead of synchronizing, and record it per device.
 * Waits for `stream`, then returns MLAKIT_ERROR_OUT_OF_RANGE naming every kind of bad index seen
 * on the device since the last call (and clears the record), else MLAKIT_OK. device_type: a
 * DLDeviceType (kDLCPU / kDLCUDAHost: nothing to check, MLAKIT_OK; kDLCUDA: device_id). */
MLAKIT_API mlakit_status_t mlakit_check_device_errors(int32_t device_type, int32_t device_id,
                                                      void* stream);

/* Absorbed MQA decode over the paged cache, convenience form (it plans the split-KV schedule
 * itself, with mlakit_plan_mla_decode's choice, and allocates its workspace). Query j of request b
 * attends keys [0, seq_lens[b] - s_q + j]; seq_lens count the new tokens too, so each is 0 (out 0,
 * lse -inf) or at least s_q (on the GPU a bad one gives NaN rows and the device error word).
 * q: [B, s_q, N, L + R] act (or fp8 for fp8 caches, dequantized with q_scale); kv_cache:
 * [num_blocks, block_size, entry_width]; block_table: int32 [B, max_blocks]; seq_lens: int32 [B];
 * out: [B, s_q, N, L] f32/f16/bf16; lse: f32 [B, s_q, N]; kv_lora_rank: L (> 0, out's last
 * dimension must equal it); scale: softmax scale (> 0); k_scale: scale of fp8 e4m3 caches. CUDA
 * tensors: runs on the default stream and waits for it (it frees its workspace), so it cannot be
 * captured in a CUDA graph; use mlakit_mla_decode_scheduled there. */
MLAKIT_API mlakit_status_t mlakit_mla_decode(const DLTensor* q, const DLTensor* kv_cache,
                                             const DLTensor* block_table, const DLTensor* seq_lens,
                                             const DLTensor* out, const DLTensor* lse,
                                             int64_t kv_lora_rank, float scale,
                                             int32_t kv_cache_dtype /* mlakit_kv_cache_dtype_t */,
                                             float q_scale, float k_scale);

/* The split-KV schedule of a decode call. */
typedef struct mlakit_decode_schedule mlakit_decode_schedule_t;
/* The shape of one mlakit_mla_decode_scheduled call, for planning. */
typedef struct mlakit_decode_plan_shape {
  DLDevice device;         /* where the decode runs (kDLCPU or kDLCUDA) */
  int64_t batch;           /* B */
  int64_t s_q;             /* queries per request (>= 1) */
  int64_t num_heads;       /* N (>= 1) */
  int64_t block_size;      /* tokens per cache block (>= 1) */
  int64_t max_seq_len;     /* bound on every seq_len, e.g. block_table width * block_size */
  int32_t batch_invariant; /* nonzero: pieces depend on each request's own seq_len only */
} mlakit_decode_plan_shape_t;
/* The schedule the library chooses for `shape` on its device (what mlakit_mla_decode and the
 * attention layer use). The CPU plans from seq_lens (host int32 [batch], required; a seq_len
 * above max_seq_len returns MLAKIT_ERROR_INVALID_ARGUMENT naming its index); a CUDA
 * schedule depends on the shape only (seq_lens may be NULL): the GPU cuts the keys at run time, so
 * the schedule serves any lengths up to max_seq_len (a longer seq_len gives NaN rows and the
 * device error word) and any block tables, also in a captured CUDA graph. */
MLAKIT_API mlakit_status_t mlakit_plan_mla_decode(const mlakit_decode_plan_shape_t* shape,
                                                  const int32_t* seq_lens,
                                                  mlakit_decode_schedule_t** schedule);
/* The CPU's schedule with an explicit worker count. seq_lens: host int32 [num_seqs]; num_workers:
 * parallel workers to spread the splits over. */
MLAKIT_API mlakit_status_t mlakit_plan_decode_splits(const int32_t* seq_lens, int64_t num_seqs,
                                                     int64_t block_size, int64_t num_workers,
                                                     mlakit_decode_schedule_t** schedule);
MLAKIT_API void mlakit_decode_schedule_destroy(mlakit_decode_schedule_t* schedule);
MLAKIT_API mlakit_status_t mlakit_decode_schedule_info(const mlakit_decode_schedule_t* schedule,
                                                       int64_t* total_splits, int64_t* max_splits);
/* f32 elements the split workspace of mlakit_mla_decode_scheduled needs (the schedule's own
 * s_q and num_heads for a CUDA schedule). */
MLAKIT_API mlakit_status_t mlakit_decode_workspace_elems(const mlakit_decode_schedule_t* schedule,
                                                         int64_t s_q, int64_t num_heads,
                                                         int64_t kv_lora_rank, int64_t* elems);
/* mlakit_mla_decode with a schedule from mlakit_plan_mla_decode (a CPU one for the same seq_lens,
 * a CUDA one for the same shape) and a caller-owned f32 split_workspace on the tensors' device
 * (16-byte aligned on CUDA): allocates nothing, so it can be captured in a CUDA graph. */
MLAKIT_API mlakit_status_t mlakit_mla_decode_scheduled(
    const DLTensor* q, const DLTensor* kv_cache, const DLTensor* block_table,
    const DLTensor* seq_lens, const DLTensor* out, const DLTensor* lse, int64_t kv_lora_rank,
    float scale, int32_t kv_cache_dtype /* mlakit_kv_cache_dtype_t */, float q_scale, float k_scale,
    const mlakit_decode_schedule_t* schedule, const DLTensor* split_workspace, void* stream);
/* The two decode entries above with q_scale and k_scale given as tensors, as vLLM and FlashMLA pass
 * their descales: each a float32 DLTensor of one element (any shape) or of shape [B] (request b's
 * value at [b], any stride >= 0) on the device of q, not overlapping out, lse or split_workspace;
 * NULL takes 1 (the float argument's default). A value applies where the float would (q_scale to an
 * fp8 q, k_scale to an fp8_e4m3 cache) and is checked everywhere. CPU: read at once and checked as
 * the floats are (a bad one returns MLAKIT_ERROR_INVALID_ARGUMENT naming "q_scale" or
 * "q_scale[b]"). CUDA: read by the kernel when it runs (the scheduled form is capturable in a CUDA
 * graph whose replays use the values the tensors then hold); a value that is not finite and > 0
 * makes the rows of its requests NaN and is reported by mlakit_check_device_errors. */
MLAKIT_API mlakit_status_t mlakit_mla_decode_tensor_scale(
    const DLTensor* q, const DLTensor* kv_cache, const DLTensor* block_table,
    const DLTensor* seq_lens, const DLTensor* out, const DLTensor* lse, int64_t kv_lora_rank,
    float scale, int32_t kv_cache_dtype /* mlakit_kv_cache_dtype_t */, const DLTensor* q_scale,
    const DLTensor* k_scale);
MLAKIT_API mlakit_status_t mlakit_mla_decode_scheduled_tensor_scale(
    const DLTensor* q, const DLTensor* kv_cache, const DLTensor* block_table,
    const DLTensor* seq_lens, const DLTensor* out, const DLTensor* lse, int64_t kv_lora_rank,
    float scale, int32_t kv_cache_dtype /* mlakit_kv_cache_dtype_t */, const DLTensor* q_scale,
    const DLTensor* k_scale, const mlakit_decode_schedule_t* schedule,
    const DLTensor* split_workspace, void* stream);

/* Varlen MHA prefill with d_qk = P + R, d_v = V; request b has queries [cu_seqlens_q[b],
 * cu_seqlens_q[b+1]) and keys [cu_seqlens_k[b], cu_seqlens_k[b+1]); causal is bottom-right.
 * q: [T, N, P + R]; k_nope: [S, N, P]; k_pe: [S, R] (shared by the heads); v: [S, N, V];
 * cu_seqlens_q, cu_seqlens_k: int32 [B + 1]; out: [T, N, V]; lse: f32 [N, T] or NULL. */
MLAKIT_API mlakit_status_t mlakit_mla_prefill(const DLTensor* q, const DLTensor* k_nope,
                                              const DLTensor* k_pe, const DLTensor* v,
                                              const DLTensor* cu_seqlens_q,
                                              const DLTensor* cu_seqlens_k, int64_t max_seqlen_q,
                                              int64_t max_seqlen_k, float scale, int32_t causal,
                                              const DLTensor* out, const DLTensor* lse,
                                              void* stream);

/* ---- Planning (pure host code) -----------------------------------------------------------------
 */

typedef struct mlakit_split_counts {
  int64_t num_decodes;
  int64_t num_prefills;
  int64_t num_decode_tokens;
  int64_t num_prefill_tokens;
} mlakit_split_counts_t;

/* Decode/prefill split of a batch already ordered decodes-first. query_start_loc: [num_reqs + 1].
 */
MLAKIT_API mlakit_status_t mlakit_split_decodes_and_prefills(
    const int32_t* query_start_loc, int64_t num_reqs, int64_t num_actual_tokens,
    int64_t decode_threshold, int32_t require_uniform, mlakit_split_counts_t* counts);

/* Decodes-first order: order[i] (caller-allocated, [num_reqs]) = input index of the request
 * placed at position i. num_scheduled, num_computed: [num_reqs]. */
MLAKIT_API mlakit_status_t mlakit_reorder_decodes_first(const int32_t* num_scheduled,
                                                        const int32_t* num_computed,
                                                        int64_t num_reqs, int64_t decode_threshold,
                                                        int32_t* order);

/* Rows of the chunked-context gather workspace (spec B.2). */
MLAKIT_API mlakit_status_t mlakit_chunked_prefill_workspace_tokens(int64_t max_model_len,
                                                                   int64_t max_num_seqs,
                                                                   int64_t block_size,
                                                                   int64_t* tokens);

typedef struct mlakit_planner_config {
  int64_t block_size;        /* KV page size */
  int64_t decode_threshold;  /* q_len <= threshold (with context) decodes */
  int32_t query_len_support; /* a mlakit_query_len_support_t */
  int32_t chunk_policy;      /* a mlakit_chunk_policy_t */
  int64_t workspace_tokens;  /* rows of the gather workspace (> 0) */
  int64_t num_workers;       /* parallel workers of the decode split schedule */
} mlakit_planner_config_t;
/* The library's defaults (block 64, threshold 1, varlen, packed, num_workers 1; workspace_tokens
 * must still be set). */
MLAKIT_API void mlakit_planner_config_init(mlakit_planner_config_t* config);

typedef struct mlakit_plan mlakit_plan_t;

/* The plan of one forward step. query_start_loc: host int32 [num_reqs + 1]; seq_lens: host int32
 * [num_reqs]; num_actual_tokens may exceed query_start_loc[num_reqs] (padded batches). */
MLAKIT_API mlakit_status_t mlakit_make_plan(const int32_t* query_start_loc, const int32_t* seq_lens,
                                            int64_t num_reqs, int64_t num_actual_tokens,
                                            int64_t block_table_width,
                                            const mlakit_planner_config_t* config,
                                            mlakit_plan_t** plan);
MLAKIT_API void mlakit_plan_destroy(mlakit_plan_t* plan);

typedef struct mlakit_plan_summary {
  int64_t num_reqs;
  int64_t num_actual_tokens;
  mlakit_split_counts_t split;
  int64_t decode_query_len; /* common q_len of the decodes (uniform), else 0 */
  int64_t max_decode_query_len;
  int64_t prefill_max_query_len;
  int64_t num_context_chunks;  /* 0 when no prefill has context */
  int64_t decode_total_splits; /* split-KV pieces of the decode schedule */
  int64_t decode_max_splits;   /* most pieces of one decode request */
} mlakit_plan_summary_t;
MLAKIT_API mlakit_status_t mlakit_plan_get_summary(const mlakit_plan_t* plan,
                                                   mlakit_plan_summary_t* summary);

typedef enum mlakit_plan_array {
  MLAKIT_PLAN_PREFILL_QUERY_START_LOC = 0, /* [num_prefills + 1], rebased to 0 */
  MLAKIT_PLAN_PREFILL_CONTEXT_LENS = 1,    /* [num_prefills] */
  MLAKIT_PLAN_DECODE_SPLIT_OFFSETS = 2,    /* [num_decodes + 1] cumulative split counts */
  MLAKIT_PLAN_DECODE_SPLIT_LEN = 3,        /* [num_decodes] tokens per split */
} mlakit_plan_array_t;
/* Borrowed pointer into the plan (valid until mlakit_plan_destroy); *data may be NULL when
 * *length is 0. */
MLAKIT_API mlakit_status_t mlakit_plan_get_array(const mlakit_plan_t* plan,
                                                 int32_t which /* mlakit_plan_array_t */,
                                                 const int32_t** data, int64_t* length);

typedef enum mlakit_chunk_array {
  MLAKIT_CHUNK_STARTS = 0,       /* [num_prefills] first context position gathered */
  MLAKIT_CHUNK_SEQ_LENS = 1,     /* [num_prefills] context tokens gathered */
  MLAKIT_CHUNK_CU_SEQ_LENS = 2,  /* [num_prefills + 1] workspace row offsets */
  MLAKIT_CHUNK_TOKEN_TO_SEQ = 3, /* [total_tokens] prefill request of each workspace row */
} mlakit_chunk_array_t;
/* Context chunk `chunk` (0 <= chunk < num_context_chunks). */
MLAKIT_API mlakit_status_t mlakit_plan_get_chunk_info(const mlakit_plan_t* plan, int64_t chunk,
                                                      int64_t* total_tokens, int64_t* max_seq_len);
MLAKIT_API mlakit_status_t mlakit_plan_get_chunk_array(const mlakit_plan_t* plan, int64_t chunk,
                                                       int32_t which /* mlakit_chunk_array_t */,
                                                       const int32_t** data, int64_t* length);

/* ---- MlaAttention: one MLA layer ------------------------------------------------------------- */

typedef struct mlakit_mla_config {
  int64_t num_heads;        /* N */
  int64_t kv_lora_rank;     /* L */
  int64_t qk_rope_head_dim; /* R */
  int64_t qk_nope_head_dim; /* P */
  int64_t v_head_dim;       /* V */
  float scale;              /* softmax scale of the model (> 0) */
  DLDataType act_dtype;     /* float32, float16 or bfloat16 */
  int32_t kv_cache_dtype;   /* a mlakit_kv_cache_dtype_t */
  int64_t block_size;
  int64_t decode_threshold;
  int32_t query_len_support; /* a mlakit_query_len_support_t */
  int32_t chunk_policy;      /* a mlakit_chunk_policy_t */
  int64_t workspace_tokens;  /* 0 = derived from max_model_len and max_num_seqs */
  /* Engine limits: a step's workspace (mlakit_workspace_bytes) is sized for the worst step. */
  int64_t max_model_len;          /* tokens of one request (context + new) */
  int64_t max_num_seqs;           /* requests of one step */
  int64_t max_num_batched_tokens; /* tokens of one step */
  /* 1: decode attention cuts each request's keys by its own length only, so its result is bitwise
   * the same whatever else is in the batch (the projections are not made invariant); 0: balanced
   * splits. */
  int32_t batch_invariant;
  DLDevice device; /* where the layer runs (weights, workspace) */
  /* Decode context parallelism (docs/dcp.md): the layer is rank dcp_rank of dcp_world_size ranks
   * sharing every request's tokens, position p on rank (p / dcp_interleave) % dcp_world_size.
   * dcp_world_size 1 is no DCP. With more, the layer needs the group's communicator
   * (mlakit_attention_create_dcp), each rank's batch has its own block table and an empty
   * slot_mapping, and seq_lens stay global (see mlakit_forward_batch_t). */
  int64_t dcp_world_size; /* W >= 1 */
  int64_t dcp_rank;       /* in [0, W) */
  int64_t dcp_interleave; /* I >= 1: consecutive positions a rank takes per turn */
} mlakit_mla_config_t;
/* The library's defaults: DeepSeek-V2-Lite dims (16, 512, 64, 128, 128), bf16, auto cache,
 * block 64, limits 4096 / 256 / 8192, not batch-invariant, CPU, no DCP (1, 0, 1); scale 0 (must
 * be set). */
MLAKIT_API void mlakit_mla_config_init(mlakit_mla_config_t* config);

typedef struct mlakit_attention mlakit_attention_t;

/* kv_b_proj_weight: host [N * (P + V), L] f32/f16/bf16, or fp8 e4m3 (or uint8) with
 * kv_b_proj_scale_inv: host f32 [ceil(N*(P+V) / 128), ceil(L / 128)] (NULL otherwise). */
MLAKIT_API mlakit_status_t mlakit_attention_create(const mlakit_mla_config_t* config,
                                                   const DLTensor* kv_b_proj_weight,
                                                   const DLTensor* kv_b_proj_scale_inv,
                                                   mlakit_attention_t** attention);
/* ---- Communicators: DCP collectives run by the caller ------------------------------------------
 * mlakit has no communication layer of its own (docs/dcp.md): a DCP layer's two collectives call
 * back into the caller, which runs them on the library it already uses (MPI, NCCL,
 * torch.distributed, ...). Each callback runs the collective (on a GPU it may instead enqueue it on
 * `stream`, a cudaStream_t, NULL = the default stream) and returns 0, or any other value on
 * failure: the mlakit call then fails with MLAKIT_ERROR_BACKEND naming the callback and the value.
 * Every rank calls them in the same order with the same counts, from the thread that called
 * mlakit. Buffers are contiguous, on the communicator's device; count > 0; mlakit checked them. */

/* recv = [send of rank 0 | send of rank 1 | ...], `count` elements each. dtype: float32,
 * float16, bfloat16, float8 e4m3fn or uint8 (the bytes are what matters). send is either recv's
 * slice `rank` (recv + rank * count elements: in place) or disjoint from recv. */
typedef int32_t (*mlakit_all_gather_fn)(void* user_data, const void* send, void* recv,
                                        int64_t count, DLDataType dtype, void* stream);
/* recv [recv_count] = sum over ranks k of rank k's send elements [rank * recv_count,
 * (rank + 1) * recv_count). send has world_size * recv_count elements; dtype: float32, float16 or
 * bfloat16; send and recv are disjoint. */
typedef int32_t (*mlakit_reduce_scatter_sum_fn)(void* user_data, const void* send, void* recv,
                                                int64_t recv_count, DLDataType dtype, void* stream);

typedef struct mlakit_communicator_callbacks {
  int32_t rank;       /* this rank, in [0, world_size) */
  int32_t world_size; /* >= 1 */
  DLDevice device;    /* where the buffers live: kDLCPU or kDLCUDA */
  mlakit_all_gather_fn all_gather;
  mlakit_reduce_scatter_sum_fn reduce_scatter_sum;
  void* user_data; /* passed to both callbacks; mlakit never reads it */
} mlakit_communicator_callbacks_t;

typedef struct mlakit_communicator mlakit_communicator_t;

/* A communicator calling `callbacks` (copied; user_data must stay valid while it is used). */
MLAKIT_API mlakit_status_t mlakit_communicator_create(
    const mlakit_communicator_callbacks_t* callbacks, mlakit_communicator_t** communicator);
MLAKIT_API void mlakit_communicator_destroy(mlakit_communicator_t* communicator);

/* mlakit_attention_create for a rank of a DCP group: communicator is the group's (borrowed: it
 * must outlive the layer), with rank, world size and device equal to config's dcp_rank,
 * dcp_world_size and device; it may be NULL when dcp_world_size is 1 (then it is ignored). */
MLAKIT_API mlakit_status_t mlakit_attention_create_dcp(const mlakit_mla_config_t* config,
                                                       const DLTensor* kv_b_proj_weight,
                                                       const DLTensor* kv_b_proj_scale_inv,
                                                       mlakit_communicator_t* communicator,
                                                       mlakit_attention_t** attention);
MLAKIT_API void mlakit_attention_destroy(mlakit_attention_t* attention);
/* Rows of the layer's context-gather workspace. */
MLAKIT_API mlakit_status_t mlakit_attention_workspace_tokens(const mlakit_attention_t* attention,
                                                             int64_t* tokens);

/* One forward step's batch, requests ordered decodes-first. */
typedef struct mlakit_forward_batch {
  const int32_t* query_start_loc; /* host [num_reqs + 1] */
  const int32_t* seq_lens;        /* host [num_reqs] context + new tokens */
  int64_t num_reqs;
  int64_t num_actual_tokens;    /* T: rows of q to process */
  const DLTensor* block_table;  /* int32 [num_reqs, max_blocks] on the layer's device */
  const DLTensor* slot_mapping; /* int64 [>= T] on the layer's device; < 0 skips the write */
} mlakit_forward_batch_t;
/* Under DCP (dcp_world_size > 1) seq_lens are the global lengths, the same on every rank;
 * block_table is this rank's, of its local positions (ceil(local length / block_size) columns a
 * request); slot_mapping is empty ([0]): planning derives this rank's slot of every token. */

/* The plan forward() would follow for `batch` (the caller destroys it). */
MLAKIT_API mlakit_status_t mlakit_attention_plan(const mlakit_attention_t* attention,
                                                 const mlakit_forward_batch_t* batch,
                                                 mlakit_plan_t** plan);

/* q: [T', N, P + R]; kv_c_normed: [T', L]; k_pe: [T', R] or [T', 1, R]; kv_cache: [num_blocks,
 * block_size, entry_width] (may be empty: then nothing is cached and no request may have
 * context); output: [T', N * V], rows [T, T') untouched. output and kv_cache (both written) must
 * not overlap each other, themselves, q, kv_c_normed or k_pe (MLAKIT_ERROR_INVALID_ARGUMENT, "must
 * not overlap"). batch NULL is a profile run (output is zero-filled). q_scale, k_scale: fp8 scales
 * (used and checked with fp8 caches only; other caches ignore them, whatever their value). A layer
 * handle must not run two forward calls at once (it owns one workspace). */
MLAKIT_API mlakit_status_t mlakit_attention_forward(mlakit_attention_t* attention,
                                                    const DLTensor* q, const DLTensor* kv_c_normed,
                                                    const DLTensor* k_pe, const DLTensor* kv_cache,
                                                    const mlakit_forward_batch_t* batch,
                                                    const DLTensor* output, float q_scale,
                                                    float k_scale, void* stream);

/* ---- Engine steps: plan once per step, run per layer ---------------------------------------- */
/* An engine serving an L-layer model sizes one workspace from its limits, runs the profile run,
 * then per step plans once and runs every layer against that plan:
 *
 *   mlakit_workspace_create(&config, &ws);  mlakit_workspace_touch(ws, stream);
 *   per step:  mlakit_plan_step(&config, &batch, ws, stream, &plan);
 *              for each layer: mlakit_attention_forward_step(layer, ..., plan, ..., stream);
 *              mlakit_step_plan_destroy(plan);
 *
 * mlakit_plan_step validates and plans the batch, carves the step's temporaries from the
 * workspace and uploads every index array in one asynchronous copy on `stream`. The forward calls
 * then only launch kernels (no host synchronization, allocation, planning or host-to-device copy),
 * so a decode-only step of all layers can be captured in one CUDA graph and replayed after a later
 * mlakit_plan_step whose plan has the same launches (mlakit_step_plan_same_launches) has written
 * the new lengths into the workspace. A workspace serves one step at a time: its calls must not
 * run concurrently (GPU: keep them ordered on one stream). */

typedef struct mlakit_workspace mlakit_workspace_t;
typedef struct mlakit_step_plan mlakit_step_plan_t;

/* Bytes of scratch the worst step within the configuration's limits needs (index metadata plus
 * the larger of the prefill and the decode temporaries), on config->device; independent of the
 * number of layers. Validates the configuration like mlakit_attention_create. */
MLAKIT_API mlakit_status_t mlakit_workspace_bytes(const mlakit_mla_config_t* config,
                                                  int64_t* bytes);

/* The scratch memory shared by every layer of a model: mlakit_workspace_bytes(config) on
 * config->device (plus a pinned host staging buffer for the index upload on a GPU), allocated
 * here once. Plans made on it keep it alive: destroying the handle while plans remain only drops
 * the caller's reference. */
MLAKIT_API mlakit_status_t mlakit_workspace_create(const mlakit_mla_config_t* config,
                                                   mlakit_workspace_t** workspace);
MLAKIT_API void mlakit_workspace_destroy(mlakit_workspace_t* workspace);
/* Bytes of the workspace's buffer. */
MLAKIT_API mlakit_status_t mlakit_workspace_get_bytes(const mlakit_workspace_t* workspace,
                                                      int64_t* bytes);
/* The profile run (spec A.12, F-44): writes every byte once (zeros) on `stream`, so that the
 * memory is committed before the engine sizes its KV cache. */
MLAKIT_API mlakit_status_t mlakit_workspace_touch(mlakit_workspace_t* workspace, void* stream);

/* Plans one step on `workspace`. config: equal to the workspace's in everything but the scale
 * (dims, dtypes, cache format, block size, decode threshold, chunking, batch invariance, device;
 * the limits are the workspace's). batch: as for mlakit_attention_forward; its host arrays are
 * copied, but its block_table and slot_mapping are borrowed by the plan: they must stay alive, at
 * the same address, until the plan's last forward (for CUDA graphs: the last replay). The plan is
 * valid until the next mlakit_plan_step on the same workspace (forward_step rejects it after that
 * as stale). MLAKIT_ERROR_INVALID_ARGUMENT names the limit (max_num_seqs, max_num_batched_tokens,
 * max_model_len) a step exceeds. */
MLAKIT_API mlakit_status_t mlakit_plan_step(const mlakit_mla_config_t* config,
                                            const mlakit_forward_batch_t* batch,
                                            mlakit_workspace_t* workspace, void* stream,
                                            mlakit_step_plan_t** plan);
MLAKIT_API void mlakit_step_plan_destroy(mlakit_step_plan_t* plan);

typedef struct mlakit_step_plan_info {
  int64_t num_reqs;
  int64_t num_actual_tokens;
  mlakit_split_counts_t split;
  int64_t num_context_chunks;   /* 0 when no prefill has context */
  int64_t workspace_bytes_used; /* bytes of the workspace this step uses */
} mlakit_step_plan_info_t;
MLAKIT_API mlakit_status_t mlakit_step_plan_get_info(const mlakit_step_plan_t* plan,
                                                     mlakit_step_plan_info_t* info);
/* A copy of the step's plan, for the mlakit_plan_get_* getters (the caller destroys it). */
MLAKIT_API mlakit_status_t mlakit_step_plan_get_plan(const mlakit_step_plan_t* plan,
                                                     mlakit_plan_t** copy);
/* *same = 1 when both plans launch the same kernels with the same arguments (same shapes, same
 * workspace addresses; lengths, block tables and slots may differ), so that a CUDA graph captured
 * while running `a` replays `b` correctly; else 0. */
MLAKIT_API mlakit_status_t mlakit_step_plan_same_launches(const mlakit_step_plan_t* a,
                                                          const mlakit_step_plan_t* b,
                                                          int32_t* same);

/* One layer's forward for a planned step; tensors as for mlakit_attention_forward, with T =
 * the plan's num_actual_tokens. The layer's configuration must equal the plan's in everything but
 * the scale. Launches only, so it may be captured in a CUDA graph. Every layer of the step runs
 * against the same plan, one after the other (they share its workspace). */
MLAKIT_API mlakit_status_t mlakit_attention_forward_step(
    mlakit_attention_t* attention, const DLTensor* q, const DLTensor* kv_c_normed,
    const DLTensor* k_pe, const DLTensor* kv_cache, const mlakit_step_plan_t* plan,
    const DLTensor* output, float q_scale, float k_scale, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MLAKIT_MLAKIT_H_ */
