// CPU kernels of the paged-cache ops (spec A.3, A.7). The public entry points in
// src/ops/cache_ops.cpp check shapes, dtypes and strides first; these kernels then check every
// value read from an index tensor (slots, request ids, row ranges, block columns, block ids)
// before the first byte is written, so bad indices throw mlakit::Error and leave the outputs
// untouched. Work is spread over tokens with cpu::parallel_for.
#pragma once

#include <cstdint>
#include <optional>

#include "mlakit/config.hpp"
#include "mlakit/types.hpp"

namespace mlakit::cpu {

// kv_c:         [T', L]  f32/f16/bf16, last dim contiguous
// k_pe:         [T', R]  dtype of kv_c, last dim contiguous
// kv_cache:     [num_blocks, block_size, entry_width]  entry contiguous, entries do not overlap
// slot_mapping: i64 [T], T <= T'
void concat_and_cache_mla(const TensorView& kv_c, const TensorView& k_pe,
                          const TensorView& kv_cache, const TensorView& slot_mapping,
                          KvCacheDType kv_dtype, float k_scale);

// src_cache:    [num_blocks, block_size, entry_width]
// dst:          [>= num_tokens, W]  f32/f16/bf16, last dim contiguous (W = 576 for fp8_ds_mla)
// block_table:  i32 [>= B, max_blocks]
// cu_seq_lens:  i32 [B + 1]
// token_to_seq: i32 [>= num_tokens]
// seq_starts:   i32 [>= B] or absent
void gather_and_maybe_dequant_cache(const TensorView& src_cache, const TensorView& dst,
                                    const TensorView& block_table, const TensorView& cu_seq_lens,
                                    const TensorView& token_to_seq, int64_t num_tokens,
                                    KvCacheDType kv_dtype, float scale,
                                    const std::optional<TensorView>& seq_starts);

// src:       [rows, entry_width]  entry contiguous
// dst:       [>= num_tokens, W]  f32/f16/bf16, last dim contiguous (W = 576 for fp8_ds_mla)
// row_index: i32 [num_tokens]
void gather_rows_and_maybe_dequant(const TensorView& src, const TensorView& dst,
                                   const TensorView& row_index, KvCacheDType kv_dtype, float scale);

// src_cache:   [num_blocks, block_size, W]
// dst:         [>= cu_seq_lens[batch_size], W]  dtype of src_cache, last dim contiguous
// block_table: i32 [>= batch_size, max_blocks]
// cu_seq_lens: i32 [>= batch_size + 1]
// seq_starts:  i32 [>= batch_size] or absent
void cp_gather_cache(const TensorView& src_cache, const TensorView& dst,
                     const TensorView& block_table, const TensorView& cu_seq_lens,
                     int64_t batch_size, const std::optional<TensorView>& seq_starts);

}  // namespace mlakit::cpu
