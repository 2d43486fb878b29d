// The host-side planner of plan.hpp behind the C ABI.
#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "capi/boundary.hpp"
#include "mlakit/plan.hpp"

using mlakit::capi::guarded;
using mlakit::capi::require_count;
using mlakit::capi::require_pointer;
using mlakit::capi::require_request_count;

namespace {

// The C enumerations carry the C++ enumerators' values.
static_assert(static_cast<int>(mlakit::QueryLenSupport::kSingleOnly) ==
              MLAKIT_QUERY_LEN_SINGLE_ONLY);
static_assert(static_cast<int>(mlakit::QueryLenSupport::kUniform) == MLAKIT_QUERY_LEN_UNIFORM);
static_assert(static_cast<int>(mlakit::QueryLenSupport::kVarlen) == MLAKIT_QUERY_LEN_VARLEN);
static_assert(static_cast<int>(mlakit::ChunkPolicy::kEqualShare) == MLAKIT_CHUNK_EQUAL_SHARE);
static_assert(static_cast<int>(mlakit::ChunkPolicy::kPacked) == MLAKIT_CHUNK_PACKED);

std::span<const int32_t> host_span(const int32_t* data, int64_t count) {
  return {data, static_cast<size_t>(count)};
}

mlakit_split_counts_t to_c(const mlakit::SplitCounts& s) {
  return {s.num_decodes, s.num_prefills, s.num_decode_tokens, s.num_prefill_tokens};
}

// A borrowed view of a plan vector.
void expose(const std::vector<int32_t>& values, const int32_t** data, int64_t* length) {
  *data = values.empty() ? nullptr : values.data();
  *length = static_cast<int64_t>(values.size());
}

const mlakit::ContextChunk& chunk_at(const char* op, const mlakit_plan_t* plan, int64_t chunk) {
  require_pointer(op, "plan", plan);
  const auto& chunks = plan->plan.context_chunks;
  mlakit::detail::require(chunk >= 0 && chunk < static_cast<int64_t>(chunks.size()),
                          mlakit::ErrorCode::kOutOfRange, op, ": chunk must be in [0, ",
                          chunks.size(), "), got ", chunk);
  return chunks[static_cast<size_t>(chunk)];
}

}  // namespace

extern "C" {

MLAKIT_API mlakit_status_t mlakit_split_decodes_and_prefills(
    const int32_t* query_start_loc, int64_t num_reqs, int64_t num_actual_tokens,
    int64_t decode_threshold, int32_t require_uniform, mlakit_split_counts_t* counts) {
  constexpr const char* kOp = "split_decodes_and_prefills";
  return guarded(kOp, [&] {
    require_pointer(kOp, "counts", counts);
    require_request_count(kOp, "num_reqs", num_reqs);
    require_pointer(kOp, "query_start_loc", query_start_loc);  // num_reqs + 1 >= 1 entries
    *counts = to_c(mlakit::split_decodes_and_prefills(host_span(query_start_loc, num_reqs + 1),
                                                      num_actual_tokens, decode_threshold,
                                                      require_uniform != 0));
  });
}

MLAKIT_API mlakit_status_t mlakit_reorder_decodes_first(const int32_t* num_scheduled,
                                                        const int32_t* num_computed,
                                                        int64_t num_reqs, int64_t decode_threshold,
                                                        int32_t* order) {
  constexpr const char* kOp = "reorder_decodes_first";
  return guarded(kOp, [&] {
    require_count(kOp, "num_reqs", num_reqs);
    if (num_reqs > 0) {
      require_pointer(kOp, "num_scheduled", num_scheduled);
      require_pointer(kOp, "num_computed", num_computed);
      require_pointer(kOp, "order", order);
    }
    const std::vector<int32_t> result = mlakit::reorder_decodes_first(
        host_span(num_scheduled, num_reqs), host_span(num_computed, num_reqs), decode_threshold);
    mlakit::detail::require(static_cast<int64_t>(result.size()) == num_reqs,
                            mlakit::ErrorCode::kInternal, kOp, ": order has ", result.size(),
                            " entries for ", num_reqs, " requests");
    std::copy(result.begin(), result.end(), order);
  });
}

MLAKIT_API mlakit_status_t mlakit_chunked_prefill_workspace_tokens(int64_t max_model_len,
                                                                   int64_t max_num_seqs,
                                                                   int64_t block_size,
                                                                   int64_t* tokens) {
  constexpr const char* kOp = "chunked_prefill_workspace_tokens";
  return guarded(kOp, [&] {
    require_pointer(kOp, "tokens", tokens);
    *tokens = mlakit::chunked_prefill_workspace_tokens(max_model_len, max_num_seqs, block_size);
  });
}

MLAKIT_API void mlakit_planner_config_init(mlakit_planner_config_t* config) {
  if (config == nullptr) return;
  const mlakit::PlannerConfig defaults;
  config->block_size = defaults.block_size;
  config->decode_threshold = defaults.decode_threshold;
  config->query_len_support = static_cast<int32_t>(defaults.query_len_support);
  config->chunk_policy = static_cast<int32_t>(defaults.chunk_policy);
  config->workspace_tokens = defaults.workspace_tokens;
  config->num_workers = defaults.num_workers;
}

MLAKIT_API mlakit_status_t mlakit_make_plan(const int32_t* query_start_loc, const int32_t* seq_lens,
                                            int64_t num_reqs, int64_t num_actual_tokens,
                                            int64_t block_table_width,
                                            const mlakit_planner_config_t* config,
                                            mlakit_plan_t** plan) {
  constexpr const char* kOp = "make_plan";
  return guarded(kOp, [&] {
    require_pointer(kOp, "plan", plan);
    *plan = nullptr;
    require_pointer(kOp, "config", config);
    require_request_count(kOp, "num_reqs", num_reqs);
    require_pointer(kOp, "query_start_loc", query_start_loc);
    if (num_reqs > 0) require_pointer(kOp, "seq_lens", seq_lens);

    mlakit::BatchDesc batch;
    batch.query_start_loc = host_span(query_start_loc, num_reqs + 1);
    batch.seq_lens = host_span(seq_lens, num_reqs);
    batch.num_actual_tokens = num_actual_tokens;
    batch.block_table_width = block_table_width;
    mlakit::PlannerConfig cfg;
    cfg.block_size = config->block_size;
    cfg.decode_threshold = config->decode_threshold;
    cfg.query_len_support = mlakit::capi::to_query_len_support(kOp, config->query_len_support);
    cfg.chunk_policy = mlakit::capi::to_chunk_policy(kOp, config->chunk_policy);
    cfg.workspace_tokens = config->workspace_tokens;
    cfg.num_workers = config->num_workers;

    auto handle = std::make_unique<mlakit_plan>();
    handle->plan = mlakit::make_plan(batch, cfg);
    *plan = handle.release();
  });
}

MLAKIT_API void mlakit_plan_destroy(mlakit_plan_t* plan) { delete plan; }

MLAKIT_API mlakit_status_t mlakit_plan_get_summary(const mlakit_plan_t* plan,
                                                   mlakit_plan_summary_t* summary) {
  constexpr const char* kOp = "plan_get_summary";
  return guarded(kOp, [&] {
    require_pointer(kOp, "plan", plan);
    require_pointer(kOp, "summary", summary);
    const mlakit::Plan& p = plan->plan;
    summary->num_reqs = p.num_reqs;
    summary->num_actual_tokens = p.num_actual_tokens;
    summary->split = to_c(p.split);
    summary->decode_query_len = p.decode_query_len;
    summary->max_decode_query_len = p.max_decode_query_len;
    summary->prefill_max_query_len = p.prefill_max_query_len;
    summary->num_context_chunks = static_cast<int64_t>(p.context_chunks.size());
    summary->decode_total_splits = p.decode_schedule.total_splits;
    summary->decode_max_splits = p.decode_schedule.max_splits;
  });
}

MLAKIT_API mlakit_status_t mlakit_plan_get_array(const mlakit_plan_t* plan, int32_t which,
                                                 const int32_t** data, int64_t* length) {
  constexpr const char* kOp = "plan_get_array";
  return guarded(kOp, [&] {
    require_pointer(kOp, "plan", plan);
    require_pointer(kOp, "data", data);
    require_pointer(kOp, "length", length);
    const mlakit::Plan& p = plan->plan;
    switch (which) {
      case MLAKIT_PLAN_PREFILL_QUERY_START_LOC:
        return expose(p.prefill_query_start_loc, data, length);
      case MLAKIT_PLAN_PREFILL_CONTEXT_LENS:
        return expose(p.prefill_context_lens, data, length);
      case MLAKIT_PLAN_DECODE_SPLIT_OFFSETS:
        return expose(p.decode_schedule.split_offsets, data, length);
      case MLAKIT_PLAN_DECODE_SPLIT_LEN:
        return expose(p.decode_schedule.split_len, data, length);
    }
    mlakit::detail::fail(mlakit::ErrorCode::kInvalidArgument,
                         mlakit::detail::str_cat(kOp, ": which must be in [0, 3], got ", which));
  });
}

MLAKIT_API mlakit_status_t mlakit_plan_get_chunk_info(const mlakit_plan_t* plan, int64_t chunk,
                                                      int64_t* total_tokens, int64_t* max_seq_len) {
  constexpr const char* kOp = "plan_get_chunk_info";
  return guarded(kOp, [&] {
    const mlakit::ContextChunk& c = chunk_at(kOp, plan, chunk);
    require_pointer(kOp, "total_tokens", total_tokens);
    require_pointer(kOp, "max_seq_len", max_seq_len);
    *total_tokens = c.total_tokens;
    *max_seq_len = c.max_seq_len;
  });
}

MLAKIT_API mlakit_status_t mlakit_plan_get_chunk_array(const mlakit_plan_t* plan, int64_t chunk,
                                                       int32_t which, const int32_t** data,
                                                       int64_t* length) {
  constexpr const char* kOp = "plan_get_chunk_array";
  return guarded(kOp, [&] {
    const mlakit::ContextChunk& c = chunk_at(kOp, plan, chunk);
    require_pointer(kOp, "data", data);
    require_pointer(kOp, "length", length);
    switch (which) {
      case MLAKIT_CHUNK_STARTS:
        return expose(c.starts, data, length);
      case MLAKIT_CHUNK_SEQ_LENS:
        return expose(c.seq_lens, data, length);
      case MLAKIT_CHUNK_CU_SEQ_LENS:
        return expose(c.cu_seq_lens, data, length);
      case MLAKIT_CHUNK_TOKEN_TO_SEQ:
        return expose(c.token_to_seq, data, length);
    }
    mlakit::detail::fail(mlakit::ErrorCode::kInvalidArgument,
                         mlakit::detail::str_cat(kOp, ": which must be in [0, 3], got ", which));
  });
}

}  // extern "C"
