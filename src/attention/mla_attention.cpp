// MlaAttention: construction and the forward orchestrator (one code path for every backend;
// backends differ only in the ops they dispatch to). The step's planning, index upload and
// workspace layout are plan_step's (step_plan.cpp); forward only launches.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/inputs.hpp"
#include "attention/step_state.hpp"
#include "core/check.hpp"
#include "dist/dcp_context.hpp"
#include "dist/dcp_decode.hpp"
#include "mlakit/attention.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"
#include "ops/cache_write_with_q_rope.hpp"

namespace mlakit {

using detail::require;

namespace {

constexpr const char* kOp = "MlaAttention::forward";

// [rows, cols] view of rows [first, first + rows) of a 2-D tensor, split as [rows, heads, width].
TensorView rows_as_heads(const TensorView& t2d, int64_t first, int64_t rows, int64_t heads,
                         int64_t width) {
  TensorView t = t2d.narrow(0, first, rows);
  return TensorView::strided(t.data, t.dtype, {rows, heads, width}, {t.strides[0], width, 1},
                             t.device);
}

void validate_output(const MlaAttentionConfig& c, const TensorView& output) {
  detail::check_storage(kOp, "output", output);
  detail::check_ndim(kOp, "output", output, 2);
  detail::check_dtype(kOp, "output", output, {c.act_dtype});
  detail::check_size(kOp, "output", output, 1, c.dims.num_heads * c.dims.v_head_dim);
  detail::check_inner_contiguous(kOp, "output", output);
  detail::check_device(kOp, "output", output, c.device);
}

void validate_inputs(const MlaAttentionConfig& c, const TensorView& q, const TensorView& kv_c,
                     const TensorView& k_pe, const TensorView& kv_cache, int64_t tokens,
                     const TensorView& output) {
  const MlaDims& d = c.dims;
  for (auto [name, t] :
       {std::pair{"q", &q}, {"kv_c_normed", &kv_c}, {"k_pe", &k_pe}, {"kv_cache", &kv_cache}}) {
    detail::check_storage(kOp, name, *t);
  }
  validate_output(c, output);
  detail::check_ndim(kOp, "q", q, 3);
  detail::check_dtype(kOp, "q", q, {c.act_dtype});
  detail::check_size(kOp, "q", q, 1, d.num_heads);
  detail::check_size(kOp, "q", q, 2, d.qk_head_dim());
  detail::check_inner_contiguous(kOp, "q", q);
  detail::check_ndim(kOp, "kv_c_normed", kv_c, 2);
  detail::check_dtype(kOp, "kv_c_normed", kv_c, {c.act_dtype});
  detail::check_size(kOp, "kv_c_normed", kv_c, 1, d.kv_lora_rank);
  detail::check_ndim(kOp, "k_pe", k_pe, 2);
  detail::check_dtype(kOp, "k_pe", k_pe, {c.act_dtype});
  detail::check_size(kOp, "k_pe", k_pe, 1, d.qk_rope_head_dim);
  for (auto [name, t] : {std::pair{"q", &q}, {"kv_c_normed", &kv_c}, {"k_pe", &k_pe}}) {
    detail::check_device(kOp, name, *t, c.device);
  }
  for (auto [name, t] :
       {std::pair{"q", &q}, {"kv_c_normed", &kv_c}, {"k_pe", &k_pe}, {"output", &output}}) {
    require(t->shape[0] >= tokens, ErrorCode::kInvalidArgument, kOp, ": ", name,
            ".shape[0] must be >= num_actual_tokens (", tokens, "), got ", t->shape[0]);
  }
  if (kv_cache.numel() > 0) {
    check_kv_cache(kOp, kv_cache, c.kv_cache_dtype, d);
    detail::check_size(kOp, "kv_cache", kv_cache, 1, c.block_size);
    if (c.kv_cache_dtype == KvCacheDType::kAuto)
      detail::check_dtype(kOp, "kv_cache (kv_cache_dtype auto)", kv_cache, {c.act_dtype});
    detail::check_device(kOp, "kv_cache", kv_cache, c.device);
  }
  // The cache write and the attention read q, kv_c_normed and k_pe (and the cache) while output
  // and the cache are written, in an order of their own.
  detail::check_outputs_apart(kOp, {{"output", &output}, {"kv_cache", &kv_cache}},
                              {{"q", &q}, {"kv_c_normed", &kv_c}, {"k_pe", &k_pe}});
}

// The limits of a private workspace that serves exactly `batch` (the single-call form of forward),
// with the layer's chunk size kept.
MlaAttentionConfig limits_for(const MlaAttentionConfig& c, const ForwardBatch& batch) {
  MlaAttentionConfig l = c;
  l.workspace_tokens = context_chunk_rows(c);
  l.max_num_seqs = std::max<int64_t>(1, static_cast<int64_t>(batch.seq_lens.size()));
  l.max_num_batched_tokens = std::max<int64_t>(1, batch.num_actual_tokens);
  l.max_model_len = 1;
  for (int32_t len : batch.seq_lens) l.max_model_len = std::max<int64_t>(l.max_model_len, len);
  return l;
}

// The decode runs of the step: q [Td, H, L + R] over the cache into out [Td, H, L] and lse
// [Td, H] (H = N, or W N under DCP). Rows of padding tokens after the runs get out 0; with
// zero_padding_lse also lse 0 (a DCP combine then reads them as equal-weight zeros, i.e. 0).
void decode_local(const StepPlan::State& s, const TensorView& q, const TensorView& kv_cache,
                  const TensorView& out, const TensorView& lse, const ops::DecodeParams& params,
                  bool zero_padding_lse, Stream stream) {
  const int64_t td = q.shape[0], heads = q.shape[1], e = q.shape[2], l = out.shape[2];
  const int64_t first_padding = s.runs.first_padding_token;
  if (first_padding < td) {
    ops::fill_zero(out.narrow(0, first_padding, td - first_padding), stream);
    if (zero_padding_lse) ops::fill_zero(lse.narrow(0, first_padding, td - first_padding), stream);
  }
  for (const detail::DecodeRun& run : s.runs.runs) {
    const int64_t reqs = run.num_requests, sq = run.query_len, rows = reqs * sq;
    ops::mla_decode(q.narrow(0, run.first_token, rows).reshape({reqs, sq, heads, e}), kv_cache,
                    s.block_table.narrow(0, run.first_request, reqs),
                    s.seq_lens.narrow(0, run.first_request, reqs),
                    out.narrow(0, run.first_token, rows).reshape({reqs, sq, heads, l}),
                    lse.narrow(0, run.first_token, rows).reshape({reqs, sq, heads}), params,
                    run.schedule, s.buffers.split_ws, stream);
  }
}

// One context chunk of a DCP step (docs/dcp.md, "Prefill context"): this rank's entries of the
// chunk, all-gathered, into `gather` [rows, L + R] in global token order.
void gather_dcp_chunk(dist::Communicator& comm, const StepPlan::State& s, size_t i,
                      const TensorView& kv_cache, const TensorView& block_table_p,
                      const TensorView& gather, float k_scale, Stream stream) {
  const MlaAttentionConfig& c = s.config;
  const DcpContextChunk& chunk = s.plan.dcp_context_chunks[i];
  const int64_t rows = gather.shape[0], exchanged = c.dcp.world_size * chunk.rows_per_rank;
  const TensorView row_index = s.buffers.row_index.narrow(0, 0, rows);
  ops::dcp_gathered_rows(s.chunk_cu_seq_lens[i], s.chunk_starts[i], s.chunk_rank_cu_seq_lens[i],
                         chunk.rows_per_rank, c.dcp.interleave, row_index, rows, stream);
  // The exchange region holds whole cache entries in the cache's own storage dtype.
  const TensorView exchange = TensorView::contiguous(s.buffers.exchange.data, kv_cache.dtype,
                                                     {exchanged, kv_cache.shape[2]}, c.device);
  dist::dcp_gather_context_chunk(
      comm, kv_cache, block_table_p,
      {s.chunk_local_cu_seq_lens[i], s.chunk_local_starts[i], row_index, chunk.rows_per_rank},
      exchange, gather, c.kv_cache_dtype, k_scale, stream);
}

// Refuses a CPU step that reads a block id outside the cache, before anything is written (the
// decode and the gathers check their ids too, but only after the cache write and the prefill rows
// of the step). plan_step found the lowest and highest id the step reads; a GPU step has none (its
// kernels check the ids on the device, check_device_errors).
// kv_cache: [num_blocks, block_size, entry_width], not empty when the step reads a block (a decode
// request or a context chunk: forward checks that first).
void check_block_ids(const MlaAttentionConfig& c, const detail::BlockIdBounds& ids,
                     const TensorView& kv_cache) {
  if (!ids.any) return;
  const int64_t num_blocks = kv_cache.shape[0];
  const detail::BlockIdRead& bad = ids.lowest.id < 0 ? ids.lowest : ids.highest;
  const int64_t bs = c.block_size, first = bad.column * bs;
  const char* local = c.dcp.enabled() ? "local " : "";
  require(bad.id >= 0 && bad.id < num_blocks, ErrorCode::kOutOfRange, kOp, ": batch.block_table[",
          bad.request, ", ", bad.column, "] = ", bad.id, " is not a block id of kv_cache in [0, ",
          num_blocks, "): ", bad.decode ? "decode" : "prefill", " request ", bad.request,
          " reads it for ", local, bad.decode ? "" : "context ", "positions ", first, " to ",
          std::min(first + bs, bad.keys) - 1, " of its ", bad.keys, " ", local,
          bad.decode ? "" : "context ", "keys (columns 0 to ", (bad.keys - 1) / bs,
          "); the step was refused before anything was written");
}

bool fits(const MlaAttentionConfig& have, const MlaAttentionConfig& need) {
  return have.max_num_seqs >= need.max_num_seqs &&
         have.max_num_batched_tokens >= need.max_num_batched_tokens &&
         have.max_model_len >= need.max_model_len;
}

}  // namespace

struct MlaAttention::State {
  MlaAttentionConfig config;
  AbsorbedWeights weights;
  std::unique_ptr<Workspace> own_workspace;    // the single-call form's; grows with the batches
  dist::Communicator* communicator = nullptr;  // the DCP group's (DCP only)
};

namespace {

// The DCP group's communicator must be the one the configuration describes.
void check_communicator(const MlaAttentionConfig& c, const dist::Communicator* comm) {
  constexpr const char* kCtor = "MlaAttention";
  if (!c.dcp.enabled()) return;
  require(comm != nullptr, ErrorCode::kInvalidArgument, kCtor, ": dcp.world_size is ",
          c.dcp.world_size, " but no communicator was given (DCP needs the group's)");
  require(comm->world_size() == c.dcp.world_size && comm->rank() == c.dcp.rank,
          ErrorCode::kInvalidArgument, kCtor, ": the communicator is rank ", comm->rank(), " of ",
          comm->world_size(), ", but the configuration says dcp.rank ", c.dcp.rank,
          " of dcp.world_size ", c.dcp.world_size);
  require(comm->device() == c.device, ErrorCode::kInvalidArgument, kCtor,
          ": the communicator's tensors live on ", device_name(comm->device()), ", the layer's on ",
          device_name(c.device));
}

}  // namespace

MlaAttention::MlaAttention(const MlaAttentionConfig& config, const TensorView& kv_b_proj_weight,
                           const std::optional<TensorView>& kv_b_proj_scale_inv,
                           dist::Communicator* communicator)
    : state_(std::make_unique<State>()) {
  validate_config(config);
  check_communicator(config, communicator);
  state_->config = config;
  if (config.dcp.enabled()) state_->communicator = communicator;
  state_->weights = absorb_kv_b_proj(kv_b_proj_weight, kv_b_proj_scale_inv, config.dims,
                                     config.act_dtype, config.device);
}

MlaAttention::~MlaAttention() = default;

const MlaAttentionConfig& MlaAttention::config() const { return state_->config; }
const AbsorbedWeights& MlaAttention::weights() const { return state_->weights; }
int64_t MlaAttention::workspace_tokens() const { return context_chunk_rows(state_->config); }

Plan MlaAttention::plan(const ForwardBatch& batch) const {
  detail::validate_batch_tensors("MlaAttention::plan", state_->config, batch);
  return detail::plan_batch(state_->config, batch);
}

void MlaAttention::forward(const TensorView& q, const TensorView& kv_c_normed,
                           const TensorView& k_pe, const TensorView& kv_cache,
                           const ForwardBatch* batch, const TensorView& output,
                           const ForwardScales& scales, Stream stream) {
  const MlaAttentionConfig& c = state_->config;
  if (batch == nullptr) {  // profile run (spec A.12): zeros keep DP + EP ranks consistent
    validate_output(c, output);
    // A step checks it with the inputs (validate_inputs' check_outputs_apart).
    detail::check_no_self_overlap(kOp, "output", output);
    ops::fill_zero(output, stream);
    return;
  }
  // Checked here under this call's name (plan_step checks the same under its own), before any
  // workspace is sized from the batch.
  detail::validate_batch_tensors(kOp, c, *batch);
  const MlaAttentionConfig limits = limits_for(c, *batch);
  if (!state_->own_workspace || !fits(state_->own_workspace->state().config, limits)) {
    state_->own_workspace.reset();  // free the old buffer before taking the larger one
    state_->own_workspace = std::make_unique<Workspace>(limits);
  }
  const StepPlan plan = plan_step(limits, *batch, *state_->own_workspace, stream);
  forward(q, kv_c_normed, k_pe, kv_cache, plan, output, scales, stream);
}

void MlaAttention::forward(const TensorView& q, const TensorView& kv_c_normed,
                           const TensorView& k_pe_in, const TensorView& kv_cache,
                           const StepPlan& step, const TensorView& output,
                           const ForwardScales& given_scales, Stream stream) {
  const MlaAttentionConfig& c = state_->config;
  const MlaDims& d = c.dims;
  const StepPlan::State& s = step.state();
  require(s.workspace != nullptr, ErrorCode::kInvalidArgument, kOp,
          ": the StepPlan is empty (make it with plan_step)");
  require(s.generation == s.workspace->generation, ErrorCode::kInvalidArgument, kOp,
          ": the StepPlan is stale: a later plan_step on its workspace overwrote its indices");
  require(detail::same_step_config(c, s.config), ErrorCode::kInvalidArgument, kOp,
          ": the StepPlan was made for another configuration (dims, dtypes, cache format, block "
          "size, decode threshold, chunking, batch invariance, device and DCP settings must match "
          "the layer's)");
  const TensorView k_pe = detail::squeeze_k_pe(kOp, k_pe_in);
  const int64_t tokens = s.num_actual_tokens;
  validate_inputs(c, q, kv_c_normed, k_pe, kv_cache, tokens, output);
  if (is_fp8(c.kv_cache_dtype)) {
    require(std::isfinite(given_scales.k_scale) && given_scales.k_scale > 0 &&
                std::isfinite(given_scales.q_scale) && given_scales.q_scale > 0,
            ErrorCode::kInvalidArgument, kOp, ": q_scale and k_scale must be finite and > 0, got ",
            given_scales.q_scale, " and ", given_scales.k_scale);
  }
  // The scales are used only with fp8 caches (step.hpp): other caches ignore whatever was given.
  const ForwardScales scales = is_fp8(c.kv_cache_dtype) ? given_scales : ForwardScales{};
  const Plan& plan = s.plan;
  const detail::StepBuffers& buf = s.buffers;
  const bool dcp = c.dcp.enabled();
  const bool needs_cache = plan.split.num_decodes > 0 || plan.has_context();
  require(kv_cache.numel() > 0 || !needs_cache, ErrorCode::kInvalidArgument, kOp,
          ": kv_cache is empty but the batch has ", plan.split.num_decodes, " decode requests and ",
          plan.context_chunks.size(), " context chunks to read");
  check_block_ids(c, s.block_ids, kv_cache);

  const AbsorbedWeights& w = state_->weights;
  const int64_t n = d.num_heads, p = d.qk_nope_head_dim, l = d.kv_lora_rank, r = d.qk_rope_head_dim,
                v = d.v_head_dim, pv = d.kv_b_out_dim(), npv = n * pv;
  const int64_t td = plan.split.num_decode_tokens, tp = s.prefill_tokens;
  // The decode phase runs tokens [0, decode_rows); the padded tokens after them (in a batch of
  // decodes alone), [decode_rows, td), attend to nothing and get zero rows.
  const int64_t decode_rows = s.decode_rows;
  // The decode queries' rope part q[:, :, P:] goes into ql[:, :, L:] with the cache write (one
  // launch less) when nothing runs between the two: in steps without prefill tokens. With them,
  // the prefill phase reuses ql's workspace bytes first, so the copy waits for the decode phase.
  const bool q_rope_with_cache_write = decode_rows > 0 && tp == 0;

  // 1. Every actual token goes into the cache before any attention (spec A.3). (A decode token
  //    implies a non-empty cache: checked above.)
  if (kv_cache.numel() > 0 && tokens > 0) {
    const TensorView kv_c_t = kv_c_normed.narrow(0, 0, tokens), k_pe_t = k_pe.narrow(0, 0, tokens);
    const TensorView slots = s.slot_mapping.narrow(0, 0, tokens);
    if (q_rope_with_cache_write) {
      ops::concat_and_cache_mla_with_q_rope(
          kv_c_t, k_pe_t, kv_cache, slots, c.kv_cache_dtype, scales.k_scale,
          q.narrow(0, 0, decode_rows).narrow(2, p, r),
          buf.ql.narrow(0, 0, decode_rows).narrow(2, l, r), stream);
    } else {
      ops::concat_and_cache_mla(kv_c_t, k_pe_t, kv_cache, slots, c.kv_cache_dtype, scales.k_scale,
                                stream);
    }
  }

  // kv_b_proj as the right operand of x @ W^T: [1, L, N * (P + V)], a transposed matrix.
  const TensorView w_kv_b_t = TensorView::strided(w.kv_b_proj.view().data, c.act_dtype, {1, l, npv},
                                                  {npv * l, 1, l}, c.device);
  // x [rows, L] (any row stride) up-projected into kv_up rows [0, rows), seen as [rows, N, P + V].
  auto up_project = [&](const TensorView& x) {
    const int64_t rows = x.shape[0];
    ops::batched_matmul(TensorView::strided(x.data, x.dtype, {1, rows, l},
                                            {rows * x.strides[0], x.strides[0], 1}, c.device),
                        w_kv_b_t,
                        TensorView::strided(buf.kv_up.data, buf.kv_up.dtype, {1, rows, npv},
                                            {rows * npv, npv, 1}, c.device),
                        stream);
    return rows_as_heads(buf.kv_up, 0, rows, n, pv);
  };

  // 2. Prefill path (spec A.5): tokens [td, td + tp). With context, the chunks run first (their
  //    up-projections and the new tokens' share kv_up), then the new tokens, then one merge.
  if (tp > 0) {
    const TensorView q_p = q.narrow(0, td, tp);
    const TensorView out_p = rows_as_heads(output, td, tp, n, v);
    const TensorView cu_q = s.prefill_query_start_loc;
    const TensorView block_table_p =
        s.block_table.narrow(0, plan.split.num_decodes, plan.split.num_prefills);
    for (size_t i = 0; i < plan.context_chunks.size(); ++i) {
      const ContextChunk& chunk = plan.context_chunks[i];
      const int64_t rows = chunk.total_tokens;
      const TensorView chunk_cu = s.chunk_cu_seq_lens[i];
      const TensorView gather = buf.gather.narrow(0, 0, rows);
      if (dcp) {
        gather_dcp_chunk(*state_->communicator, s, i, kv_cache, block_table_p, gather,
                         scales.k_scale, stream);
      } else {
        ops::fill_token_to_seq(chunk_cu, buf.token_to_seq, rows, stream);
        ops::gather_and_maybe_dequant_cache(kv_cache, gather, block_table_p, chunk_cu,
                                            buf.token_to_seq, rows, c.kv_cache_dtype,
                                            scales.k_scale, s.chunk_starts[i], stream);
      }
      const TensorView kv_up = up_project(gather.narrow(1, 0, l));
      const bool first = i == 0;
      ops::mla_prefill(q_p, kv_up.narrow(2, 0, p), gather.narrow(1, l, r), kv_up.narrow(2, p, v),
                       cu_q, chunk_cu, plan.prefill_max_query_len, chunk.max_seq_len, c.scale,
                       /*causal=*/false, first ? buf.ctx_out : buf.part_out,
                       first ? buf.ctx_lse : buf.part_lse, stream);
      if (!first) {
        ops::merge_attn_states(buf.ctx_out, buf.ctx_lse, buf.ctx_out, buf.ctx_lse, buf.part_out,
                               buf.part_lse, stream);
      }
    }
    const TensorView kv_up = up_project(kv_c_normed.narrow(0, td, tp));
    const TensorView k_nope_new = kv_up.narrow(2, 0, p), v_new = kv_up.narrow(2, p, v);
    if (!plan.has_context()) {
      ops::mla_prefill(q_p, k_nope_new, k_pe.narrow(0, td, tp), v_new, cu_q, cu_q,
                       plan.prefill_max_query_len, plan.prefill_max_query_len, c.scale,
                       /*causal=*/true, out_p, std::nullopt, stream);
    } else {
      ops::mla_prefill(q_p, k_nope_new, k_pe.narrow(0, td, tp), v_new, cu_q, cu_q,
                       plan.prefill_max_query_len, plan.prefill_max_query_len, c.scale,
                       /*causal=*/true, buf.part_out, buf.part_lse, stream);
      ops::merge_attn_states(out_p, std::nullopt, buf.ctx_out, buf.ctx_lse, buf.part_out,
                             buf.part_lse, stream);
    }
  }
  // Tokens past the last request (CUDA-graph padding after prefills, or after the decodes of a
  // batch of decodes alone) attend to nothing: zeros.
  if (td + tp < tokens) ops::fill_zero(output.narrow(0, td + tp, tokens - td - tp), stream);
  if (decode_rows < td) ops::fill_zero(output.narrow(0, decode_rows, td - decode_rows), stream);

  // 3. Decode path (spec A.6): absorb W_UK, latent MQA over the cache, V up-projection.
  if (decode_rows > 0) {
    const TensorView q_d = q.narrow(0, 0, decode_rows);
    const TensorView ql = buf.ql.narrow(0, 0, decode_rows);
    const TensorView o_lat = buf.o_lat.narrow(0, 0, decode_rows);
    // ql[t, n, 0:L] = q_nope[t, n, :] @ W_UK_T[n]   (as a per-head batch: [N, Td, P] @ [N, P, L])
    ops::batched_matmul(q_d.narrow(2, 0, p).transpose(0, 1), w.w_uk_t,
                        ql.narrow(2, 0, l).transpose(0, 1), stream);
    if (!q_rope_with_cache_write) ops::copy(q_d.narrow(2, p, r), ql.narrow(2, l, r), stream);
    const bool fp8_query = c.kv_cache_dtype == KvCacheDType::kFp8E4m3;
    const ops::DecodeParams params{.scale = c.scale,
                                   .kv_dtype = c.kv_cache_dtype,
                                   .q_scale = scales.q_scale,
                                   .k_scale = scales.k_scale,
                                   .kv_lora_rank = l};
    if (!dcp) {
      TensorView q_kernel = ql;
      if (fp8_query) {
        q_kernel = buf.ql_fp8.narrow(0, 0, decode_rows);
        ops::scaled_fp8_quant(ql, q_kernel, scales.q_scale, stream);
      }
      decode_local(s, q_kernel, kv_cache, o_lat, buf.lse, params, /*zero_padding_lse=*/false,
                   stream);
    } else {
      // DCP (docs/dcp.md, "Decode"): the queries of all W N heads of the group, each rank's
      // attention over its own keys, and the LSE-corrected sum back to this rank's N heads.
      dist::Communicator& comm = *state_->communicator;
      dist::dcp_gather_queries(comm, ql, buf.gathered_q, buf.q_all,
                               fp8_query ? std::optional<float>(scales.q_scale) : std::nullopt,
                               stream);
      decode_local(s, buf.q_all, kv_cache, buf.partial_out, buf.partial_lse, params,
                   /*zero_padding_lse=*/true, stream);
      dist::dcp_combine_heads(comm, buf.partial_out, buf.partial_lse, buf.gathered_lse,
                              buf.corrected, buf.combined, stream);
      ops::copy(buf.combined, o_lat, stream);
    }
    // out[t, n * V + :] = o_lat[t, n, :] @ W_UV[n]   ([N, Td, L] @ [N, L, V])
    ops::batched_matmul(o_lat.transpose(0, 1), w.w_uv,
                        rows_as_heads(output, 0, decode_rows, n, v).transpose(0, 1), stream);
  }
}

}  // namespace mlakit
