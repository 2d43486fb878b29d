// Tests of the serving-simulation logic of `mlakit run`: block allocator, workload, scheduler and
// the per-step metadata. The scheduler is checked against an independent model of every request
// (what it computed, what it holds) after every step of randomized workloads.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "block_allocator.hpp"
#include "common/test_util.hpp"
#include "mlakit/error.hpp"
#include "scheduler.hpp"
#include "step_batch.hpp"
#include "work_model.hpp"
#include "workload.hpp"

namespace mlakit::sim {
namespace {

// ---- BlockAllocator -----------------------------------------------------------------------------

TEST(BlockAllocator, AllocatesEveryBlockOnceThenThrows) {
  BlockAllocator a(7);
  std::set<int32_t> seen;
  for (int i = 0; i < 7; ++i) {
    const int32_t b = a.allocate();
    EXPECT_TRUE(b >= 0 && b < 7) << b;
    EXPECT_TRUE(seen.insert(b).second) << "block " << b << " allocated twice";
    EXPECT_EQ(a.refcount(b), 1);
  }
  EXPECT_EQ(a.num_free(), 0);
  EXPECT_EQ(a.num_used(), 7);
  MLAKIT_EXPECT_THROW_MSG(a.allocate(), "no free block");
}

TEST(BlockAllocator, RefcountsReturnBlocksAtZeroInFifoOrder) {
  BlockAllocator a(3);
  const int32_t x = a.allocate(), y = a.allocate(), z = a.allocate();
  a.retain(x);
  EXPECT_EQ(a.refcount(x), 2);
  a.release(x);
  EXPECT_EQ(a.num_free(), 0) << "a block with a holder left must not be free";
  a.release(z);
  a.release(x);
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_EQ(a.allocate(), z) << "free list is first-in first-out";
  EXPECT_EQ(a.allocate(), x);
  a.release(y);
  MLAKIT_EXPECT_THROW_MSG(a.release(y), "already free");
  MLAKIT_EXPECT_THROW_MSG(a.release(3), "outside [0, 3)");
  MLAKIT_EXPECT_THROW_MSG(a.retain(-1), "outside [0, 3)");
  MLAKIT_EXPECT_THROW_MSG(BlockAllocator(0), "num_blocks must be >= 1");
}

TEST(BlockAllocator, PrefixBlocksStayCachedWhenFreeAndAreEvictedOnReuse) {
  BlockAllocator a(2);
  const int32_t b = a.allocate();
  MLAKIT_EXPECT_THROW_MSG(a.cache_prefix_block(0, 0, 1), "is not held");
  a.cache_prefix_block(/*prefix_id=*/0, /*index=*/0, b);
  a.release(b);
  ASSERT_EQ(a.cached_prefix_block(0, 0), b) << "a released prefix block stays cached";
  EXPECT_FALSE(a.cached_prefix_block(0, 1).has_value());
  EXPECT_FALSE(a.cached_prefix_block(1, 0).has_value());
  a.retain(b);  // a hit takes the free block off the free list
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_EQ(a.allocate(), 1 - b);
  a.release(b);
  a.release(1 - b);
  EXPECT_EQ(a.num_evictions(), 0);
  EXPECT_EQ(a.allocate(), b) << "b was released first";
  EXPECT_FALSE(a.cached_prefix_block(0, 0).has_value()) << "reuse must evict the cache entry";
  EXPECT_EQ(a.num_evictions(), 1);
}

TEST(BlockAllocator, SecondRegistrationOfAKeyIsIgnored) {
  BlockAllocator a(2);
  const int32_t x = a.allocate(), y = a.allocate();
  a.cache_prefix_block(0, 0, x);
  a.cache_prefix_block(0, 0, y);  // a duplicate computed concurrently stays private
  EXPECT_EQ(a.cached_prefix_block(0, 0), x);
  a.cache_prefix_block(0, 1, x);  // x already holds a key
  EXPECT_FALSE(a.cached_prefix_block(0, 1).has_value());
  EXPECT_EQ(a.num_cached(), 1);
}

// ---- Workload -----------------------------------------------------------------------------------

TEST(Workload, ParsesLengthRanges) {
  const LenRange r = parse_len_range("128:1024", "--prompt-len");
  EXPECT_EQ(r.min, 128);
  EXPECT_EQ(r.max, 1024);
  const LenRange one = parse_len_range("256", "--prompt-len");
  EXPECT_EQ(one.min, 256);
  EXPECT_EQ(one.max, 256);
  MLAKIT_EXPECT_THROW_MSG(parse_len_range("0:5", "--output-len"), "--output-len");
  MLAKIT_EXPECT_THROW_MSG(parse_len_range("0:5", "--prompt-len"), "min must be >= 1");
  MLAKIT_EXPECT_THROW_MSG(parse_len_range("9:3", "--prompt-len"), "max must be >= min");
  MLAKIT_EXPECT_THROW_MSG(parse_len_range("abc", "--prompt-len"), "not an integer");
  MLAKIT_EXPECT_THROW_MSG(parse_len_range("4:", "--prompt-len"), "not an integer");
  MLAKIT_EXPECT_THROW_MSG(parse_len_range("4:8x", "--prompt-len"), "not an integer");
}

TEST(Workload, LengthsInRangeSharersExactAndDeterministic) {
  WorkloadConfig config;
  config.num_requests = 40;
  config.prompt_len = {10, 90};
  config.output_len = {1, 7};
  config.shared_prefix_len = 50;
  config.shared_prefix_fraction = 0.25;
  config.seed = 7;
  const std::vector<Request> a = make_workload(config);
  ASSERT_EQ(a.size(), 40u);
  int sharers = 0;
  for (const Request& r : a) {
    EXPECT_TRUE(r.prompt_len >= 10 && r.prompt_len <= 90) << r.prompt_len;
    EXPECT_TRUE(r.output_len >= 1 && r.output_len <= 7) << r.output_len;
    if (r.prefix_id >= 0) {
      ++sharers;
      EXPECT_EQ(r.shared_prefix_len, std::min<int64_t>(50, r.prompt_len - 1));
    } else {
      EXPECT_EQ(r.shared_prefix_len, 0);
    }
  }
  EXPECT_EQ(sharers, 10);  // round(0.25 * 40)
  const std::vector<Request> b = make_workload(config);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt_len, b[i].prompt_len);
    EXPECT_EQ(a[i].output_len, b[i].output_len);
    EXPECT_EQ(a[i].prefix_id, b[i].prefix_id);
  }
  config.shared_prefix_fraction = 1.5;
  MLAKIT_EXPECT_THROW_MSG(make_workload(config), "--shared-prefix-fraction must be in [0, 1]");
  config.shared_prefix_fraction = 0.5;
  config.num_requests = 0;
  MLAKIT_EXPECT_THROW_MSG(make_workload(config), "--num-requests must be >= 1");
}

// ---- Scheduler: an independent model of every request, checked after every step -----------------

struct Tracked {
  int64_t computed = 0;   // tokens in the cache
  int64_t generated = 0;  // output tokens sampled
  bool admitted = false;
  bool finished = false;
};

// Runs the workload to completion, checking every invariant after every step; appends the steps.
void run_checked(const std::vector<Request>& requests, const SchedulerConfig& config,
                 std::vector<Step>* out = nullptr) {
  Scheduler s(requests, config);
  std::vector<Tracked> model(requests.size());
  std::vector<Step> steps;
  int64_t step_limit = 10;  // generous: one token per step, plus slack
  for (const Request& r : requests) step_limit += r.total_len() + 1;
  while (!s.done()) {
    if (static_cast<int64_t>(steps.size()) > step_limit) {
      ADD_FAILURE() << "no progress after " << step_limit << " steps";
      break;
    }
    // Running decodes before this step, in the model.
    int64_t running_decodes = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      running_decodes +=
          model[i].admitted && !model[i].finished && model[i].computed >= requests[i].prompt_len;
    }
    const Step step = s.schedule();
    const StepBatch batch = make_step_batch(step, s);

    EXPECT_GE(step.num_tokens, 1);
    EXPECT_LE(step.num_tokens, config.max_num_batched_tokens) << "token budget exceeded";
    EXPECT_LE(s.num_running(), config.max_num_seqs);
    EXPECT_GE(s.allocator().num_free(), s.reserved_blocks()) << "reservations not backed";
    int64_t sum = 0, prompt = 0, decodes = 0, last_region = 0;
    std::set<int32_t> in_step;
    for (const ScheduledChunk& c : step.chunks) {
      const Request& r = requests[c.request];
      Tracked& m = model[c.request];
      EXPECT_TRUE(in_step.insert(c.request).second) << "request twice in one step";
      EXPECT_FALSE(m.finished) << "finished request " << c.request << " scheduled";
      EXPECT_GE(c.num_tokens, 1);
      if (!m.admitted) {  // first chunk: starts at the prefix-cache hit
        m.admitted = true;
        EXPECT_EQ(c.num_computed % config.block_size, 0);
        EXPECT_LE(c.num_computed, r.shared_prefix_len);
        m.computed = c.num_computed;
      }
      EXPECT_EQ(c.num_computed, m.computed) << "request " << c.request << " skipped tokens";
      if (c.is_prompt) {
        EXPECT_LE(c.seq_len(), r.prompt_len);
        prompt += c.num_tokens;
      } else {
        EXPECT_EQ(c.num_tokens, 1) << "a decode gets one token";
        EXPECT_GE(c.num_computed, r.prompt_len);
        ++decodes;
      }
      const int64_t region = c.is_decode_region() ? 0 : (c.num_computed > 0 ? 1 : 2);
      EXPECT_GE(region, last_region) << "batch not ordered decodes, extends, prefills";
      last_region = region;
      sum += c.num_tokens;
      // The request's blocks cover every position of this step.
      EXPECT_GE(static_cast<int64_t>(s.block_table(c.request).size()),
                blocks_for(c.seq_len(), config.block_size));
    }
    EXPECT_EQ(sum, step.num_tokens);
    EXPECT_EQ(prompt, step.num_prompt_tokens);
    EXPECT_EQ(step.num_tokens - prompt, step.num_generated_tokens);
    EXPECT_EQ(decodes, std::min(running_decodes, config.max_num_batched_tokens))
        << "running decodes are scheduled before any prefill";

    // Every block reference is counted, and only full prefix blocks are shared.
    std::map<int32_t, std::vector<std::pair<int32_t, int64_t>>> holders;  // block -> (req, index)
    for (size_t i = 0; i < requests.size(); ++i) {
      const auto table = s.block_table(static_cast<int32_t>(i));
      for (size_t k = 0; k < table.size(); ++k) {
        holders[table[k]].push_back({static_cast<int32_t>(i), static_cast<int64_t>(k)});
      }
    }
    int64_t used = 0;
    for (int32_t b = 0; b < config.num_blocks; ++b) {
      const auto it = holders.find(b);
      const auto n = it == holders.end() ? 0 : static_cast<int64_t>(it->second.size());
      EXPECT_EQ(s.allocator().refcount(b), n) << "block " << b;
      used += n > 0;
      if (n < 2) continue;
      for (const auto& [req, index] : it->second) {
        EXPECT_LE((index + 1) * config.block_size, requests[req].shared_prefix_len)
            << "block " << b << " shared outside the prefix";
        EXPECT_EQ(index, it->second.front().second) << "shared block at different positions";
      }
    }
    EXPECT_EQ(used, s.allocator().num_used());

    // Step metadata: slots follow the block tables, never repeat, never hit a shared block.
    ASSERT_EQ(batch.num_reqs(), static_cast<int64_t>(step.chunks.size()));
    ASSERT_EQ(static_cast<int64_t>(batch.slot_mapping.size()), step.num_tokens);
    std::set<int64_t> slots;
    int64_t expected_decodes = batch.num_reqs();
    for (int64_t i = 0; i < batch.num_reqs(); ++i) {
      const ScheduledChunk& c = step.chunks[i];
      const auto table = s.block_table(c.request);
      EXPECT_EQ(batch.query_start_loc[i + 1] - batch.query_start_loc[i], c.num_tokens);
      EXPECT_EQ(batch.seq_lens[i], c.seq_len());
      EXPECT_LE(c.seq_len(), batch.block_table_width * config.block_size);
      for (int64_t k = 0; k < blocks_for(c.seq_len(), config.block_size); ++k) {
        EXPECT_EQ(batch.block_table[i * batch.block_table_width + k], table[k]);
      }
      for (int64_t pos = c.num_computed; pos < c.seq_len(); ++pos) {
        const int64_t slot = batch.slot_mapping[batch.query_start_loc[i] + pos - c.num_computed];
        EXPECT_EQ(slot,
                  table[pos / config.block_size] * config.block_size + pos % config.block_size);
        EXPECT_TRUE(slots.insert(slot).second) << "slot " << slot << " written twice";
        EXPECT_EQ(s.allocator().refcount(static_cast<int32_t>(slot / config.block_size)), 1)
            << "a write into a shared block";
      }
      if (c.num_tokens > 1 && expected_decodes == batch.num_reqs()) expected_decodes = i;
    }
    EXPECT_EQ(batch.num_decodes, expected_decodes);

    s.complete(step);
    for (const ScheduledChunk& c : step.chunks) {
      Tracked& m = model[c.request];
      m.computed += c.num_tokens;
      if (m.computed >= requests[c.request].prompt_len)
        m.generated = m.computed - requests[c.request].prompt_len + 1;
      if (m.generated == requests[c.request].output_len) m.finished = true;
      EXPECT_EQ(s.block_table(c.request).empty(), m.finished) << "finished requests free blocks";
    }
    steps.push_back(step);
    if (::testing::Test::HasFailure()) break;  // one broken step is enough to read
  }
  int64_t prompt_total = 0, decode_total = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(model[i].finished) << "request " << i << " never finished";
    EXPECT_EQ(model[i].computed, requests[i].total_len());
    prompt_total += requests[i].prompt_len;
    decode_total += requests[i].output_len - 1;
  }
  EXPECT_EQ(s.stats().prompt_tokens + s.stats().prefix_hit_tokens, prompt_total);
  EXPECT_EQ(s.stats().decode_tokens, decode_total);
  EXPECT_EQ(s.stats().steps, static_cast<int64_t>(steps.size()));
  EXPECT_EQ(s.allocator().num_used(), 0) << "blocks leaked";
  EXPECT_EQ(s.reserved_blocks(), 0);
  EXPECT_LE(s.stats().peak_blocks_used, config.num_blocks);
  if (out != nullptr) *out = steps;
}

TEST(Scheduler, RandomWorkloadsKeepEveryInvariant) {
  auto rng = test::make_rng(/*stream=*/1);
  auto pick = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng() % (hi - lo + 1));
  };
  for (int trial = 0; trial < 60; ++trial) {
    WorkloadConfig w;
    w.num_requests = pick(1, 24);
    w.prompt_len.min = pick(1, 120);
    w.prompt_len.max = w.prompt_len.min + pick(0, 200);
    w.output_len.min = pick(1, 10);
    w.output_len.max = w.output_len.min + pick(0, 30);
    w.shared_prefix_len = pick(0, 150);
    w.shared_prefix_fraction = static_cast<double>(pick(0, 4)) / 4.0;
    w.seed = rng();
    const std::vector<Request> requests = make_workload(w);
    SchedulerConfig config;
    const int64_t sizes[] = {1, 4, 16, 64};
    config.block_size = sizes[pick(0, 3)];
    config.max_num_seqs = pick(1, 10);
    config.max_num_batched_tokens = pick(1, 400);
    int64_t largest = 0;
    for (const Request& r : requests)
      largest = std::max(largest, blocks_for(r.total_len(), config.block_size));
    config.num_blocks = largest + pick(0, 3 * largest);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": requests " + std::to_string(w.num_requests) +
                 ", block " + std::to_string(config.block_size) + ", seqs " +
                 std::to_string(config.max_num_seqs) + ", budget " +
                 std::to_string(config.max_num_batched_tokens) + ", blocks " +
                 std::to_string(config.num_blocks));
    run_checked(requests, config);
    if (HasFailure()) return;
  }
}

TEST(Scheduler, ChunksALongPromptAcrossStepsThenDecodes) {
  const std::vector<Request> requests = {{0, 1000, 3, -1, 0}};
  std::vector<Step> steps;
  run_checked(requests, {/*num_blocks=*/64, 16, 4, 256}, &steps);
  ASSERT_EQ(steps.size(), 6u);
  const int64_t expected[] = {256, 256, 256, 232, 1, 1};
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].num_tokens, expected[i]) << "step " << i;
    EXPECT_EQ(steps[i].chunks[0].num_computed,
              i < 4 ? 256 * static_cast<int64_t>(i) : 1000 + static_cast<int64_t>(i) - 4);
  }
}

TEST(Scheduler, LaterRequestsHitTheComputedPrefix) {
  // One request at a time: the first computes the 256-token prefix (4 blocks of 64), the next
  // three start with it computed.
  std::vector<Request> requests;
  for (int32_t i = 0; i < 4; ++i) requests.push_back({i, 300, 2, 0, 256});
  Scheduler s(requests, {/*num_blocks=*/10, 64, 1, 512});
  int64_t first_chunks = 0;
  while (!s.done()) {
    const Step step = s.schedule();
    for (const ScheduledChunk& c : step.chunks) {
      if (c.is_prompt && (c.num_computed == 0 || c.num_computed == 256)) {
        EXPECT_EQ(c.num_computed, first_chunks == 0 ? 0 : 256) << "request " << c.request;
        ++first_chunks;
      }
    }
    s.complete(step);
  }
  EXPECT_EQ(first_chunks, 4);
  EXPECT_EQ(s.stats().prefix_hit_tokens, 3 * 256);
  EXPECT_EQ(s.stats().prompt_tokens, 4 * 300 - 3 * 256);
  EXPECT_EQ(s.allocator().num_evictions(), 0);
}

TEST(Scheduler, EvictedPrefixBlocksAreRecomputed) {
  // The middle request needs the whole cache, so it evicts the prefix the first one computed.
  const std::vector<Request> requests = {
      {0, 300, 2, 0, 256}, {1, 640, 1, -1, 0}, {2, 300, 2, 0, 256}};
  Scheduler s(requests, {/*num_blocks=*/10, 64, 1, 1024});
  while (!s.done()) s.complete(s.schedule());
  EXPECT_EQ(s.stats().prefix_hit_tokens, 0);
  EXPECT_GE(s.allocator().num_evictions(), 4);
  EXPECT_EQ(s.stats().prompt_tokens, 300 + 640 + 300);
}

TEST(Scheduler, PrefixSharedWhileBothRequestsRun) {
  // Request 1 is admitted after request 0 computed the prefix, while 0 still runs: the prefix
  // blocks then have two holders (run_checked verifies refcounts and positions).
  const std::vector<Request> requests = {{0, 200, 20, 0, 128}, {1, 200, 20, 0, 128}};
  run_checked(requests, {/*num_blocks=*/16, 32, 2, 200});
  Scheduler s(requests, {16, 32, 2, 200});
  while (!s.done()) s.complete(s.schedule());
  EXPECT_EQ(s.stats().prefix_hit_tokens, 128);
}

TEST(Scheduler, RejectsACacheTooSmallForTheLargestRequest) {
  const std::vector<Request> requests = {{0, 100, 30, -1, 0}};  // 129 tokens = 9 blocks of 16
  MLAKIT_EXPECT_THROW_MSG(Scheduler(requests, {8, 16, 1, 64}), "needs 9 blocks");
  MLAKIT_EXPECT_THROW_MSG(Scheduler(requests, {8, 16, 1, 64}),
                          "raise --num-blocks or --kv-cache-gb");
  MLAKIT_EXPECT_THROW_MSG(Scheduler(requests, {9, 0, 1, 64}), "--block-size must be >= 1");
  MLAKIT_EXPECT_THROW_MSG(Scheduler(requests, {9, 16, 0, 64}), "--max-num-seqs must be >= 1");
  MLAKIT_EXPECT_THROW_MSG(Scheduler(requests, {9, 16, 1, 0}),
                          "--max-num-batched-tokens must be >= 1");
  EXPECT_NO_THROW(Scheduler(requests, {9, 16, 1, 64}));
}

// ---- Work model ---------------------------------------------------------------------------------

TEST(WorkModel, CountsFlopsAndBytesByHand) {
  // One decode (q 1, s 10) and one extend (q 3 new tokens after 5 context tokens) with tiny dims.
  StepBatch batch;
  batch.query_start_loc = {0, 1, 4};
  batch.seq_lens = {10, 8};
  batch.num_decodes = 1;
  const MlaDims d{/*num_heads=*/2, /*kv_lora_rank=*/8, /*qk_rope_head_dim=*/4,
                  /*qk_nope_head_dim=*/6, /*v_head_dim=*/5};
  const StepWork w = step_work(batch, d, /*entry_bytes=*/24, /*act_bytes=*/2);
  // decode: 2 * 1 * 2 * (6*8 + 10*(8+4+8) + 8*5) = 4 * 288
  EXPECT_DOUBLE_EQ(w.decode_flops, 4.0 * 288.0);
  // 10 entries of 24 bytes + W_UK_T (2*6*8) and W_UV (2*8*5) in 2-byte elements
  EXPECT_DOUBLE_EQ(w.decode_bytes, 240.0 + 2.0 * (96.0 + 80.0));
  // up-projection 2*8*8*2*11 = 2816; attention 2*2*15*(6+7+8) = 1260
  EXPECT_DOUBLE_EQ(w.prefill_flops, 2816.0 + 1260.0);
}

}  // namespace
}  // namespace mlakit::sim
