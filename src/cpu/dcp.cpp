#include "cpu/dcp.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.hpp"
#include "core/dcp_weights.hpp"
#include "cpu/float_rows.hpp"
#include "cpu/parallel.hpp"

namespace mlakit::cpu {

namespace {

constexpr const char* kSlotOp = "dcp_slot_mapping";
// Elements of a row converted to f32 at a time: two 1 KiB stack buffers stay in L1, and the
// latent rows of MLA (512) take two chunks.
constexpr int64_t kChunk = 256;
// Tokens per parallel work item: decode batches are small (tens to hundreds of tokens, each with
// H heads of D values), so one token a work item already gives every thread work.
constexpr int64_t kTokensPerItem = 1;

const float* lse_at(const TensorView& lse, int64_t k, int64_t t, int64_t h) {
  return lse.data_as<const float>() + k * lse.strides[0] + t * lse.strides[1] + h * lse.strides[2];
}

// The combine weights of (t, h) over the W rows of an f32 [W, T, H] LSE view.
detail::DcpWeights weights_at(const TensorView& lse, int64_t t, int64_t h) {
  const int64_t w = lse.shape[0];
  return detail::dcp_weights(w, [&](int64_t k) { return *lse_at(lse, k, t, h); });
}

}  // namespace

void dcp_slot_mapping(const TensorView& positions, const TensorView& token_to_req,
                      const TensorView& block_table, int64_t block_size, const DcpConfig& dcp,
                      const TensorView& slot_mapping) {
  const int64_t tokens = positions.shape[0];
  const auto* pos = positions.data_as<const int64_t>();
  const auto* req = token_to_req.data_as<const int32_t>();
  const auto* table = block_table.data_as<const int32_t>();
  auto* slots = slot_mapping.data_as<int64_t>();
  const int64_t requests = block_table.shape[0], width = block_table.shape[1];
  // Pass 1: the block-table entry of every local token exists and is a block id.
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t p = pos[t * positions.strides[0]];
    if (p < 0 || dcp_owner_rank(p, dcp.world_size, dcp.interleave) != dcp.rank) continue;
    const int64_t r = req[t * token_to_req.strides[0]];
    detail::require(r >= 0 && r < requests, ErrorCode::kOutOfRange, kSlotOp, ": token_to_req[", t,
                    "] = ", r, " is not a row of block_table in [0, ", requests, ")");
    const int64_t column = dcp_local_position(p, dcp.world_size, dcp.interleave) / block_size;
    detail::require(column < width, ErrorCode::kOutOfRange, kSlotOp, ": token ", t, " (position ",
                    p, ", local position ", dcp_local_position(p, dcp.world_size, dcp.interleave),
                    ") needs block column ", column, " but block_table has ", width, " columns");
    const int64_t block = table[r * block_table.strides[0] + column * block_table.strides[1]];
    detail::require(block >= 0, ErrorCode::kOutOfRange, kSlotOp, ": block_table[", r, ", ", column,
                    "] = ", block, " (needed by token ", t, ") must be a block id >= 0");
    // The slot block * block_size + offset must not wrap (a negative slot would skip the token).
    detail::require(block <= (std::numeric_limits<int64_t>::max() - (block_size - 1)) / block_size,
                    ErrorCode::kInvalidArgument, kSlotOp, ": block_table[", r, ", ", column,
                    "] = ", block, " x block_size ", block_size,
                    " overflows int64 (the slot of token ", t, ")");
  }
  // Pass 2: the slots.
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t p = pos[t * positions.strides[0]];
    int64_t slot = -1;
    if (p >= 0 && dcp_owner_rank(p, dcp.world_size, dcp.interleave) == dcp.rank) {
      const int64_t r = req[t * token_to_req.strides[0]];
      const int64_t local = dcp_local_position(p, dcp.world_size, dcp.interleave);
      const int64_t block =
          table[r * block_table.strides[0] + (local / block_size) * block_table.strides[1]];
      slot = block * block_size + local % block_size;
    }
    slots[t * slot_mapping.strides[0]] = slot;
  }
}

void dcp_lse_combine(const TensorView& partial_out, const TensorView& partial_lse_tokens_heads,
                     const TensorView& out, const std::optional<TensorView>& out_lse_tokens_heads) {
  const int64_t w = partial_out.shape[0], tokens = out.shape[0], heads = out.shape[1],
                d = out.shape[2];
  const int64_t items = (tokens + kTokensPerItem - 1) / kTokensPerItem;
  parallel_for(0, items, [&](int64_t item) {
    float acc[kChunk], row[kChunk];
    for (int64_t t = item * kTokensPerItem; t < std::min(tokens, (item + 1) * kTokensPerItem);
         ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const detail::DcpWeights wt = weights_at(partial_lse_tokens_heads, t, h);
        for (int64_t c0 = 0; c0 < d; c0 += kChunk) {
          const int64_t n = std::min(kChunk, d - c0);
          std::fill_n(acc, n, 0.0f);
          for (int64_t k = 0; k < w; ++k) {
            const float f = wt.weight(*lse_at(partial_lse_tokens_heads, k, t, h));
            if (f == 0.0f) continue;  // an empty rank's partial is never read (it may be NaN)
            load_row(
                partial_out.element_ptr(k * partial_out.strides[0] + t * partial_out.strides[1] +
                                        h * partial_out.strides[2] + c0),
                partial_out.dtype, 1, n, row);
            for (int64_t j = 0; j < n; ++j) acc[j] += f * row[j];
          }
          store_row(acc, n, out.element_ptr(t * out.strides[0] + h * out.strides[1] + c0),
                    out.dtype, 1);
        }
        if (out_lse_tokens_heads) {
          const TensorView& lse = *out_lse_tokens_heads;
          lse.data_as<float>()[t * lse.strides[0] + h * lse.strides[1]] = wt.lse;
        }
      }
    }
  });
}

void dcp_lse_correct(const TensorView& partial_out, const TensorView& all_lse_tokens_heads,
                     int64_t rank, const TensorView& corrected) {
  const int64_t tokens = partial_out.shape[0], heads = partial_out.shape[1],
                d = partial_out.shape[2];
  const int64_t heads_per_rank = corrected.shape[2];
  const int64_t items = (tokens + kTokensPerItem - 1) / kTokensPerItem;
  parallel_for(0, items, [&](int64_t item) {
    float acc[kChunk];
    for (int64_t t = item * kTokensPerItem; t < std::min(tokens, (item + 1) * kTokensPerItem);
         ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const detail::DcpWeights wt = weights_at(all_lse_tokens_heads, t, h);
        const float f = wt.weight(*lse_at(all_lse_tokens_heads, rank, t, h));
        void* dst = corrected.element_ptr(t * corrected.strides[0] +
                                          (h / heads_per_rank) * corrected.strides[1] +
                                          (h % heads_per_rank) * corrected.strides[2]);
        for (int64_t c0 = 0; c0 < d; c0 += kChunk) {
          const int64_t n = std::min(kChunk, d - c0);
          if (f == 0.0f) {
            std::fill_n(acc, n, 0.0f);  // this rank holds no weight: its partial is not read
          } else {
            load_row(partial_out.element_ptr(t * partial_out.strides[0] +
                                             h * partial_out.strides[1] + c0),
                     partial_out.dtype, 1, n, acc);
            for (int64_t j = 0; j < n; ++j) acc[j] *= f;
          }
          store_row(acc, n, static_cast<char*>(dst) + c0 * corrected.element_size(),
                    corrected.dtype, 1);
        }
      }
    }
  });
}

void dcp_gathered_rows(const TensorView& cu_seq_lens, const TensorView& seq_starts,
                       const TensorView& rank_cu_seq_lens, int64_t rows_per_rank,
                       int64_t interleave, const TensorView& row_index, int64_t num_tokens) {
  constexpr const char* kOp = "dcp_gathered_rows";
  const int64_t w = rank_cu_seq_lens.shape[0], requests = cu_seq_lens.shape[0] - 1;
  auto at = [](const TensorView& t, int64_t i) {
    return int64_t{t.data_as<const int32_t>()[i * t.strides[0]]};
  };
  // Calls fn(t, row) for every token t < num_tokens, in order; throws at the first bad piece or
  // row.
  auto for_each_row = [&](auto&& fn) {
    for (int64_t r = 0; r < requests; ++r) {
      const int64_t begin = at(cu_seq_lens, r), end = std::min(at(cu_seq_lens, r + 1), num_tokens);
      if (begin >= end) continue;
      const int64_t start = at(seq_starts, r);
      detail::require(start >= 0 && start % (w * interleave) == 0, ErrorCode::kInvalidArgument, kOp,
                      ": seq_starts[", r,
                      "] must be a multiple of world_size * interleave = ", w * interleave,
                      " (rank_cu_seq_lens.shape[0] * interleave), got ", start);
      for (int64_t t = begin; t < end; ++t) {
        const int64_t p = start + t - begin;
        const int64_t k = dcp_owner_rank(p, w, interleave);
        const int64_t rank_first =
            rank_cu_seq_lens.data_as<const int32_t>()[k * rank_cu_seq_lens.strides[0] +
                                                      r * rank_cu_seq_lens.strides[1]];
        const int64_t row =
            k * rows_per_rank + rank_first + dcp_local_position(p, w, interleave) - start / w;
        detail::require(row >= 0 && row < w * rows_per_rank, ErrorCode::kOutOfRange, kOp, ": row ",
                        t, " (request ", r, ", position ", p, ", rank ", k, ") lands on row ", row,
                        " of the ", w * rows_per_rank,
                        " all-gathered rows: rank_cu_seq_lens or rows_per_rank is wrong");
        fn(t, row);
      }
    }
  };
  // Every row is checked before the first is written: a refused call leaves row_index untouched.
  for_each_row([](int64_t, int64_t) {});
  auto* out = row_index.data_as<int32_t>();
  for_each_row(
      [&](int64_t t, int64_t row) { out[t * row_index.strides[0]] = static_cast<int32_t>(row); });
}

}  // namespace mlakit::cpu
