#include "scheduler.hpp"

#include <algorithm>
#include <string>

#include "mlakit/dcp.hpp"
#include "mlakit/error.hpp"

namespace mlakit::sim {

namespace {

[[noreturn]] void invalid(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, message);
}

void internal_check(bool condition, const char* what) {
  if (!condition) throw Error(ErrorCode::kInternal, std::string("Scheduler: ") + what);
}

// Batch region of spec B.5: decode, extend, new prefill.
int region(const ScheduledChunk& c) {
  if (c.is_decode_region()) return 0;
  return c.num_computed > 0 ? 1 : 2;
}

}  // namespace

int64_t blocks_for(int64_t tokens, int64_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

int64_t held_tokens(int64_t tokens, const SchedulerConfig& config) {
  return dcp_local_seq_len(tokens, config.dcp_world_size, /*rank=*/0, config.dcp_interleave);
}

Scheduler::Scheduler(std::vector<Request> requests, const SchedulerConfig& config)
    : requests_(std::move(requests)),
      config_(config),
      allocator_(config.num_blocks > 0 ? config.num_blocks : 1) {
  if (config.block_size < 1) {
    invalid("--block-size must be >= 1, got " + std::to_string(config.block_size));
  }
  if (config.max_num_seqs < 1) {
    invalid("--max-num-seqs must be >= 1, got " + std::to_string(config.max_num_seqs));
  }
  if (config.max_num_batched_tokens < 1) {
    invalid("--max-num-batched-tokens must be >= 1, got " +
            std::to_string(config.max_num_batched_tokens));
  }
  if (config.num_blocks < 1) {
    invalid("--num-blocks must be >= 1, got " + std::to_string(config.num_blocks));
  }
  for (const Request& r : requests_) {
    const int64_t need = blocks_for(held_tokens(r.total_len(), config), config.block_size);
    if (need > config.num_blocks) {
      invalid("the KV cache (" + std::to_string(config.num_blocks) + " blocks of " +
              std::to_string(config.block_size) + " tokens) cannot hold request " +
              std::to_string(r.id) + ", which needs " + std::to_string(need) + " blocks (prompt " +
              std::to_string(r.prompt_len) + " + output " + std::to_string(r.output_len) +
              " - 1 tokens); raise --num-blocks or --kv-cache-gb, or lower --prompt-len / "
              "--output-len");
    }
  }
  states_.resize(requests_.size());
  for (const Request& r : requests_) waiting_.push_back(r.id);
}

std::span<const int32_t> Scheduler::block_table(int32_t request) const {
  return states_.at(request).blocks;
}

bool Scheduler::try_admit(int32_t request) {
  const Request& r = requests_[request];
  State& s = states_[request];
  // Leading full blocks of the shared prefix that some request already computed.
  std::vector<int32_t> hits;
  if (r.prefix_id >= 0 && config_.dcp_world_size == 1) {
    for (int64_t i = 0; i < r.shared_prefix_len / config_.block_size; ++i) {
      const auto block = allocator_.cached_prefix_block(r.prefix_id, i);
      if (!block) break;
      hits.push_back(*block);
    }
  }
  int64_t hits_free = 0;  // hit blocks sitting in the free list leave it when retained
  for (int32_t b : hits) hits_free += allocator_.refcount(b) == 0 ? 1 : 0;
  const int64_t need = blocks_for(held_tokens(r.total_len(), config_), config_.block_size) -
                       static_cast<int64_t>(hits.size());
  if (allocator_.num_free() - hits_free - reserved_total_ < need) return false;

  for (int32_t b : hits) allocator_.retain(b);
  s.blocks = hits;
  s.num_computed = static_cast<int64_t>(hits.size()) * config_.block_size;
  s.reserved = need;
  s.phase = Phase::kPrefill;
  reserved_total_ += need;
  stats_.prefix_hit_tokens += s.num_computed;
  return true;
}

void Scheduler::add_chunk(Step& step, int32_t request, int64_t num_tokens, bool is_prompt) {
  State& s = states_[request];
  const int64_t needed =
      blocks_for(held_tokens(s.num_computed + num_tokens, config_), config_.block_size);
  while (static_cast<int64_t>(s.blocks.size()) < needed) {
    internal_check(s.reserved > 0, "a request outgrew its block reservation");
    s.blocks.push_back(allocator_.allocate());
    --s.reserved;
    --reserved_total_;
  }
  step.chunks.push_back({request, s.num_computed, num_tokens, is_prompt});
  step.num_tokens += num_tokens;
  (is_prompt ? step.num_prompt_tokens : step.num_generated_tokens) += num_tokens;
}

Step Scheduler::schedule() {
  internal_check(!done(), "schedule() called after every request finished");
  Step step;
  int64_t budget = config_.max_num_batched_tokens;
  for (int32_t id : running_) {  // decodes first: one token each
    if (budget == 0) break;
    if (states_[id].phase != Phase::kDecode) continue;
    add_chunk(step, id, 1, /*is_prompt=*/false);
    --budget;
  }
  for (int32_t id : running_) {  // then partial prefills, chunked to the budget
    if (budget == 0) break;
    const State& s = states_[id];
    if (s.phase != Phase::kPrefill) continue;
    const int64_t n = std::min(requests_[id].prompt_len - s.num_computed, budget);
    add_chunk(step, id, n, /*is_prompt=*/true);
    budget -= n;
  }
  while (budget > 0 && !waiting_.empty() &&
         static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
    const int32_t id = waiting_.front();
    if (!try_admit(id)) break;  // first-come-first-served: no overtaking
    waiting_.pop_front();
    running_.push_back(id);
    const int64_t n = std::min(requests_[id].prompt_len - states_[id].num_computed, budget);
    add_chunk(step, id, n, /*is_prompt=*/true);
    budget -= n;
  }
  internal_check(!step.chunks.empty(), "no request could be scheduled (deadlock)");
  std::stable_sort(
      step.chunks.begin(), step.chunks.end(),
      [](const ScheduledChunk& a, const ScheduledChunk& b) { return region(a) < region(b); });
  stats_.peak_blocks_used = std::max(stats_.peak_blocks_used, allocator_.num_used());
  return step;
}

void Scheduler::complete(const Step& step) {
  ++stats_.steps;
  stats_.prefill_steps += step.has_prefill() ? 1 : 0;
  stats_.prompt_tokens += step.num_prompt_tokens;
  stats_.decode_tokens += step.num_generated_tokens;
  for (const ScheduledChunk& c : step.chunks) {
    const Request& r = requests_[c.request];
    State& s = states_[c.request];
    internal_check(s.num_computed == c.num_computed, "a step was completed twice or out of order");
    s.num_computed += c.num_tokens;
    if (r.prefix_id >= 0 &&
        config_.dcp_world_size == 1) {  // full prefix blocks computed so far become shareable
      const int64_t full = std::min(s.num_computed, r.shared_prefix_len) / config_.block_size;
      for (int64_t i = 0; i < full; ++i) allocator_.cache_prefix_block(r.prefix_id, i, s.blocks[i]);
    }
    if (c.is_prompt) {
      if (s.num_computed < r.prompt_len) continue;
      s.phase = Phase::kDecode;  // the last prompt chunk samples the first output token
    }
    ++s.num_generated;
    if (s.num_generated == r.output_len) finish(c.request);
  }
}

void Scheduler::finish(int32_t request) {
  State& s = states_[request];
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) allocator_.release(*it);
  s.blocks.clear();
  reserved_total_ -= s.reserved;
  s.reserved = 0;
  s.phase = Phase::kFinished;
  running_.erase(std::find(running_.begin(), running_.end(), request));
  ++stats_.finished;
}

}  // namespace mlakit::sim
