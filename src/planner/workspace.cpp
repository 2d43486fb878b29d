// B.2: rows of the chunked-context gather workspace.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/check.hpp"
#include "mlakit/plan.hpp"

namespace mlakit {

namespace {
constexpr const char* kOp = "chunked_prefill_workspace_tokens";
// The cap of B.2: 64K rows (lowered from 128K upstream after a 128k-token request ran out of
// memory, spec E-4).
constexpr int64_t kWorkspaceCap = 64 * 1024;
// Chunk offsets (cu_seq_lens, token_to_seq) are int32, so the workspace must fit in int32.
constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();
}  // namespace

int64_t chunked_prefill_workspace_tokens(int64_t max_model_len, int64_t max_num_seqs,
                                         int64_t block_size) {
  using detail::require;
  require(max_model_len > 0, ErrorCode::kInvalidArgument, kOp, ": max_model_len must be > 0, got ",
          max_model_len);
  require(max_num_seqs > 0 && max_num_seqs <= kMaxRows, ErrorCode::kInvalidArgument, kOp,
          ": max_num_seqs must be in [1, ", kMaxRows, "], got ", max_num_seqs);
  require(block_size > 0 && block_size <= kMaxRows, ErrorCode::kInvalidArgument, kOp,
          ": block_size must be in [1, ", kMaxRows, "], got ", block_size);

  // One page per request; both factors < 2^31, so the product fits in int64.
  const int64_t one_page_each = max_num_seqs * block_size;
  // min(max(8 * max_model_len, 4 * one_page_each), cap), written so that no product overflows:
  // either term reaching the cap makes the result the cap.
  const bool at_cap = max_model_len >= kWorkspaceCap / 8 || one_page_each >= kWorkspaceCap / 4;
  const int64_t capped = at_cap ? kWorkspaceCap : std::max(8 * max_model_len, 4 * one_page_each);
  const int64_t rows = std::max(capped, one_page_each);
  require(rows <= kMaxRows, ErrorCode::kInvalidArgument, kOp,
          ": max_num_seqs * block_size must be at most ", kMaxRows, " rows, got ", rows);
  return rows;
}

}  // namespace mlakit
