// Host helpers shared by the cache launchers: views -> kernel parameters, launch shape.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>

#include "core/check.hpp"
#include "cuda/cache/params.cuh"
#include "cuda/common/alignment.hpp"
#include "cuda/common/dispatch.cuh"
#include "mlakit/types.hpp"

namespace mlakit::cuda {

// Why 8 warps (256 threads) a block: one warp per token, 8 tokens a block keeps blocks small
// enough that a few hundred tokens spread over most SMs, and big enough to fill an SM with ~8.
inline constexpr int kWarpsPerBlock = 8;
inline constexpr int kThreadsPerBlock = kWarpsPerBlock * 32;

inline CacheLayout cache_layout(const TensorView& cache) {
  return {static_cast<char*>(cache.data), cache.strides[0] * cache.element_size(),
          cache.strides[1] * cache.element_size(), cache.shape[0], cache.shape[1]};
}

// Widest access (<= max_bytes) that every entry start (and `extra` offsets) is a multiple of.
inline int64_t entry_alignment(const CacheLayout& c, std::initializer_list<uint64_t> extra,
                               int64_t max_bytes = 16) {
  int64_t unit = common_alignment(
      {address(c.data), static_cast<uint64_t>(c.block_bytes), static_cast<uint64_t>(c.slot_bytes)},
      max_bytes);
  return std::min(unit, common_alignment(extra, max_bytes));
}

inline RequestIndex request_index(const TensorView& block_table, const TensorView& cu_seq_lens,
                                  const std::optional<TensorView>& seq_starts, int64_t batch) {
  RequestIndex r;
  r.block_table = static_cast<const int32_t*>(block_table.data);
  r.table_row_stride = block_table.strides[0];
  r.table_col_stride = block_table.strides[1];
  r.table_width = block_table.shape[1];
  r.cu_seq_lens = static_cast<const int32_t*>(cu_seq_lens.data);
  r.cu_stride = cu_seq_lens.strides[0];
  if (seq_starts) {
    r.seq_starts = static_cast<const int32_t*>(seq_starts->data);
    r.starts_stride = seq_starts->strides[0];
  }
  r.batch = batch;
  return r;
}

}  // namespace mlakit::cuda
