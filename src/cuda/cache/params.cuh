// Parameters of the paged-cache kernels (spec A.2, A.3, A.7); POD, passed as __grid_constant__.
// Byte strides everywhere, so one kernel serves every dtype of the same width.
#pragma once

#include <cstdint>

#include "cuda/common/scale_source.hpp"

namespace mlakit::cuda {

// A [num_blocks, block_size, W] cache; entry (block, offset) starts at
// data + block * block_bytes + offset * slot_bytes and is contiguous.
struct CacheLayout {
  char* data = nullptr;
  int64_t block_bytes = 0;  // stride(0) in bytes
  int64_t slot_bytes = 0;   // stride(1) in bytes
  int64_t num_blocks = 0;
  int64_t block_size = 0;
};

// rows x heads runs of `units` raw units (unit_bytes each, a power of two <= 16) copied bit for bit
// by every thread of a launch, grid-stride (HeadRowsCopy with rows 0 copies nothing).
struct HeadRowsCopy {
  const char* src = nullptr;  // [rows, heads, units * unit_bytes bytes]
  int64_t src_row_bytes = 0;
  int64_t src_head_bytes = 0;
  char* dst = nullptr;  // [rows, heads, units * unit_bytes bytes]
  int64_t dst_row_bytes = 0;
  int64_t dst_head_bytes = 0;
  int64_t rows = 0;
  int64_t heads = 0;
  int64_t units = 0;  // per (row, head)
  int unit_bytes = 1;
};

struct CacheWriteParams {
  const char* kv_c = nullptr;  // [T', L] activation dtype, rows kv_c_row_bytes apart
  int64_t kv_c_row_bytes = 0;
  const char* k_pe = nullptr;  // [T', R] activation dtype, rows k_pe_row_bytes apart
  int64_t k_pe_row_bytes = 0;
  const int64_t* slot_mapping = nullptr;  // [T], slot_stride elements apart
  int64_t slot_stride = 0;
  int64_t num_tokens = 0;          // T
  CacheLayout cache;               // [num_blocks, block_size, L + R or 656]
  int latent = 0;                  // L
  int rope = 0;                    // R
  int64_t elem_bytes = 0;          // bytes of one activation value
  ScaleSource k_scale;             // kFp8E4m3: stored = e4m3(x / k_scale)
  uint32_t* error_word = nullptr;  // device_errors.hpp
  // concat_and_cache_mla_with_q_rope: the decode queries' rope part [Td, N, R] into the absorbed
  // query buffer, by the same launch; rows 0 otherwise.
  HeadRowsCopy q_rope;
};

// How a request of a gather addresses the cache: block_table[b, pos / block_size].
struct RequestIndex {
  const int32_t* block_table = nullptr;  // [>= batch, table_width]
  int64_t table_row_stride = 0;          // elements
  int64_t table_col_stride = 0;          // elements
  int64_t table_width = 0;
  const int32_t* cu_seq_lens = nullptr;  // [batch + 1]
  int64_t cu_stride = 0;
  const int32_t* seq_starts = nullptr;  // [batch] or nullptr (all 0)
  int64_t starts_stride = 0;
  int64_t batch = 0;
};

struct GatherParams {
  CacheLayout cache;    // src: [num_blocks, block_size, W or 656]
  char* dst = nullptr;  // [>= num_tokens, W], rows dst_row_bytes apart
  int64_t dst_row_bytes = 0;
  const int32_t* token_to_seq = nullptr;  // [>= num_tokens]
  int64_t token_to_seq_stride = 0;
  // gather_rows_and_maybe_dequant: token t reads entry row_index[t] of a [rows, 1, W] "cache"
  // (cache.num_blocks = rows); token_to_seq and index are then unused. nullptr otherwise.
  const int32_t* row_index = nullptr;  // [num_tokens]
  int64_t row_index_stride = 0;
  int64_t num_tokens = 0;
  RequestIndex index;
  int width = 0;          // W: values per dst row
  int64_t row_bytes = 0;  // raw gathers: bytes moved per row (W * elem)
  ScaleSource scale;      // kFp8E4m3: value = fp8 * scale
  uint32_t* error_word = nullptr;
};

struct CpGatherParams {
  CacheLayout cache;    // [num_blocks, block_size, W]
  char* dst = nullptr;  // [dst_rows, W], rows dst_row_bytes apart
  int64_t dst_row_bytes = 0;
  int64_t dst_rows = 0;
  RequestIndex index;
  int64_t row_bytes = 0;  // W * elem
  uint32_t* error_word = nullptr;
};

}  // namespace mlakit::cuda
