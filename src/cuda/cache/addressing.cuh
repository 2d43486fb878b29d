// Device-side cache addressing with every index checked (docs/kernels/cache_cuda.md): a bad
// index sets its bit in the error word (once per warp) and the caller skips the access.
#pragma once

#include <cstdint>

#include "cuda/cache/params.cuh"
#include "cuda/common/device_errors.cuh"

namespace mlakit::cuda {

inline constexpr int kWarpSize = 32;

// This thread's warp among all warps of the grid, and the number of warps of the grid.
__device__ __forceinline__ int64_t global_warp() {
  return (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
}
__device__ __forceinline__ int64_t grid_warps() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
}
__device__ __forceinline__ int lane_id() { return threadIdx.x % kWarpSize; }
// This thread among all threads of the grid, and the number of threads of the grid.
__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

__device__ __forceinline__ char* entry_at(const CacheLayout& c, int64_t block, int64_t offset) {
  return c.data + block * c.block_bytes + offset * c.slot_bytes;
}

// Entry that token t writes, or nullptr: a negative slot skips the token, a slot beyond the
// cache is reported (by lane 0) and skipped.
__device__ __forceinline__ char* write_entry(const CacheWriteParams& p, int64_t t) {
  const int64_t slot = p.slot_mapping[t * p.slot_stride];
  if (slot < 0) return nullptr;
  if (slot >= p.cache.num_blocks * p.cache.block_size) {
    if (lane_id() == 0) raise_device_error(p.error_word, kConcatSlotOutOfRange);
    return nullptr;
  }
  return entry_at(p.cache, slot / p.cache.block_size, slot % p.cache.block_size);
}

// Entry holding logical position `pos` (>= 0) of request b, or nullptr after reporting a block
// column beyond the table or a block id outside the cache.
__device__ __forceinline__ char* request_entry(const RequestIndex& r, const CacheLayout& c,
                                               int64_t b, int64_t pos, uint32_t* error_word,
                                               uint32_t column_bit, uint32_t block_bit) {
  const int64_t column = pos / c.block_size;
  if (column >= r.table_width) {
    if (lane_id() == 0) raise_device_error(error_word, column_bit);
    return nullptr;
  }
  const int64_t block = r.block_table[b * r.table_row_stride + column * r.table_col_stride];
  if (block < 0 || block >= c.num_blocks) {
    if (lane_id() == 0) raise_device_error(error_word, block_bit);
    return nullptr;
  }
  return entry_at(c, block, pos % c.block_size);
}

// Source entry of gather token t (spec A.7 addressing, or a row of a row gather), or nullptr
// after reporting a bad index.
__device__ __forceinline__ const char* gather_entry(const GatherParams& p, int64_t t) {
  if (p.row_index != nullptr) {  // gather_rows_and_maybe_dequant: a row of a [rows, W] source
    const int64_t row = p.row_index[t * p.row_index_stride];
    if (row < 0 || row >= p.cache.num_blocks) {
      if (lane_id() == 0) raise_device_error(p.error_word, kGatherRowOutOfRange);
      return nullptr;
    }
    return entry_at(p.cache, row, 0);
  }
  const RequestIndex& r = p.index;
  const int64_t b = p.token_to_seq[t * p.token_to_seq_stride];
  if (b < 0 || b >= r.batch) {
    if (lane_id() == 0) raise_device_error(p.error_word, kGatherRequestOutOfRange);
    return nullptr;
  }
  const int64_t begin = r.cu_seq_lens[b * r.cu_stride];
  const int64_t end = r.cu_seq_lens[(b + 1) * r.cu_stride];
  if (t < begin || t >= end) {
    if (lane_id() == 0) raise_device_error(p.error_word, kGatherTokenOutsideRows);
    return nullptr;
  }
  const int64_t start = r.seq_starts ? r.seq_starts[b * r.starts_stride] : 0;
  if (start < 0) {
    if (lane_id() == 0) raise_device_error(p.error_word, kGatherNegativeStart);
    return nullptr;
  }
  return request_entry(r, p.cache, b, t - begin + start, p.error_word, kGatherColumnOutOfRange,
                       kGatherBlockOutOfRange);
}

}  // namespace mlakit::cuda
