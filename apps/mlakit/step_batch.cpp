#include "step_batch.hpp"

#include <algorithm>
#include <string>

#include "mlakit/error.hpp"

namespace mlakit::sim {

StepBatch make_step_batch(const Step& step, const Scheduler& scheduler) {
  const int64_t block_size = scheduler.config().block_size;
  const auto num_reqs = static_cast<int64_t>(step.chunks.size());
  StepBatch b;
  b.query_start_loc.assign(1, 0);
  int64_t max_seq_len = 0;
  for (const ScheduledChunk& c : step.chunks) {
    b.query_start_loc.push_back(static_cast<int32_t>(b.query_start_loc.back() + c.num_tokens));
    b.seq_lens.push_back(static_cast<int32_t>(c.seq_len()));
    max_seq_len = std::max(max_seq_len, c.seq_len());
  }
  const SchedulerConfig& config = scheduler.config();
  const bool dcp = config.dcp_world_size > 1;
  b.block_table_width = blocks_for(held_tokens(max_seq_len, config), block_size);
  b.block_table.assign(num_reqs * b.block_table_width, 0);
  b.slot_mapping.reserve(step.num_tokens);
  b.num_decodes = num_reqs;
  for (int64_t i = 0; i < num_reqs; ++i) {
    const ScheduledChunk& c = step.chunks[i];
    const auto blocks = scheduler.block_table(c.request);
    b.request_ids.push_back(c.request);
    if (static_cast<int64_t>(blocks.size()) <
        blocks_for(held_tokens(c.seq_len(), config), block_size)) {
      throw Error(ErrorCode::kInternal, "make_step_batch: request " + std::to_string(c.request) +
                                            " has too few blocks for seq_len " +
                                            std::to_string(c.seq_len()));
    }
    const auto used = std::min<int64_t>(static_cast<int64_t>(blocks.size()), b.block_table_width);
    std::copy_n(blocks.begin(), used, b.block_table.begin() + i * b.block_table_width);
    for (int64_t pos = c.num_computed; pos < c.seq_len() && !dcp; ++pos) {
      b.slot_mapping.push_back(int64_t{blocks[pos / block_size]} * block_size + pos % block_size);
    }
    if (c.num_tokens > 1 && b.num_decodes == num_reqs) b.num_decodes = i;
  }
  return b;
}

StepBatch global_view(const StepBatch& batch, int64_t blocks_per_request, int64_t block_size) {
  StepBatch g = batch;
  g.block_table_width = blocks_per_request;
  g.block_table.assign(batch.num_reqs() * blocks_per_request, 0);
  g.slot_mapping.clear();
  for (int64_t i = 0; i < batch.num_reqs(); ++i) {
    const int64_t first_block = int64_t{batch.request_ids[i]} * blocks_per_request;
    for (int64_t col = 0; col < blocks_per_request; ++col)
      g.block_table[i * blocks_per_request + col] = static_cast<int32_t>(first_block + col);
    const int64_t q_len = batch.query_start_loc[i + 1] - batch.query_start_loc[i];
    for (int64_t pos = batch.seq_lens[i] - q_len; pos < batch.seq_lens[i]; ++pos)
      g.slot_mapping.push_back(first_block * block_size + pos);
  }
  return g;
}

}  // namespace mlakit::sim
