// A vLLM-style continuous-batching scheduler with chunked prefill under a token budget.
//
// Each step: every running decode gets 1 token, then running (partial) prefills take what is left
// of the budget in admission order, then waiting requests are admitted first-come-first-served
// while the budget, max_num_seqs and the KV blocks allow. A prompt longer than the remaining
// budget is chunked across steps. The step's batch is ordered decodes (1 query token, context
// > 0), then extends (more tokens, context > 0), then new prefills (no context), which is the
// order MlaAttention::forward expects (spec B.5).
//
// Admission reserves blocks for the request's whole life (total_len tokens, less prefix-cache
// hits), so a running request never runs out of blocks and nothing is preempted; blocks are
// allocated lazily, when tokens are scheduled. Requests sharing a prefix reuse its full,
// already computed blocks (refcounted) and start with those tokens computed.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "block_allocator.hpp"
#include "workload.hpp"

namespace mlakit::sim {

struct SchedulerConfig {
  int64_t num_blocks = 0;
  int64_t block_size = 64;
  int64_t max_num_seqs = 8;              // requests running at once
  int64_t max_num_batched_tokens = 512;  // token budget of one step
  // Decode context parallelism (--dcp): each of dcp_world_size ranks holds its share of every
  // request's tokens (interleave dcp_interleave) in a cache of num_blocks blocks. Blocks are
  // counted for the share of rank 0, the largest, so every rank makes the same decisions; the
  // prefix cache is off (a block of local positions is not a block of the prompt). 1: no DCP.
  int64_t dcp_world_size = 1;
  int64_t dcp_interleave = 1;
};

int64_t blocks_for(int64_t tokens, int64_t block_size);  // ceil(tokens / block_size)
// Tokens of a request of `tokens` tokens that one rank's cache must hold: all of them without
// DCP, rank 0's share under DCP.
int64_t held_tokens(int64_t tokens, const SchedulerConfig& config);

// One request's share of a step: query positions [num_computed, num_computed + num_tokens).
struct ScheduledChunk {
  int32_t request = 0;
  int64_t num_computed = 0;  // tokens already in the cache (the context)
  int64_t num_tokens = 0;    // query tokens of this step
  bool is_prompt = false;    // prompt tokens (prefill) rather than a generated token (decode)

  int64_t seq_len() const { return num_computed + num_tokens; }
  // Decode region of the batch order (spec B.5 with threshold 1).
  bool is_decode_region() const { return num_tokens <= 1 && num_computed > 0; }
};

struct Step {
  std::vector<ScheduledChunk> chunks;  // decodes, extends, new prefills
  int64_t num_tokens = 0;
  int64_t num_prompt_tokens = 0;     // prefill tokens
  int64_t num_generated_tokens = 0;  // decode tokens
  bool has_prefill() const { return num_prompt_tokens > 0; }
};

struct SchedulerStats {
  int64_t steps = 0;
  int64_t prefill_steps = 0;  // steps with at least one prompt token
  int64_t prompt_tokens = 0;  // prompt tokens computed (prefix-cache hits excluded)
  int64_t decode_tokens = 0;
  int64_t prefix_hit_tokens = 0;  // prompt tokens skipped thanks to the prefix cache
  int64_t peak_blocks_used = 0;
  int64_t finished = 0;
};

class Scheduler {
 public:
  // Throws mlakit::Error when a request can never fit the cache (names the flags to raise).
  Scheduler(std::vector<Request> requests, const SchedulerConfig& config);

  bool done() const { return stats_.finished == static_cast<int64_t>(requests_.size()); }
  // Plans the next step and allocates the blocks its tokens need.
  Step schedule();
  // Applies a step that schedule() returned: advances requests, registers computed prefix
  // blocks, frees the blocks of finished requests.
  void complete(const Step& step);

  const std::vector<Request>& requests() const { return requests_; }
  const SchedulerConfig& config() const { return config_; }
  std::span<const int32_t> block_table(int32_t request) const;  // physical block per position
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  const BlockAllocator& allocator() const { return allocator_; }
  const SchedulerStats& stats() const { return stats_; }
  int64_t reserved_blocks() const { return reserved_total_; }

 private:
  enum class Phase { kWaiting, kPrefill, kDecode, kFinished };
  struct State {
    Phase phase = Phase::kWaiting;
    int64_t num_computed = 0;
    int64_t num_generated = 0;
    int64_t reserved = 0;  // blocks still to allocate for this request
    std::vector<int32_t> blocks;
  };

  bool try_admit(int32_t request);
  void add_chunk(Step& step, int32_t request, int64_t num_tokens, bool is_prompt);
  void finish(int32_t request);

  std::vector<Request> requests_;
  SchedulerConfig config_;
  BlockAllocator allocator_;
  std::vector<State> states_;
  std::deque<int32_t> waiting_;
  std::vector<int32_t> running_;  // admission order
  int64_t reserved_total_ = 0;    // sum of State::reserved; never exceeds the free blocks
  SchedulerStats stats_;
};

}  // namespace mlakit::sim
