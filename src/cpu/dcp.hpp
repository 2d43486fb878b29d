// CPU kernels of the DCP ops (spec A.3, A.9, B.7, C.6): slot mapping, the LSE-corrected combine of
// the ranks' partial decode results, whole (dcp_lse_combine) or one rank's half of it
// (dcp_lse_correct, before a reduce-scatter), and the row order of an all-gathered context chunk.
// Arguments are validated by src/ops/dcp.cpp.
#pragma once

#include <cstdint>
#include <optional>

#include "mlakit/dcp.hpp"
#include "mlakit/types.hpp"

namespace mlakit::cpu {

// positions: i64 [T]; token_to_req: i32 [T]; block_table: i32 [R, max_blocks];
// slot_mapping: i64 [T]. Checks every index first, then writes (nothing written on bad input).
void dcp_slot_mapping(const TensorView& positions, const TensorView& token_to_req,
                      const TensorView& block_table, int64_t block_size, const DcpConfig& dcp,
                      const TensorView& slot_mapping);

// partial_out: [W, T, H, D]; partial_lse_tokens_heads: f32 [W, T, H]; out: [T, H, D];
// out_lse_tokens_heads: f32 [T, H] or absent
void dcp_lse_combine(const TensorView& partial_out, const TensorView& partial_lse_tokens_heads,
                     const TensorView& out, const std::optional<TensorView>& out_lse_tokens_heads);

// partial_out: [T, H, D]; all_lse_tokens_heads: f32 [W, T, H]; corrected: [T, W, H / W, D]
void dcp_lse_correct(const TensorView& partial_out, const TensorView& all_lse_tokens_heads,
                     int64_t rank, const TensorView& corrected);

// cu_seq_lens: i32 [np + 1] (validated: 0, non-decreasing, covers num_tokens); seq_starts: i32
// [np]; rank_cu_seq_lens: i32 [W, np + 1]; row_index: i32 [>= num_tokens]. Throws on a piece that
// does not start at a multiple of W I or a row outside [0, W rows_per_rank), and then writes
// nothing.
void dcp_gathered_rows(const TensorView& cu_seq_lens, const TensorView& seq_starts,
                       const TensorView& rank_cu_seq_lens, int64_t rows_per_rank,
                       int64_t interleave, const TensorView& row_index, int64_t num_tokens);

}  // namespace mlakit::cpu
