// The host metadata of one forward step, built from a scheduled Step and the block tables.
#pragma once

#include <cstdint>
#include <vector>

#include "scheduler.hpp"

namespace mlakit::sim {

struct StepBatch {
  std::vector<int32_t> query_start_loc;  // [R + 1] cumulative query tokens, batch order
  std::vector<int32_t> seq_lens;         // [R] context + query tokens
  int64_t block_table_width = 0;         // W: columns, enough for the longest seq_len
  std::vector<int32_t> block_table;      // [R, W] row-major; unused columns 0 (as vLLM pads)
  // [T] block * block_size + offset of each query token; empty under DCP, where the library
  // derives each rank's slots from the positions and its block table.
  std::vector<int64_t> slot_mapping;
  std::vector<int32_t> request_ids;  // [R] the scheduler's request of each row
  // Requests [0, num_decodes) take the decode path: spec B.4 with threshold 1 splits at the
  // first request with more than one query token (all of them when none has).
  int64_t num_decodes = 0;

  int64_t num_reqs() const { return static_cast<int64_t>(seq_lens.size()); }
  int64_t num_tokens() const { return query_start_loc.back(); }
};

// Throws mlakit::Error (kInternal) if a request's blocks do not cover its seq_len (under DCP the
// tokens rank 0 holds of it: the table of every rank, whose local positions are fewer or as many).
StepBatch make_step_batch(const Step& step, const Scheduler& scheduler);

// The step as one rank holding every token would see it, for the host mirror of --verify under
// DCP: request id's position p sits in virtual block id * blocks_per_request + p / block_size
// (never allocated; blocks_per_request covers the longest request), and the query tokens' slots
// follow.
StepBatch global_view(const StepBatch& batch, int64_t blocks_per_request, int64_t block_size);

}  // namespace mlakit::sim
