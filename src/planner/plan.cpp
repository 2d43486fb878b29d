// make_plan: validates one forward step's batch and assembles its Plan (spec B.6 without DCP).
#include "mlakit/plan.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "core/check.hpp"
#include "mlakit/dcp.hpp"
#include "planner/context_chunks.hpp"

namespace mlakit {

namespace {
constexpr const char* kOp = "make_plan";

using detail::require;

const char* query_len_support_name(QueryLenSupport support) {
  switch (support) {
    case QueryLenSupport::kSingleOnly:
      return "single_only";
    case QueryLenSupport::kUniform:
      return "uniform";
    case QueryLenSupport::kVarlen:
      return "varlen";
  }
  return "unknown";
}

void validate_config(const PlannerConfig& config) {
  require(config.block_size > 0, ErrorCode::kInvalidArgument, kOp,
          ": config.block_size must be > 0, got ", config.block_size);
  require(config.workspace_tokens > 0, ErrorCode::kInvalidArgument, kOp,
          ": config.workspace_tokens must be > 0, got ", config.workspace_tokens);
  require(config.workspace_tokens >= config.block_size, ErrorCode::kInvalidArgument, kOp,
          ": config.workspace_tokens must hold at least one block (block_size ", config.block_size,
          "), got ", config.workspace_tokens);
  require(config.workspace_tokens <= std::numeric_limits<int32_t>::max(),
          ErrorCode::kInvalidArgument, kOp,
          ": config.workspace_tokens must be <= ", std::numeric_limits<int32_t>::max(),
          " (int32 row offsets), got ", config.workspace_tokens);
  require(config.decode_threshold >= 1, ErrorCode::kInvalidArgument, kOp,
          ": config.decode_threshold must be >= 1, got ", config.decode_threshold);
  require(config.query_len_support != QueryLenSupport::kSingleOnly || config.decode_threshold == 1,
          ErrorCode::kInvalidArgument, kOp,
          ": config.decode_threshold must be 1 when query_len_support is single_only, got ",
          config.decode_threshold);
  require(config.num_workers >= 1, ErrorCode::kInvalidArgument, kOp,
          ": config.num_workers must be >= 1, got ", config.num_workers);
  config.dcp.validate();
}

// Under DCP a rank holds its local share of every request: its block-table row covers that.
int64_t held_tokens(int64_t seq_len, const DcpConfig& dcp) {
  return dcp_local_seq_len(seq_len, dcp.world_size, dcp.rank, dcp.interleave);
}

// query_start_loc and seq_lens agree, every query fits its sequence, every sequence its row of
// the block table.
void validate_batch(const BatchDesc& batch, int64_t block_size, const DcpConfig& dcp) {
  const std::span<const int32_t> qsl = batch.query_start_loc;
  const int64_t num_reqs = static_cast<int64_t>(batch.seq_lens.size());
  require(static_cast<int64_t>(qsl.size()) == num_reqs + 1, ErrorCode::kInvalidArgument, kOp,
          ": query_start_loc must have num_reqs + 1 = ", num_reqs + 1,
          " entries (num_reqs = seq_lens.size()), got ", qsl.size());
  require(qsl[0] == 0, ErrorCode::kInvalidArgument, kOp, ": query_start_loc[0] must be 0, got ",
          qsl[0]);
  for (int64_t i = 0; i < num_reqs; ++i) {
    require(qsl[i + 1] >= qsl[i], ErrorCode::kInvalidArgument, kOp,
            ": query_start_loc must be non-decreasing, got query_start_loc[", i + 1,
            "] = ", qsl[i + 1], " < query_start_loc[", i, "] = ", qsl[i]);
  }
  require(qsl[num_reqs] <= batch.num_actual_tokens, ErrorCode::kInvalidArgument, kOp,
          ": query_start_loc[num_reqs] (", qsl[num_reqs],
          ") must be <= num_actual_tokens, got num_actual_tokens ", batch.num_actual_tokens);
  require(batch.block_table_width >= 0, ErrorCode::kInvalidArgument, kOp,
          ": block_table_width must be >= 0, got ", batch.block_table_width);
  for (int64_t i = 0; i < num_reqs; ++i) {
    const int64_t seq_len = batch.seq_lens[i];
    const int64_t query_len = int64_t{qsl[i + 1]} - qsl[i];
    require(seq_len >= 0, ErrorCode::kInvalidArgument, kOp, ": seq_lens[", i,
            "] must be >= 0, got ", seq_len);
    require(seq_len >= query_len, ErrorCode::kInvalidArgument, kOp, ": seq_lens[", i, "] (",
            seq_len, ") must be >= the query length of request ", i, " (", query_len, ")");
    const int64_t held = held_tokens(seq_len, dcp);
    const int64_t blocks = (held + block_size - 1) / block_size;
    require(blocks <= batch.block_table_width, ErrorCode::kOutOfRange, kOp, ": request ", i,
            " with seq_len ", seq_len, dcp.enabled() ? " (" : "",
            dcp.enabled() ? detail::str_cat(held, " tokens on DCP rank ", dcp.rank, ")") : "",
            " needs ", blocks, " blocks of block_size ", block_size, ", but block_table_width is ",
            batch.block_table_width);
  }
}

// The decode tokens form a [num_decodes, q] block: q tokens per real decode, the padding
// requests (0 tokens) after them, and the padded tokens at the end. Returns q, or -1 if the
// decodes are not uniform in that sense.
int64_t uniform_decode_query_len(std::span<const int32_t> qsl, const SplitCounts& split) {
  int64_t q = 0;
  for (int64_t i = 0; i < split.num_decodes; ++i) q = std::max<int64_t>(q, qsl[i + 1] - qsl[i]);
  for (int64_t i = 0; i < split.num_decodes; ++i) {
    const int64_t len = qsl[i + 1] - qsl[i];
    const bool in_place = len == q && qsl[i] == i * q;  // a real decode at row i
    if (!in_place && len != 0) return -1;
  }
  return split.num_decode_tokens == split.num_decodes * q ? q : -1;
}

}  // namespace

Plan make_plan(const BatchDesc& batch, const PlannerConfig& config) {
  validate_config(config);
  validate_batch(batch, config.block_size, config.dcp);
  const bool dcp = config.dcp.enabled();
  const int64_t decode_threshold = dcp ? 1 : config.decode_threshold;

  const std::span<const int32_t> qsl = batch.query_start_loc;
  const std::span<const int32_t> seq_lens = batch.seq_lens;
  const int64_t num_reqs = static_cast<int64_t>(seq_lens.size());
  const bool require_uniform = config.query_len_support != QueryLenSupport::kVarlen;

  Plan plan;
  plan.num_reqs = num_reqs;
  plan.num_actual_tokens = batch.num_actual_tokens;
  plan.split =
      split_decodes_and_prefills(qsl, batch.num_actual_tokens, decode_threshold, require_uniform);
  const int64_t nd = plan.split.num_decodes;

  // Decode part.
  for (int64_t i = 0; i < nd; ++i) {
    plan.max_decode_query_len = std::max<int64_t>(plan.max_decode_query_len, qsl[i + 1] - qsl[i]);
  }
  const int64_t uniform_q = uniform_decode_query_len(qsl, plan.split);
  require(!require_uniform || uniform_q >= 0, ErrorCode::kInvalidArgument, kOp,
          ": query_len_support ", query_len_support_name(config.query_len_support),
          " needs the decode tokens as a [num_decodes, q_len] block (padding requests last, ",
          "padded tokens included), got num_decodes ", nd, ", num_decode_tokens ",
          plan.split.num_decode_tokens, " and max decode query length ", plan.max_decode_query_len);
  plan.decode_query_len = std::max<int64_t>(uniform_q, 0);
  if (dcp) plan.local_seq_lens = dcp_local_seq_lens(seq_lens, config.dcp);
  const std::span<const int32_t> decode_lens =
      dcp ? std::span<const int32_t>(plan.local_seq_lens) : seq_lens;
  plan.decode_schedule =
      plan_decode_splits(decode_lens.first(nd), config.block_size, config.num_workers);

  // Prefill part: its queries rebased to 0, its contexts, and the context chunks.
  const int64_t np = plan.split.num_prefills;
  plan.prefill_query_start_loc.resize(np + 1);
  plan.prefill_context_lens.resize(np);
  for (int64_t r = 0; r <= np; ++r) plan.prefill_query_start_loc[r] = qsl[nd + r] - qsl[nd];
  for (int64_t r = 0; r < np; ++r) {
    const int32_t query_len = plan.prefill_query_start_loc[r + 1] - plan.prefill_query_start_loc[r];
    plan.prefill_max_query_len = std::max<int64_t>(plan.prefill_max_query_len, query_len);
    plan.prefill_context_lens[r] = seq_lens[nd + r] - query_len;
  }
  if (!dcp) {
    plan.context_chunks = detail::plan_context_chunks(plan.prefill_context_lens, config.block_size,
                                                      config.workspace_tokens, config.chunk_policy);
    return plan;
  }
  plan.dcp_context_chunks =
      plan_dcp_context_chunks(plan.prefill_context_lens, config.block_size, config.workspace_tokens,
                              config.chunk_policy, config.dcp);
  for (const DcpContextChunk& chunk : plan.dcp_context_chunks)
    plan.context_chunks.push_back(chunk.global);
  return plan;
}

}  // namespace mlakit
