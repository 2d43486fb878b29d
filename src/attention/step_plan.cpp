// plan_step, the shared Workspace and their sizing (mlakit/step.hpp): everything an engine does
// once per step, so that each layer's forward only launches kernels.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "attention/step_state.hpp"
#include "core/check.hpp"
#include "core/device_memory.hpp"
#include "mlakit/dcp.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"
#include "planner/context_chunks.hpp"

namespace mlakit {

using detail::require;

namespace {

constexpr const char* kPlanOp = "plan_step";

// Largest up-projection of one context chunk, [rows, N * (P + V)] in the activation dtype, that the
// default chunk size allows: at N = 128 in bf16 (64 KiB a row) 8192 rows, the size of a whole
// default step's new tokens, so the context phase needs no more scratch than the new tokens do.
constexpr int64_t kChunkUpProjectionBytes = int64_t{512} << 20;

int64_t round_down(int64_t x, int64_t multiple) { return x / multiple * multiple; }
int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// Positions of one turn of the DCP ranks (W I), and the alignment of DCP context pieces
// (lcm(block_size, W I), spec F-18).
int64_t dcp_turn(const MlaAttentionConfig& c) { return c.dcp.world_size * c.dcp.interleave; }
int64_t dcp_chunk_alignment(const MlaAttentionConfig& c) {
  return std::lcm(c.block_size, dcp_turn(c));
}

}  // namespace

void validate_config(const MlaAttentionConfig& c) {
  c.dims.validate();
  require(std::isfinite(c.scale) && c.scale > 0, ErrorCode::kInvalidArgument,
          "MlaAttention: scale must be finite and > 0, got ", c.scale);
  require(c.decode_threshold >= 1, ErrorCode::kInvalidArgument,
          "MlaAttention: decode_threshold must be >= 1, got ", c.decode_threshold);
  require(c.workspace_tokens >= 0, ErrorCode::kInvalidArgument,
          "MlaAttention: workspace_tokens must be >= 0 (0 = derive from max_model_len), got ",
          c.workspace_tokens);
  // make_plan's bound (int32 row offsets), checked here so that a layer and its Workspace refuse
  // the configuration instead of every forward step.
  require(c.workspace_tokens <= std::numeric_limits<int32_t>::max(), ErrorCode::kInvalidArgument,
          "MlaAttention: workspace_tokens must be at most 2147483647 (int32 row offsets), got ",
          c.workspace_tokens);
  require(c.query_len_support != QueryLenSupport::kSingleOnly || c.decode_threshold == 1,
          ErrorCode::kInvalidArgument,
          "MlaAttention: decode_threshold must be 1 when query_len_support is single_only, got ",
          c.decode_threshold);
  require(c.max_model_len > 0 && c.max_num_seqs > 0 && c.max_num_batched_tokens > 0,
          ErrorCode::kInvalidArgument,
          "MlaAttention: max_model_len, max_num_seqs and max_num_batched_tokens must be > 0, got ",
          c.max_model_len, ", ", c.max_num_seqs, " and ", c.max_num_batched_tokens);
  require(c.max_model_len <= std::numeric_limits<int32_t>::max() &&
              c.max_num_seqs <= std::numeric_limits<int32_t>::max() &&
              c.max_num_batched_tokens <= std::numeric_limits<int32_t>::max(),
          ErrorCode::kInvalidArgument,
          "MlaAttention: max_model_len, max_num_seqs and max_num_batched_tokens must fit in int32 "
          "(lengths and offsets are int32), got ",
          c.max_model_len, ", ", c.max_num_seqs, " and ", c.max_num_batched_tokens);
  KvCacheSpec spec{c.dims, c.kv_cache_dtype, c.act_dtype, c.block_size, 0};
  spec.validate();
  // A context chunk holds whole blocks: a smaller gather workspace could never hold one, and no
  // Workspace could be sized for it.
  require(c.workspace_tokens == 0 || c.workspace_tokens >= c.block_size,
          ErrorCode::kInvalidArgument,
          "MlaAttention: workspace_tokens must be 0 (derive from max_model_len) or >= block_size (",
          c.block_size, "): a context chunk holds whole blocks, got ", c.workspace_tokens);
  c.dcp.validate();
  if (!c.dcp.enabled()) return;
  require(c.dcp.interleave <= std::numeric_limits<int32_t>::max() / c.dcp.world_size,
          ErrorCode::kInvalidArgument,
          "MlaAttention: dcp.world_size * dcp.interleave must fit in int32 (positions are int32), "
          "got ",
          c.dcp.world_size, " * ", c.dcp.interleave);
  require(c.workspace_tokens == 0 || c.workspace_tokens >= dcp_chunk_alignment(c),
          ErrorCode::kInvalidArgument,
          "MlaAttention: under DCP workspace_tokens must be 0 or hold lcm(block_size, "
          "dcp.world_size * dcp.interleave) = ",
          dcp_chunk_alignment(c), " rows (context pieces are aligned to it), got ",
          c.workspace_tokens);
}

int64_t context_chunk_rows(const MlaAttentionConfig& c) {
  if (c.workspace_tokens > 0) return c.workspace_tokens;
  const int64_t b2 =
      chunked_prefill_workspace_tokens(c.max_model_len, c.max_num_seqs, c.block_size);
  const int64_t row_bytes = c.dims.num_heads * c.dims.kv_b_out_dim() * dtype_size(c.act_dtype);
  const int64_t budget_rows =
      std::max(c.block_size, round_down(kChunkUpProjectionBytes / row_bytes, c.block_size));
  const int64_t rows = std::min(b2, budget_rows);
  // Under DCP a chunk holds at least one aligned piece.
  return c.dcp.enabled() ? std::max(rows, dcp_chunk_alignment(c)) : rows;
}

namespace detail {

namespace {

// Index entries of one context chunk of np prefill requests: its offsets [np + 1] and starts [np];
// under DCP also this rank's starts [np] and every rank's offsets [W, np + 1] (this rank's among
// them).
int64_t chunk_metadata_ints(const MlaAttentionConfig& c, int64_t np) {
  const int64_t plain = 2 * np + 1;
  return c.dcp.enabled() ? plain + np + c.dcp.world_size * (np + 1) : plain;
}

// Index entries of T tokens' DCP slot derivation: i64 positions (two i32 words each) and the
// request of each token.
int64_t dcp_token_metadata_ints(int64_t tokens) { return 3 * tokens; }

// Index entries of the worst step: seq_lens [R], the prefill query offsets [np + 1], the context
// chunks (R, np <= max_num_seqs) and under DCP the tokens' positions and requests.
int64_t metadata_capacity(const MlaAttentionConfig& c) {
  const bool dcp = c.dcp.enabled();
  // A request's context reaches max_model_len when it has no new token (query_len 0 after a
  // prefill makes it a prefill with context seq_len). Under DCP contexts are planned padded to
  // whole turns, in pieces of the DCP alignment.
  const int64_t context = dcp ? round_up(c.max_model_len, dcp_turn(c)) : c.max_model_len;
  const int64_t chunks =
      max_context_chunks(c.max_num_seqs, context, dcp ? dcp_chunk_alignment(c) : c.block_size,
                         context_chunk_rows(c), c.chunk_policy);
  const int64_t tokens = dcp ? dcp_token_metadata_ints(c.max_num_batched_tokens) : 0;
  return tokens + c.max_num_seqs + (c.max_num_seqs + 1) +
         chunks * chunk_metadata_ints(c, c.max_num_seqs);
}

// Rows of the decode phase's temporaries (ql, o_lat, lse, the DCP buffers): the decode requests'
// tokens as the decode runs read them, a uniform run viewing them as [num_decodes, q_len] with its
// padding requests' tokens. A batch that is all decodes also owns every padded token after its last
// request (spec B.4 returns (R, 0, T, 0)), up to max_num_batched_tokens of them whatever R is;
// those attend to nothing, so forward writes their output rows as zeros and nothing is carved for
// them. Bound: every decode has q_len <= the planner's decode threshold t, so the rows are at most
// num_decodes * t <= max_num_seqs * t, and at most num_decode_tokens <= max_num_batched_tokens:
// the Td of worst_shape. They cover every run (decode_runs' first_padding_token: num_decode_tokens
// for a uniform run, where it is num_decodes * q_len, else query_start_loc[num_decodes]). From the
// query offsets only, not the (under DCP per-rank) lengths: every DCP rank exchanges as many rows.
int64_t decode_rows(const Plan& p) {
  return std::min(p.split.num_decode_tokens, p.split.num_decodes * p.max_decode_query_len);
}

// Under DCP the decode runs all W N query heads of the group over this rank's keys.
int64_t decode_heads(const MlaAttentionConfig& c) { return c.dcp.world_size * c.dims.num_heads; }

ops::DecodePlanShape decode_shape(const MlaAttentionConfig& c, int64_t batch, int64_t q_len,
                                  int64_t max_seq_len) {
  return ops::DecodePlanShape{
      c.device, batch, q_len, decode_heads(c), c.block_size, max_seq_len, c.batch_invariant};
}

StepShape worst_shape(const MlaAttentionConfig& c) {
  StepShape s;
  const int64_t threshold = effective_decode_threshold(c);
  s.metadata_ints = metadata_capacity(c);
  s.tokens = c.max_num_batched_tokens;
  s.prefill_tokens = c.max_num_batched_tokens;
  // Any prefill may have context, even at max_model_len 1 (a request with no new token after a
  // prefill is a prefill whose context is its whole seq_len).
  s.chunk_rows = context_chunk_rows(c);
  // Rows, not tokens: padded tokens after the decodes take none (decode_rows).
  s.decode_tokens = std::min(c.max_num_batched_tokens, c.max_num_seqs * threshold);
  // A decode run of q_len q holds at most decode_tokens / q requests.
  for (int64_t q = 1; q <= std::min(threshold, s.decode_tokens); ++q) {
    const int64_t batch = std::min(c.max_num_seqs, s.decode_tokens / q);
    s.split_elems = std::max(s.split_elems,
                             ops::mla_decode_max_workspace_elems(
                                 decode_shape(c, batch, q, c.max_model_len), c.dims.kv_lora_rank));
  }
  return s;
}

}  // namespace

int64_t effective_decode_threshold(const MlaAttentionConfig& c) {
  return c.dcp.enabled() ? 1 : c.decode_threshold;
}

StepBuffers carve(Arena& arena, const MlaAttentionConfig& c, const StepShape& s) {
  const MlaDims& d = c.dims;
  const int64_t n = d.num_heads, npv = n * d.kv_b_out_dim();
  const bool dcp = c.dcp.enabled();
  const int64_t w = c.dcp.world_size, wn = w * n, e = d.entry_dim(), l = d.kv_lora_rank;
  StepBuffers b;
  b.metadata = arena.take({s.metadata_ints}, DType::kI32);
  if (dcp) b.dcp_slots = arena.take({s.tokens}, DType::kI64);  // read by every layer's write
  const int64_t phases = arena.mark();
  const int64_t tp = s.prefill_tokens;
  if (tp > 0) {
    b.kv_up = arena.take({std::max(tp, s.chunk_rows), npv}, c.act_dtype);
    if (s.chunk_rows > 0) {
      b.ctx_out = arena.take({tp, n, d.v_head_dim}, DType::kF32);
      b.ctx_lse = arena.take({n, tp}, DType::kF32);
      b.part_out = arena.take({tp, n, d.v_head_dim}, DType::kF32);
      b.part_lse = arena.take({n, tp}, DType::kF32);
      b.gather = arena.take({s.chunk_rows, d.entry_dim()}, c.act_dtype);
      if (dcp) {
        const KvCacheSpec spec{d, c.kv_cache_dtype, c.act_dtype, c.block_size, 0};
        b.exchange = arena.take({s.chunk_rows, spec.entry_bytes()}, DType::kU8);
        b.row_index = arena.take({s.chunk_rows}, DType::kI32);
      } else {
        b.token_to_seq = arena.take({s.chunk_rows}, DType::kI32);
      }
    }
  }
  arena.rewind(phases);  // the decode phase runs after the prefill phase on the same stream
  const int64_t td = s.decode_tokens;
  if (td > 0) {
    const bool fp8_query = c.kv_cache_dtype == KvCacheDType::kFp8E4m3;
    b.ql = arena.take({td, n, e}, c.act_dtype);
    if (fp8_query && !dcp) b.ql_fp8 = arena.take({td, n, e}, DType::kFp8E4m3);
    // In the activation dtype, as the seed's: the V up-projection is then one GEMM of one dtype
    // (no operand conversion, no f32 staging).
    b.o_lat = arena.take({td, n, l}, c.act_dtype);
    if (dcp) {
      // The partials and their exchange stay f32, so o_lat is rounded once, as without DCP.
      b.gathered_q = arena.take({w, td, n, e}, c.act_dtype);
      b.q_all = arena.take({td, wn, e}, fp8_query ? DType::kFp8E4m3 : c.act_dtype);
      b.partial_out = arena.take({td, wn, l}, DType::kF32);
      b.partial_lse = arena.take({td, wn}, DType::kF32);
      b.gathered_lse = arena.take({w, td, wn}, DType::kF32);
      b.corrected = arena.take({w, td, n, l}, DType::kF32);
      b.combined = arena.take({td, n, l}, DType::kF32);
    } else {
      b.lse = arena.take({td, n}, DType::kF32);
    }
    b.split_ws = arena.take({s.split_elems}, DType::kF32);
  }
  return b;
}

}  // namespace detail

int64_t workspace_bytes(const MlaAttentionConfig& config) {
  validate_config(config);
  detail::Arena measure(config.device);
  detail::carve(measure, config, detail::worst_shape(config));
  return measure.peak();
}

// ---- Workspace
// -----------------------------------------------------------------------------------

Workspace::State::~State() {
  detail::pinned_host_free(staging);
  detail::event_destroy(config.device, upload_done);
}

Workspace::Workspace(const MlaAttentionConfig& config) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.config = config;
  const int64_t bytes = workspace_bytes(config);
  s.metadata_capacity = detail::metadata_capacity(config);
  s.buffer = Tensor::empty({bytes}, DType::kU8, config.device);
  if (!config.device.is_cpu()) {
    s.staging = detail::pinned_host_malloc(s.metadata_capacity * int64_t{sizeof(int32_t)});
    s.upload_done = detail::event_create(config.device);
  }
}

Workspace::~Workspace() = default;

int64_t Workspace::bytes() const { return state_->buffer.numel(); }
Device Workspace::device() const { return state_->config.device; }
void Workspace::touch(Stream stream) { ops::fill_zero(state_->buffer, stream); }

// ---- StepPlan
// ------------------------------------------------------------------------------------

StepPlan::StepPlan() : state_(std::make_unique<State>()) {}
StepPlan::~StepPlan() = default;
StepPlan::StepPlan(const StepPlan& other) : state_(std::make_unique<State>(*other.state_)) {}
StepPlan& StepPlan::operator=(const StepPlan& other) {
  if (this != &other) *state_ = *other.state_;
  return *this;
}
StepPlan::StepPlan(StepPlan&&) noexcept = default;
StepPlan& StepPlan::operator=(StepPlan&&) noexcept = default;

const Plan& StepPlan::plan() const { return state_->plan; }
int64_t StepPlan::num_actual_tokens() const { return state_->num_actual_tokens; }
int64_t StepPlan::workspace_bytes_used() const { return state_->bytes_used; }
bool StepPlan::same_launches(const StepPlan& other) const {
  return state_->workspace == other.state_->workspace &&
         state_->launch_signature == other.state_->launch_signature;
}

namespace detail {

// Fields two configurations must share for one workspace, or one StepPlan, to serve both.
bool same_step_config(const MlaAttentionConfig& a, const MlaAttentionConfig& b) {
  const MlaDims &x = a.dims, &y = b.dims;
  return x.num_heads == y.num_heads && x.kv_lora_rank == y.kv_lora_rank &&
         x.qk_rope_head_dim == y.qk_rope_head_dim && x.qk_nope_head_dim == y.qk_nope_head_dim &&
         x.v_head_dim == y.v_head_dim && a.act_dtype == b.act_dtype &&
         a.kv_cache_dtype == b.kv_cache_dtype && a.block_size == b.block_size &&
         a.decode_threshold == b.decode_threshold && a.query_len_support == b.query_len_support &&
         context_chunk_rows(a) == context_chunk_rows(b) && a.chunk_policy == b.chunk_policy &&
         a.batch_invariant == b.batch_invariant && a.device == b.device && a.dcp == b.dcp;
}

// The batch's tensors and lengths: what plan_step and MlaAttention::plan check alike.
void validate_batch_tensors(const char* op, const MlaAttentionConfig& c,
                            const ForwardBatch& batch) {
  const int64_t reqs = static_cast<int64_t>(batch.seq_lens.size());
  require(batch.num_actual_tokens >= 0, ErrorCode::kInvalidArgument, op,
          ": num_actual_tokens must be >= 0, got ", batch.num_actual_tokens);
  if (c.dcp.enabled()) {
    const TensorView& slots = batch.slot_mapping;
    const bool empty = slots.data == nullptr || (slots.ndim > 0 && slots.numel() == 0);
    require(empty, ErrorCode::kInvalidArgument, op, ": under DCP (dcp.world_size ",
            c.dcp.world_size,
            ") the cache slots are derived from the token positions and this rank's block table, "
            "so batch.slot_mapping must be empty (a default TensorView), got ",
            slots.ndim > 0 ? slots.numel() : 1, " entries");
  } else {
    check_storage(op, "batch.slot_mapping", batch.slot_mapping);
    check_ndim(op, "batch.slot_mapping", batch.slot_mapping, 1);
    check_dtype(op, "batch.slot_mapping", batch.slot_mapping, {DType::kI64});
    check_min_size(op, "batch.slot_mapping", batch.slot_mapping, 0, batch.num_actual_tokens);
    check_device(op, "batch.slot_mapping", batch.slot_mapping, c.device);
  }
  check_storage(op, "batch.block_table", batch.block_table);
  check_ndim(op, "batch.block_table", batch.block_table, 2);
  check_dtype(op, "batch.block_table", batch.block_table, {DType::kI32});
  check_min_size(op, "batch.block_table", batch.block_table, 0, reqs);
  check_device(op, "batch.block_table", batch.block_table, c.device);
}

PlannerConfig planner_config(const MlaAttentionConfig& c) {
  PlannerConfig pc;
  pc.block_size = c.block_size;
  pc.decode_threshold = c.decode_threshold;  // make_plan uses 1 under DCP
  pc.query_len_support = c.query_len_support;
  pc.workspace_tokens = context_chunk_rows(c);
  pc.chunk_policy = c.chunk_policy;
  pc.num_workers = 1;  // Plan::decode_schedule is informative; the step asks the backend
  pc.dcp = c.dcp;
  return pc;
}

Plan plan_batch(const MlaAttentionConfig& c, const ForwardBatch& batch) {
  BatchDesc desc{batch.query_start_loc, batch.seq_lens, batch.num_actual_tokens,
                 batch.block_table.ndim == 2 ? batch.block_table.shape[1] : 0};
  return make_plan(desc, planner_config(c));
}

namespace {

// The step must fit the limits the workspace was sized for.
void check_limits(const MlaAttentionConfig& c, const ForwardBatch& batch) {
  const int64_t reqs = static_cast<int64_t>(batch.seq_lens.size());
  require(reqs <= c.max_num_seqs, ErrorCode::kInvalidArgument, kPlanOp, ": the batch has ", reqs,
          " requests, more than max_num_seqs (", c.max_num_seqs, ") the workspace was sized for");
  require(batch.num_actual_tokens <= c.max_num_batched_tokens, ErrorCode::kInvalidArgument, kPlanOp,
          ": num_actual_tokens (", batch.num_actual_tokens, ") exceeds max_num_batched_tokens (",
          c.max_num_batched_tokens, ") the workspace was sized for");
  for (int64_t r = 0; r < reqs; ++r) {
    require(batch.seq_lens[r] <= c.max_model_len, ErrorCode::kInvalidArgument, kPlanOp,
            ": seq_lens[", r, "] (", batch.seq_lens[r], ") exceeds max_model_len (",
            c.max_model_len, ") the workspace was sized for");
  }
}

// Appends `values` to the host copy of the step's indices; returns the device view of them.
TensorView append(std::vector<int32_t>& host, const TensorView& metadata,
                  std::span<const int32_t> values) {
  const int64_t offset = static_cast<int64_t>(host.size());
  host.insert(host.end(), values.begin(), values.end());
  return metadata.narrow(0, offset, static_cast<int64_t>(values.size()));
}

// Appends i64 `values` as pairs of i32 words in memory order, at an even offset of the index
// region (which starts 256-byte aligned); returns their i64 device view.
TensorView append_i64(std::vector<int32_t>& host, const TensorView& metadata,
                      std::span<const int64_t> values) {
  require(host.size() % 2 == 0, ErrorCode::kInternal, kPlanOp,
          ": i64 indices must start at an even i32 offset, got ", host.size());
  const int64_t offset = static_cast<int64_t>(host.size());
  host.resize(host.size() + 2 * values.size());
  std::memcpy(host.data() + offset, values.data(), values.size_bytes());
  return TensorView::contiguous(static_cast<int32_t*>(metadata.data) + offset, DType::kI64,
                                {static_cast<int64_t>(values.size())}, metadata.device);
}

// Global position of every token of the step in its request, and the request; -1 for the
// tokens past the last request (padding), which no cache slot takes.
void token_positions(const ForwardBatch& batch, std::vector<int64_t>& positions,
                     std::vector<int32_t>& token_to_req) {
  const std::span<const int32_t> qsl = batch.query_start_loc;
  positions.assign(static_cast<size_t>(batch.num_actual_tokens), -1);
  token_to_req.assign(static_cast<size_t>(batch.num_actual_tokens), -1);
  for (size_t r = 0; r < batch.seq_lens.size(); ++r) {
    const int64_t first_position = int64_t{batch.seq_lens[r]} - (qsl[r + 1] - qsl[r]);
    for (int64_t t = qsl[r]; t < qsl[r + 1]; ++t) {
      positions[t] = first_position + t - qsl[r];
      token_to_req[t] = static_cast<int32_t>(r);
    }
  }
}

// Folds the ids of columns [first_column, end_column) of block_table row `request` (host memory,
// any strides) into `bounds`. O(columns) compares, no allocation.
void note_block_ids(const TensorView& block_table, int64_t request, int64_t first_column,
                    int64_t end_column, int64_t keys, bool decode, BlockIdBounds& bounds) {
  const int32_t* row = block_table.data_as<const int32_t>() + request * block_table.strides[0];
  for (int64_t column = first_column; column < end_column; ++column) {
    const int32_t id = row[column * block_table.strides[1]];
    if (!bounds.any || id < bounds.lowest.id) bounds.lowest = {id, request, column, keys, decode};
    if (!bounds.any || id > bounds.highest.id) bounds.highest = {id, request, column, keys, decode};
    bounds.any = true;
  }
}

// The extremes of the block ids a CPU step reads: the decode runs' requests over [0, their held
// length), and each context chunk's gather over its positions of each prefill request (under DCP
// this rank's local positions). The planner has checked every such column against the table's
// width. A GPU step leaves them empty: the table lives on the device.
BlockIdBounds block_id_bounds(const MlaAttentionConfig& c, const TensorView& block_table,
                              const Plan& plan, const DecodeRuns& runs,
                              std::span<const int32_t> held_lens) {
  BlockIdBounds bounds;
  if (!c.device.is_cpu()) return bounds;
  const int64_t bs = c.block_size;
  for (const DecodeRun& run : runs.runs) {
    for (int64_t r = run.first_request; r < run.first_request + run.num_requests; ++r) {
      const int64_t keys = held_lens[r];
      note_block_ids(block_table, r, 0, (keys + bs - 1) / bs, keys, /*decode=*/true, bounds);
    }
  }
  const int64_t nd = plan.split.num_decodes;
  const bool dcp = c.dcp.enabled();
  for (size_t k = 0; k < plan.context_chunks.size(); ++k) {
    const ContextChunk& chunk = dcp ? plan.dcp_context_chunks[k].local : plan.context_chunks[k];
    for (size_t i = 0; i < chunk.starts.size(); ++i) {
      const int64_t start = chunk.starts[i], end = start + chunk.seq_lens[i];
      if (end == start) continue;
      const int64_t context = plan.prefill_context_lens[i];
      const int64_t keys =
          dcp ? dcp_local_seq_len(context, c.dcp.world_size, c.dcp.rank, c.dcp.interleave)
              : context;
      note_block_ids(block_table, nd + static_cast<int64_t>(i), start / bs, (end + bs - 1) / bs,
                     keys, /*decode=*/false, bounds);
    }
  }
  return bounds;
}

void sign(std::vector<int64_t>& sig, const TensorView& t) {
  sig.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data)));
  sig.push_back(static_cast<int64_t>(t.dtype));
  sig.push_back(t.ndim);
  for (int d = 0; d < t.ndim; ++d) {
    sig.push_back(t.shape[d]);
    sig.push_back(t.strides[d]);
  }
}

std::vector<int64_t> launch_signature(const StepPlan::State& s) {
  const Plan& p = s.plan;
  std::vector<int64_t> sig = {s.num_actual_tokens,
                              s.prefill_tokens,
                              s.decode_rows,
                              p.num_reqs,
                              p.split.num_decodes,
                              p.split.num_prefills,
                              p.split.num_decode_tokens,
                              p.split.num_prefill_tokens,
                              p.prefill_max_query_len,
                              static_cast<int64_t>(p.context_chunks.size()),
                              s.runs.first_padding_token,
                              static_cast<int64_t>(s.runs.runs.size())};
  for (const ContextChunk& chunk : p.context_chunks)
    sig.insert(sig.end(), {chunk.total_tokens, chunk.max_seq_len});
  for (const DcpContextChunk& chunk : p.dcp_context_chunks) sig.push_back(chunk.rows_per_rank);
  for (const DecodeRun& run : s.runs.runs) {
    const DecodeSchedule& sc = run.schedule;
    const DeviceDecodeSchedule& dev = sc.device;
    sig.insert(sig.end(), {run.first_request, run.num_requests, run.first_token, run.query_len,
                           static_cast<int64_t>(sc.kind), sc.total_splits, sc.max_splits, dev.batch,
                           dev.s_q, dev.num_heads, dev.max_seq_len, dev.num_parts,
                           dev.batch_invariant, dev.planned_ahead});
    sig.insert(sig.end(), sc.split_offsets.begin(), sc.split_offsets.end());
    sig.insert(sig.end(), sc.split_len.begin(), sc.split_len.end());
  }
  const StepBuffers& b = s.buffers;
  for (const TensorView* t :
       {&s.block_table, &s.slot_mapping, &s.seq_lens,  &s.prefill_query_start_loc,
        &b.metadata,    &b.dcp_slots,    &b.kv_up,     &b.ctx_out,
        &b.part_out,    &b.gather,       &b.exchange,  &b.row_index,
        &b.ql,          &b.ql_fp8,       &b.o_lat,     &b.lse,
        &b.split_ws,    &b.gathered_q,   &b.q_all,     &b.partial_out,
        &b.partial_lse, &b.gathered_lse, &b.corrected, &b.combined}) {
    sign(sig, *t);
  }
  return sig;
}

// Copies the step's indices into the workspace's index region: one asynchronous copy from the
// pinned staging buffer on a GPU (after the previous step's copy has left it), a memcpy on the CPU.
void upload(Workspace::State& ws, const std::vector<int32_t>& host, const TensorView& metadata,
            Stream stream) {
  const int64_t bytes = static_cast<int64_t>(host.size() * sizeof(int32_t));
  if (bytes == 0) return;
  if (ws.config.device.is_cpu()) {
    std::memcpy(metadata.data, host.data(), static_cast<size_t>(bytes));
    return;
  }
  event_synchronize(ws.upload_done);
  std::memcpy(ws.staging, host.data(), static_cast<size_t>(bytes));
  device_copy(metadata.data, ws.config.device, ws.staging, Device::cpu(), bytes, stream);
  event_record(ws.config.device, ws.upload_done, stream);
}

}  // namespace
}  // namespace detail

StepPlan plan_step(const MlaAttentionConfig& config, const ForwardBatch& batch,
                   Workspace& workspace, Stream stream) {
  using namespace detail;
  Workspace::State& ws = workspace.state();
  const MlaAttentionConfig& c = ws.config;
  require(same_step_config(config, c), ErrorCode::kInvalidArgument, kPlanOp,
          ": the configuration differs from the one the workspace was sized for (dims, dtypes, "
          "cache format, block size, decode threshold, chunking, batch invariance and device must "
          "match)");
  check_limits(c, batch);
  validate_batch_tensors(kPlanOp, c, batch);

  StepPlan result;
  StepPlan::State& s = *result.state_;
  s.config = c;
  s.plan = plan_batch(c, batch);
  s.num_actual_tokens = batch.num_actual_tokens;
  s.prefill_tokens = s.plan.split.num_prefills ? s.plan.prefill_query_start_loc.back() : 0;
  s.block_table = batch.block_table;
  s.slot_mapping = batch.slot_mapping;
  const bool dcp = c.dcp.enabled();
  // The lengths this rank's decode reads: under DCP its local share of each request.
  const std::span<const int32_t> held_lens =
      dcp ? std::span<const int32_t>(s.plan.local_seq_lens) : batch.seq_lens;
  // min(table columns x block_size, max_model_len), without the product: a table may claim any
  // width (a zero-stride view, say), and columns past max_model_len's blocks change nothing.
  const int64_t table_cols = batch.block_table.shape[1];
  const int64_t max_seq_len = table_cols >= (c.max_model_len + c.block_size - 1) / c.block_size
                                  ? c.max_model_len
                                  : table_cols * c.block_size;
  s.runs = decode_runs(
      s.plan, batch.query_start_loc, held_lens, [&](std::span<const int32_t> lens, int64_t q_len) {
        return ops::plan_mla_decode(
            decode_shape(c, static_cast<int64_t>(lens.size()), q_len, max_seq_len), lens);
      });

  s.block_ids = block_id_bounds(c, batch.block_table, s.plan, s.runs, held_lens);

  StepShape shape;
  for (const ContextChunk& chunk : s.plan.context_chunks) {
    shape.chunk_rows = std::max(shape.chunk_rows, chunk.total_tokens);
    shape.metadata_ints += chunk_metadata_ints(c, static_cast<int64_t>(chunk.starts.size()));
  }
  for (const DcpContextChunk& chunk : s.plan.dcp_context_chunks)
    shape.chunk_rows = std::max(shape.chunk_rows, c.dcp.world_size * chunk.rows_per_rank);
  shape.tokens = batch.num_actual_tokens;
  if (dcp) shape.metadata_ints += dcp_token_metadata_ints(shape.tokens);
  shape.metadata_ints +=
      static_cast<int64_t>(batch.seq_lens.size() + s.plan.prefill_query_start_loc.size());
  shape.prefill_tokens = s.prefill_tokens;
  s.decode_rows = decode_rows(s.plan);
  require(s.runs.first_padding_token <= s.decode_rows, ErrorCode::kInternal, kPlanOp,
          ": the decode runs read ", s.runs.first_padding_token, " rows, the decode phase has ",
          s.decode_rows);
  shape.decode_tokens = s.decode_rows;
  for (const DecodeRun& run : s.runs.runs) {
    shape.split_elems = std::max(
        shape.split_elems, ops::mla_decode_workspace_elems(run.schedule, run.query_len,
                                                           decode_heads(c), c.dims.kv_lora_rank));
  }
  require(shape.metadata_ints <= ws.metadata_capacity, ErrorCode::kInternal, kPlanOp,
          ": the step needs ", shape.metadata_ints, " index entries, the workspace holds ",
          ws.metadata_capacity);
  Arena arena(ws.buffer.view().data, ws.buffer.numel(), c.device);
  s.buffers = carve(arena, c, shape);
  s.bytes_used = arena.peak();

  std::vector<int32_t> host;
  host.reserve(static_cast<size_t>(shape.metadata_ints));
  const TensorView& metadata = s.buffers.metadata;
  TensorView positions, token_to_req;
  if (dcp) {
    std::vector<int64_t> position_values;
    std::vector<int32_t> request_values;
    token_positions(batch, position_values, request_values);
    positions = append_i64(host, metadata, position_values);  // first: an even offset
    token_to_req = append(host, metadata, request_values);
  }
  s.seq_lens = append(host, metadata, held_lens);
  s.prefill_query_start_loc = append(host, metadata, s.plan.prefill_query_start_loc);
  for (const ContextChunk& chunk : s.plan.context_chunks) {
    s.chunk_cu_seq_lens.push_back(append(host, metadata, chunk.cu_seq_lens));
    s.chunk_starts.push_back(append(host, metadata, chunk.starts));
  }
  for (const DcpContextChunk& chunk : s.plan.dcp_context_chunks) {
    const auto np1 = static_cast<int64_t>(chunk.local.cu_seq_lens.size());
    const TensorView rank_cu = append(host, metadata, chunk.rank_cu_seq_lens);
    s.chunk_rank_cu_seq_lens.push_back(rank_cu.reshape({c.dcp.world_size, np1}));
    s.chunk_local_cu_seq_lens.push_back(rank_cu.narrow(0, c.dcp.rank * np1, np1));
    s.chunk_local_starts.push_back(append(host, metadata, chunk.local.starts));
  }
  require(static_cast<int64_t>(host.size()) == shape.metadata_ints, ErrorCode::kInternal, kPlanOp,
          ": uploaded ", host.size(), " index entries, counted ", shape.metadata_ints);
  // From here on the workspace is written, and a later check may still refuse the step (the DCP
  // slots check the block table's ids): earlier plans lose their indices now, so they are stale
  // now, whether or not this call returns a plan.
  s.generation = ++ws.generation;
  upload(ws, host, metadata, stream);
  ops::prepare_stream(c.device, stream);  // the layers' forward may then be captured
  if (dcp) {
    // This rank's slot of every token (-1: another rank's, or padding), once for every layer.
    s.slot_mapping = s.buffers.dcp_slots.narrow(0, 0, shape.tokens);
    ops::dcp_slot_mapping(positions, token_to_req, batch.block_table, c.block_size, c.dcp,
                          s.slot_mapping, stream);
  }
  // A decode-only step of one run plans its decode once here, for every layer: its split
  // workspace is not shared with prefill temporaries, and one run uses it alone.
  if (s.prefill_tokens == 0 && s.runs.runs.size() == 1) {
    DecodeRun& run = s.runs.runs.front();
    run.schedule = ops::mla_decode_plan_ahead(
        run.schedule, s.block_table.narrow(0, run.first_request, run.num_requests),
        s.seq_lens.narrow(0, run.first_request, run.num_requests), c.block_size,
        c.dims.kv_lora_rank, s.buffers.split_ws, stream);
  }

  s.workspace = &ws;
  s.launch_signature = launch_signature(s);
  return result;
}

}  // namespace mlakit
