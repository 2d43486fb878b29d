// Kernel arguments of the sm90 decode and its combine: plain data, passed as __grid_constant__.
// Strides are in elements of the tensor's own dtype unless the name says bytes.
#pragma once

#include <cstdint>

#include "cuda/common/fast_divisor.hpp"
#include "cuda/decode/work_plan.hpp"

namespace mlakit::cuda::decode_sm90 {

// Element types the kernels read or write at run time (q, out); the cache's are compile-time.
enum class RuntimeDType : int32_t { kF32, kF16, kBF16, kFp8E4m3 };

// How a cached token is stored (kv_cache.hpp): kNative entries are 576 values of the MMA element
// type and feed the tensor cores as copied; the fp8 formats are copied raw, then converted to the
// MMA element type in shared memory before the MMAs read them.
enum class CacheFormat : int32_t { kNative, kFp8E4m3, kFp8DsMla };

struct DecodeKernelParams {
  // q: [B, s_q, N, 576]; row r = j * N + n of request b is q[b, j, n, :]
  const void* q;
  int64_t q_stride_batch, q_stride_query, q_stride_head;
  RuntimeDType q_dtype;
  bool q_rows_16b_aligned;  // every q row starts on a 16-byte boundary (vector loads)
  // The wgmma kernel loads a segment's q tile by TMA (its launcher's q tensor map) instead of
  // thread loads: q in the MMA element type, tiles of whole heads, 16-byte strides
  // (make_q_tensor_map).
  bool q_by_tma;

  // kv_cache: [num_blocks, block_size, entry] (entry bytes fixed by the cache format)
  const uint8_t* cache;
  int64_t cache_stride_block_bytes, cache_stride_slot_bytes;
  int32_t num_blocks;
  int32_t block_size;

  // block_table: i32 [B, max_blocks]; seq_lens: i32 [B]
  const int32_t* block_table;
  int64_t block_table_stride_batch, block_table_stride_col;
  const int32_t* seq_lens;
  int64_t seq_lens_stride;
  int32_t max_seq_len;  // min(max_blocks * block_size, the schedule's bound): longer ones are bad

  // out: [B, s_q, N, 512] out_dtype; lse: f32 [B, s_q, N]
  void* out;
  int64_t out_stride_batch, out_stride_query, out_stride_head;
  RuntimeDType out_dtype;
  float* lse;
  int64_t lse_stride_batch, lse_stride_query, lse_stride_head;

  // The work plan (written by the plan kernel into the workspace; work_plan.hpp): CTA
  // (part, row tile) computes the segments [part_begin[part], part_begin[part + 1]).
  const int32_t* part_begin;      // [num_parts + 1]
  const SegmentRecord* segments;  // [max_segments]
  // Partial results of the segments of split requests, in the caller's f32 workspace:
  void* partial_out;   // [max_partials, rows, 512] partial_dtype (normalized)
  float* partial_lse;  // [max_partials, rows]
  // partial_out's dtype: out's (bf16 / f16: half the bytes each segment writes and the combine
  // reads; the rows are rounded once more than an unsplit row), f32 for an f32 out.
  RuntimeDType partial_dtype;

  int32_t batch;
  int32_t s_q;
  int32_t num_heads;
  int32_t rows;       // s_q * num_heads: query rows per request
  int32_t row_tiles;  // ceil(rows / kBlockM): CTAs per part
  int32_t num_parts;  // P: the grid is num_parts x row_tiles CTAs
  // Divisions by num_heads, block_size and row_tiles (row -> (query, head), position -> (page
  // column, slot), CTA -> (part, row tile)) without a division sequence (fast_divisor.hpp).
  FastDivisor heads_div, block_size_div, row_tiles_div;

  float score_scale_log2;  // softmax scale * q_scale (fp8 q) * k_scale (fp8_e4m3) * log2(e)
  float value_scale;       // k_scale for fp8_e4m3 caches, else 1
  // q_scale / k_scale as tensors (mla_decode's tensor form; nullptr: the host float below): request
  // b's value at [b * stride] (stride 0: one for all). With either set, request_scales
  // (kernel_common.cuh) computes the two factors above per request from softmax_scale and them.
  const float* q_scales;  // f32 [1] or [B]
  int64_t q_scales_stride;
  const float* k_scales;  // f32 [1] or [B]
  int64_t k_scales_stride;
  float softmax_scale;
  float q_scale, k_scale;  // host values, used where the tensor is nullptr
  bool q_scale_applies;    // q is fp8: scores * q_scale
  bool k_scale_applies;    // fp8_e4m3 cache: scores and values * k_scale

  // Per-device error word (cuda/common/device_errors.hpp): a CTA that met a bad seq_len or block
  // id sets kDecodeBadIndex, one that read a scale tensor value that is not finite and > 0
  // kDecodeBadScale (besides writing NaN rows).
  uint32_t* error_word;
};

struct CombineParams {
  const void* partial_out;            // [max_partials, rows, 512] partial_dtype
  RuntimeDType partial_dtype;         // DecodeKernelParams::partial_dtype
  const float* partial_lse;           // [max_partials, rows]
  const SplitRecord* splits;          // [max_split_requests]; the first *num_split_requests are set
  const int32_t* num_split_requests;  // the plan's count of split requests (in its header)
  void* out;                          // [B, s_q, N, 512]
  int64_t out_stride_batch, out_stride_query, out_stride_head;
  RuntimeDType out_dtype;
  float* lse;  // f32 [B, s_q, N]
  int64_t lse_stride_batch, lse_stride_query, lse_stride_head;
  int32_t num_heads;
  int32_t rows;
  int32_t column_slices;  // 1, 2 or 4 (combine.cuh): grid.x = max_split_requests x rows x slices
};

// The plan kernel (plan_kernel.cuh): reads seq_lens, writes the work plan into the workspace.
struct PlanParams {
  const int32_t* seq_lens;  // i32 [B]
  int64_t seq_lens_stride;
  int32_t batch;
  int32_t max_seq_len;  // the decode kernel's bound: a longer seq_len is planned as empty
  int32_t num_parts;
  int32_t rows;  // query rows per request (s_q * N): what cutting a request costs to merge
  bool batch_invariant;
  WorkPlanBounds bounds;  // capacities of the regions below

  int32_t* header;          // [kHeaderWords]: the counts (WorkPlanHeader)
  int32_t* part_begin;      // [num_parts + 1]
  SegmentRecord* segments;  // [bounds.max_segments]
  int32_t* segment_part;    // [bounds.max_segments]
  SplitRecord* splits;      // [bounds.max_split_requests]

  // Set to kDecodePlanOverflow if the plan ever exceeded its bounds (a library bug; the excess is
  // not written).
  uint32_t* error_word;
};

}  // namespace mlakit::cuda::decode_sm90
