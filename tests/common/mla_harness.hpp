// End-to-end harness: builds a batch the way an inference engine would (paged cache with a
// random block permutation and NaN-poisoned free slots, context written through
// concat_and_cache_mla, decodes first), runs MlaAttention::forward and computes the fp64 oracle
// (ref::mla_mha, the non-absorbed MHA form) on the values the library sees.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "mlakit/attention.hpp"
#include "mlakit/config.hpp"
#include "mlakit/dist.hpp"
#include "mlakit/types.hpp"

namespace mlakit::test {

struct E2eCase {
  std::string name;
  MlaDims dims;
  DType act_dtype = DType::kBF16;
  KvCacheDType kv_dtype = KvCacheDType::kAuto;
  int64_t block_size = 16;
  std::vector<int32_t> seq_lens;    // [R] context + query
  std::vector<int32_t> query_lens;  // [R] (decodes first)
  int64_t decode_threshold = 1;
  QueryLenSupport support = QueryLenSupport::kVarlen;
  int64_t workspace_tokens = 0;  // 0: derive from max_model_len
  ChunkPolicy chunk_policy = ChunkPolicy::kPacked;
  float q_scale = 1.0f, k_scale = 1.0f;
  int64_t padding_requests = 0;  // CUDA-graph padding: q_len 0, seq_len 0, slot -1
  int64_t padding_tokens = 0;    // extra tokens counted in num_actual_tokens (uniform padding)
  int64_t spare_rows = 3;        // rows past num_actual_tokens that must stay untouched
  uint64_t seed_stream = 0;
  Device device{};  // the layer's device; inputs are built on the host and copied there
  // Engine mode: num_layers layers (each with its own weights, cache contents and activations,
  // one block table) run one StepPlan from plan_step over one shared Workspace, as an engine step
  // does; otherwise the layer's single-call forward.
  bool step_plan = false;
  int64_t num_layers = 1;
  bool batch_invariant = false;
  // The model has head_ranks * N query heads and this layer serves slice head_rank of them (its
  // rows of kv_b_proj and its query heads); every rank draws the same model and batch from
  // seed_stream (block orders come from a generator of their own, different on every rank).
  int64_t head_ranks = 1, head_rank = 0;
  // Decode context parallelism: the layer is rank head_rank of the DCP group of dcp_comm
  // (head_ranks ranks, interleave dcp_interleave), holding only its share of every request's
  // tokens in a cache and block table of its own. Null: no DCP.
  dist::Communicator* dcp_comm = nullptr;
  int64_t dcp_interleave = 1;
  // False: the output rows are not checked against the oracle (whose up-projection costs
  // seconds at DeepSeek sizes); for a run compared with another one that is. The padding and
  // untouched rows are checked either way.
  bool check_oracle = true;
};

struct E2eResult {
  int64_t num_decodes = 0, num_prefills = 0, context_chunks = 0;
  double max_abs_error = 0;
  Tensor output;  // layer 0's output [T + spare rows, N * V], host copy
};

// A random mixed case for iteration `iter` (small dims, every dtype / cache / block size / chunk
// policy): up to 6 requests, decodes (q_len 1, context in [1, max_context + 1]) first, then
// prefills (q_len in [1, max_query], context 0 or in [0, max_context]); a chunk workspace of
// `chunk_blocks` blocks on every other draw.
E2eCase random_case(std::mt19937_64& rng, int iter, int max_context, int max_query,
                    int64_t chunk_blocks);

// Runs the case, checks every output row against the oracle (tolerance by dtype and cache
// format; unless check_oracle is false) and the untouched rows; reports failures through gtest.
E2eResult run_e2e_case(const E2eCase& c);

}  // namespace mlakit::test
