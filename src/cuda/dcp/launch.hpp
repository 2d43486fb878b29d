// CUDA kernels of the DCP ops (docs/dcp.md). src/ops/dcp.cpp validates shapes, dtypes and
// devices; these launchers enqueue on `stream` without synchronizing or allocating
// (graph-capturable).
#pragma once

#include <cstdint>
#include <optional>

#include "mlakit/dcp.hpp"
#include "mlakit/types.hpp"

namespace mlakit::cuda {

// positions: i64 [T]; token_to_req: i32 [T]; block_table: i32 [R, max_blocks];
// slot_mapping: i64 [T]. A bad index gives slot -1 and sets kDcpSlotBadIndex.
void dcp_slot_mapping(const TensorView& positions, const TensorView& token_to_req,
                      const TensorView& block_table, int64_t block_size, const DcpConfig& dcp,
                      const TensorView& slot_mapping, Stream stream);

// partial_out: [W, T, H, D]; partial_lse_tokens_heads: f32 [W, T, H]; out: [T, H, D];
// out_lse_tokens_heads: f32 [T, H] or absent
void dcp_lse_combine(const TensorView& partial_out, const TensorView& partial_lse_tokens_heads,
                     const TensorView& out, const std::optional<TensorView>& out_lse_tokens_heads,
                     Stream stream);

// partial_out: [T, H, D]; all_lse_tokens_heads: f32 [W, T, H]; corrected: [T, W, H / W, D]
void dcp_lse_correct(const TensorView& partial_out, const TensorView& all_lse_tokens_heads,
                     int64_t rank, const TensorView& corrected, Stream stream);

// cu_seq_lens: i32 [np + 1]; seq_starts: i32 [np]; rank_cu_seq_lens: i32 [W, np + 1];
// row_index: i32 [>= num_tokens]. A row outside every request, or a result outside
// [0, W rows_per_rank), gets -1 (gather_rows_and_maybe_dequant records it).
void dcp_gathered_rows(const TensorView& cu_seq_lens, const TensorView& seq_starts,
                       const TensorView& rank_cu_seq_lens, int64_t rows_per_rank,
                       int64_t interleave, const TensorView& row_index, int64_t num_tokens,
                       Stream stream);

}  // namespace mlakit::cuda
