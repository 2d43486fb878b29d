// CUDA kernels of the paged-cache ops (docs/kernels/cache_cuda.md). src/ops/cache_ops.cpp checks
// shapes, dtypes and strides first; these launchers enqueue on `stream` without synchronizing or
// allocating (graph-capturable). Index *values* live in device memory and are checked by the
// kernels: a bad one skips its token (or row, or request) and sets a bit that
// cuda::check_device_errors reports (cuda/common/device_errors.hpp). Nothing is read or written
// out of bounds.
#pragma once

#include <cstdint>
#include <optional>

#include "cuda/common/scale_source.hpp"
#include "mlakit/config.hpp"
#include "mlakit/types.hpp"

namespace mlakit::cuda {

// kv_c:         [T', L]  f32/f16/bf16, last dim contiguous
// k_pe:         [T', R]  dtype of kv_c, last dim contiguous
// kv_cache:     [num_blocks, block_size, entry_width]  entry contiguous, entries do not overlap
// slot_mapping: i64 [T], T <= T'
// k_scale:      kFp8E4m3 only: a host value (checked by the op) or a device f32 [1] that the kernel
//               reads (not finite and > 0: NaN codes and kConcatBadScale)
void concat_and_cache_mla(const TensorView& kv_c, const TensorView& k_pe,
                          const TensorView& kv_cache, const TensorView& slot_mapping,
                          KvCacheDType kv_dtype, ScaleSource k_scale, Stream stream);
// The same launch also copies q_rope_dst = q_rope_src bit for bit
// (ops/cache_write_with_q_rope.hpp): q_rope_src: [Td, N, R]  activation dtype, last dim contiguous
// q_rope_dst: [Td, N, R]  same dtype, last dim contiguous, elements distinct; both empty: no copy
void concat_and_cache_mla(const TensorView& kv_c, const TensorView& k_pe,
                          const TensorView& kv_cache, const TensorView& slot_mapping,
                          KvCacheDType kv_dtype, ScaleSource k_scale, const TensorView& q_rope_src,
                          const TensorView& q_rope_dst, Stream stream);

// src_cache:    [num_blocks, block_size, entry_width]
// dst:          [>= num_tokens, W]  f32/f16/bf16, last dim contiguous (W = 576 for fp8_ds_mla)
// block_table:  i32 [>= B, max_blocks]
// cu_seq_lens:  i32 [B + 1]
// token_to_seq: i32 [>= num_tokens]
// seq_starts:   i32 [>= B] or absent
// scale:        kFp8E4m3 only: a host value (checked by the op) or a device f32 [1] that the kernel
//               reads (not finite and > 0: NaN rows and kGatherBadScale)
void gather_and_maybe_dequant_cache(const TensorView& src_cache, const TensorView& dst,
                                    const TensorView& block_table, const TensorView& cu_seq_lens,
                                    const TensorView& token_to_seq, int64_t num_tokens,
                                    KvCacheDType kv_dtype, ScaleSource scale,
                                    const std::optional<TensorView>& seq_starts, Stream stream);

// src:       [rows, entry_width]  entry contiguous
// dst:       [>= num_tokens, W]  f32/f16/bf16, last dim contiguous (W = 576 for fp8_ds_mla)
// row_index: i32 [num_tokens]
void gather_rows_and_maybe_dequant(const TensorView& src, const TensorView& dst,
                                   const TensorView& row_index, KvCacheDType kv_dtype, float scale,
                                   Stream stream);

// src_cache:   [num_blocks, block_size, W]
// dst:         [rows, W]  dtype of src_cache, last dim contiguous
// block_table: i32 [>= batch_size, max_blocks]
// cu_seq_lens: i32 [>= batch_size + 1]
// seq_starts:  i32 [>= batch_size] or absent
void cp_gather_cache(const TensorView& src_cache, const TensorView& dst,
                     const TensorView& block_table, const TensorView& cu_seq_lens,
                     int64_t batch_size, const std::optional<TensorView>& seq_starts,
                     Stream stream);

// cu_seq_lens:  i32 [B + 1]
// token_to_seq: i32 [>= num_tokens]
void fill_token_to_seq(const TensorView& cu_seq_lens, const TensorView& token_to_seq,
                       int64_t num_tokens, Stream stream);

}  // namespace mlakit::cuda
