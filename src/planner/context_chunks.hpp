// B.6: the chunked-context plan (private to the planner; make_plan is the public entry).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mlakit/plan.hpp"

namespace mlakit::detail {

// context_lens: [np] context tokens of each prefill request (>= 0).
// Cuts every context into pieces gathered chunk by chunk into a workspace of workspace_tokens
// rows. Guarantees, for every policy:
//   - each context token [0, context_lens[r]) lies in exactly one piece; the pieces of a request
//     appear in increasing position order, one per chunk at most, each starting where the
//     previous one ended;
//   - every piece starts at a multiple of block_size;
//   - every chunk has 0 < total_tokens <= workspace_tokens;
//   - a request without context in a chunk has seq_len 0 and start 0 (reads nothing);
//   - no chunk at all when every context is 0.
// Throws mlakit::Error when block_size <= 0, workspace_tokens < block_size (no piece could be
// page-aligned), workspace_tokens > INT32_MAX, or a context length is negative.
std::vector<ContextChunk> plan_context_chunks(std::span<const int32_t> context_lens,
                                              int64_t block_size, int64_t workspace_tokens,
                                              ChunkPolicy policy);

// The most chunks plan_context_chunks can return for at most `max_requests` contexts of at most
// `max_context_len` tokens each (sizes an engine's index metadata up front).
int64_t max_context_chunks(int64_t max_requests, int64_t max_context_len, int64_t block_size,
                           int64_t workspace_tokens, ChunkPolicy policy);

}  // namespace mlakit::detail
