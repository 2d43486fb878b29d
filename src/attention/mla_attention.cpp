// MlaAttention: construction, planning and the forward orchestrator (one code path for every
// backend; backends differ only in the ops they dispatch to).
#include <cmath>
#include <vector>

#include "attention/arena.hpp"
#include "attention/decode_runs.hpp"
#include "core/check.hpp"
#include "mlakit/attention.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {

using detail::require;

namespace {

constexpr const char* kOp = "MlaAttention::forward";

void validate_config(const MlaAttentionConfig& c) {
  c.dims.validate();
  require(std::isfinite(c.scale) && c.scale > 0, ErrorCode::kInvalidArgument,
          "MlaAttention: scale must be finite and > 0, got ", c.scale);
  require(c.decode_threshold >= 1, ErrorCode::kInvalidArgument,
          "MlaAttention: decode_threshold must be >= 1, got ", c.decode_threshold);
  require(c.workspace_tokens >= 0, ErrorCode::kInvalidArgument,
          "MlaAttention: workspace_tokens must be >= 0 (0 = derive from max_model_len), got ",
          c.workspace_tokens);
  require(c.max_model_len > 0 && c.max_num_seqs > 0, ErrorCode::kInvalidArgument,
          "MlaAttention: max_model_len and max_num_seqs must be > 0, got ", c.max_model_len,
          " and ", c.max_num_seqs);
  KvCacheSpec spec{c.dims, c.kv_cache_dtype, c.act_dtype, c.block_size, 0};
  spec.validate();
}

// Every host index array the kernels of one step read, concatenated: the CPU backend reads this
// host copy directly; a GPU layer uploads it once per step into its workspace.
struct StepIndices {
  struct Range {
    int64_t offset = 0, size = 0;
  };
  std::vector<int32_t> host;
  Range prefill_query_start_loc, seq_lens;
  std::vector<Range> chunk_cu_seq_lens, chunk_token_to_seq, chunk_starts;
  TensorView base;  // i32 [host.size()]: the host copy or its device copy

  Range append(std::span<const int32_t> values) {
    const Range r{static_cast<int64_t>(host.size()), static_cast<int64_t>(values.size())};
    host.insert(host.end(), values.begin(), values.end());
    return r;
  }
  TensorView view(Range r) const { return base.narrow(0, r.offset, r.size); }
  TensorView host_view() const {
    return TensorView::contiguous(const_cast<int32_t*>(host.data()), DType::kI32,
                                  {static_cast<int64_t>(host.size())});
  }
};

StepIndices collect_indices(const Plan& plan, std::span<const int32_t> seq_lens) {
  StepIndices idx;
  idx.prefill_query_start_loc = idx.append(plan.prefill_query_start_loc);
  idx.seq_lens = idx.append(seq_lens);
  for (const ContextChunk& chunk : plan.context_chunks) {
    idx.chunk_cu_seq_lens.push_back(idx.append(chunk.cu_seq_lens));
    idx.chunk_token_to_seq.push_back(idx.append(chunk.token_to_seq));
    idx.chunk_starts.push_back(idx.append(chunk.starts));
  }
  idx.base = idx.host_view();
  return idx;
}

// [rows, cols] view of rows [first, first + rows) of a 2-D tensor, split as [rows, heads, width].
TensorView rows_as_heads(const TensorView& t2d, int64_t first, int64_t rows, int64_t heads,
                         int64_t width) {
  TensorView t = t2d.narrow(0, first, rows);
  return TensorView::strided(t.data, t.dtype, {rows, heads, width}, {t.strides[0], width, 1},
                             t.device);
}

// k_pe may be [T, R] or [T, 1, R] (vLLM passes the unsqueezed form); returns the 2-D view.
TensorView squeeze_k_pe(const TensorView& k_pe) {
  if (k_pe.ndim != 3) return k_pe;
  require(k_pe.shape[1] == 1, ErrorCode::kInvalidArgument, kOp,
          ": k_pe must be [T, R] or [T, 1, R], got ", detail::shape_string(k_pe));
  TensorView t = k_pe;
  t.ndim = 2;
  t.shape[1] = k_pe.shape[2];
  t.strides[1] = k_pe.strides[2];
  return t;
}

// Temporaries of one step, carved from the workspace.
struct StepBuffers {
  // prefill
  TensorView kv_up_new;   // [Tp, N * (P + V)] act
  TensorView suffix_out;  // [Tp, N, V] f32
  TensorView suffix_lse;  // [N, Tp] f32
  TensorView gather;      // [max chunk tokens, L + R] act
  TensorView kv_up_ctx;   // [max chunk tokens, N * (P + V)] act
  TensorView chunk_out;   // [Tp, N, V] f32
  TensorView chunk_lse;   // [N, Tp] f32
  TensorView ctx_out;     // [Tp, N, V] f32
  TensorView ctx_lse;     // [N, Tp] f32
  // decode
  TensorView ql;        // [Td, N, L + R] act
  TensorView ql_fp8;    // [Td, N, L + R] fp8 (fp8_e4m3 caches only)
  TensorView o_lat;     // [Td, N, L] f32
  TensorView lse;       // [Td, N] f32
  TensorView split_ws;  // f32 [max over runs of the split workspace]
  TensorView indices;   // i32 [StepIndices::host.size()] on the device (GPU layers only)
};

StepBuffers carve(detail::Arena& arena, const MlaAttentionConfig& c, const Plan& plan,
                  const detail::DecodeRuns& runs, const StepIndices& indices) {
  const MlaDims& d = c.dims;
  const int64_t n = d.num_heads, npv = n * d.kv_b_out_dim();
  StepBuffers b;
  const int64_t tp = plan.split.num_prefills ? plan.prefill_query_start_loc.back() : 0;
  if (tp > 0) {
    b.kv_up_new = arena.take({tp, npv}, c.act_dtype);
    b.suffix_out = arena.take({tp, n, d.v_head_dim}, DType::kF32);
    b.suffix_lse = arena.take({n, tp}, DType::kF32);
    if (plan.has_context()) {
      int64_t max_chunk = 0;
      for (const ContextChunk& chunk : plan.context_chunks)
        max_chunk = std::max(max_chunk, chunk.total_tokens);
      b.gather = arena.take({max_chunk, d.entry_dim()}, c.act_dtype);
      b.kv_up_ctx = arena.take({max_chunk, npv}, c.act_dtype);
      b.chunk_out = arena.take({tp, n, d.v_head_dim}, DType::kF32);
      b.chunk_lse = arena.take({n, tp}, DType::kF32);
      b.ctx_out = arena.take({tp, n, d.v_head_dim}, DType::kF32);
      b.ctx_lse = arena.take({n, tp}, DType::kF32);
    }
  }
  const int64_t td = plan.split.num_decode_tokens;
  if (td > 0) {
    b.ql = arena.take({td, n, d.entry_dim()}, c.act_dtype);
    if (c.kv_cache_dtype == KvCacheDType::kFp8E4m3)
      b.ql_fp8 = arena.take({td, n, d.entry_dim()}, DType::kFp8E4m3);
    b.o_lat = arena.take({td, n, d.kv_lora_rank}, DType::kF32);
    b.lse = arena.take({td, n}, DType::kF32);
    int64_t split_elems = 0;
    for (const detail::DecodeRun& run : runs.runs) {
      split_elems = std::max(split_elems, ops::mla_decode_workspace_elems(
                                              run.schedule, run.query_len, n, d.kv_lora_rank));
    }
    b.split_ws = arena.take({split_elems}, DType::kF32);
  }
  if (!c.device.is_cpu()) b.indices = arena.take({indices.base.numel()}, DType::kI32);
  return b;
}

}  // namespace

struct MlaAttention::State {
  MlaAttentionConfig config;
  AbsorbedWeights weights;
  int64_t workspace_tokens = 0;
  Tensor workspace;  // grows to the largest step seen (allocation only when a step needs more)
};

MlaAttention::MlaAttention(const MlaAttentionConfig& config, const TensorView& kv_b_proj_weight,
                           const std::optional<TensorView>& kv_b_proj_scale_inv)
    : state_(std::make_unique<State>()) {
  validate_config(config);
  state_->config = config;
  state_->weights = absorb_kv_b_proj(kv_b_proj_weight, kv_b_proj_scale_inv, config.dims,
                                     config.act_dtype, config.device);
  state_->workspace_tokens =
      config.workspace_tokens > 0
          ? config.workspace_tokens
          : chunked_prefill_workspace_tokens(config.max_model_len, config.max_num_seqs,
                                             config.block_size);
}

MlaAttention::~MlaAttention() = default;

const MlaAttentionConfig& MlaAttention::config() const { return state_->config; }
const AbsorbedWeights& MlaAttention::weights() const { return state_->weights; }
int64_t MlaAttention::workspace_tokens() const { return state_->workspace_tokens; }

Plan MlaAttention::plan(const ForwardBatch& batch) const {
  const MlaAttentionConfig& c = state_->config;
  PlannerConfig pc;
  pc.block_size = c.block_size;
  pc.decode_threshold = c.decode_threshold;
  pc.query_len_support = c.query_len_support;
  pc.workspace_tokens = state_->workspace_tokens;
  pc.chunk_policy = c.chunk_policy;
  pc.num_workers = 1;  // Plan::decode_schedule is informative; forward asks the backend (below)
  BatchDesc desc{batch.query_start_loc, batch.seq_lens, batch.num_actual_tokens,
                 batch.block_table.ndim == 2 ? batch.block_table.shape[1] : 0};
  return make_plan(desc, pc);
}

namespace {

void validate_forward(const MlaAttentionConfig& c, const TensorView& q, const TensorView& kv_c,
                      const TensorView& k_pe, const TensorView& kv_cache, const ForwardBatch* batch,
                      const TensorView& output) {
  const MlaDims& d = c.dims;
  for (auto [name, t] : {std::pair{"q", &q},
                         {"kv_c_normed", &kv_c},
                         {"k_pe", &k_pe},
                         {"kv_cache", &kv_cache},
                         {"output", &output}}) {
    detail::check_storage(kOp, name, *t);
  }
  detail::check_ndim(kOp, "output", output, 2);
  detail::check_dtype(kOp, "output", output, {c.act_dtype});
  detail::check_size(kOp, "output", output, 1, d.num_heads * d.v_head_dim);
  detail::check_inner_contiguous(kOp, "output", output);
  detail::check_device(kOp, "output", output, c.device);
  if (batch == nullptr) return;

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

  const int64_t tokens = batch->num_actual_tokens;
  require(tokens >= 0, ErrorCode::kInvalidArgument, kOp, ": num_actual_tokens must be >= 0, got ",
          tokens);
  for (auto [name, t] :
       {std::pair{"q", &q}, {"kv_c_normed", &kv_c}, {"k_pe", &k_pe}, {"output", &output}}) {
    require(t->shape[0] >= tokens, ErrorCode::kInvalidArgument, kOp, ": ", name,
            ".shape[0] must be >= num_actual_tokens (", tokens, "), got ", t->shape[0]);
  }
  detail::check_storage(kOp, "batch.slot_mapping", batch->slot_mapping);
  detail::check_ndim(kOp, "batch.slot_mapping", batch->slot_mapping, 1);
  detail::check_dtype(kOp, "batch.slot_mapping", batch->slot_mapping, {DType::kI64});
  detail::check_min_size(kOp, "batch.slot_mapping", batch->slot_mapping, 0, tokens);
  detail::check_storage(kOp, "batch.block_table", batch->block_table);
  detail::check_ndim(kOp, "batch.block_table", batch->block_table, 2);
  detail::check_dtype(kOp, "batch.block_table", batch->block_table, {DType::kI32});
  detail::check_min_size(kOp, "batch.block_table", batch->block_table, 0,
                         static_cast<int64_t>(batch->seq_lens.size()));
  if (kv_cache.numel() > 0) {
    check_kv_cache(kOp, kv_cache, c.kv_cache_dtype, d);
    detail::check_size(kOp, "kv_cache", kv_cache, 1, c.block_size);
    if (c.kv_cache_dtype == KvCacheDType::kAuto)
      detail::check_dtype(kOp, "kv_cache (kv_cache_dtype auto)", kv_cache, {c.act_dtype});
    detail::check_device(kOp, "kv_cache", kv_cache, c.device);
  }
}

}  // namespace

void MlaAttention::forward(const TensorView& q, const TensorView& kv_c_normed,
                           const TensorView& k_pe_in, const TensorView& kv_cache,
                           const ForwardBatch* batch, const TensorView& output,
                           const ForwardScales& scales, Stream stream) {
  const MlaAttentionConfig& c = state_->config;
  const MlaDims& d = c.dims;
  const TensorView k_pe = squeeze_k_pe(k_pe_in);
  validate_forward(c, q, kv_c_normed, k_pe, kv_cache, batch, output);
  if (batch == nullptr) {  // profile run (spec A.12): zeros keep DP + EP ranks consistent
    ops::fill_zero(output, stream);
    return;
  }
  if (is_fp8(c.kv_cache_dtype)) {
    require(std::isfinite(scales.k_scale) && scales.k_scale > 0 && std::isfinite(scales.q_scale) &&
                scales.q_scale > 0,
            ErrorCode::kInvalidArgument, kOp, ": q_scale and k_scale must be finite and > 0, got ",
            scales.q_scale, " and ", scales.k_scale);
  }

  const Plan plan = this->plan(*batch);
  const int64_t tokens = batch->num_actual_tokens;
  const bool needs_cache = plan.split.num_decodes > 0 || plan.has_context();
  require(kv_cache.numel() > 0 || !needs_cache, ErrorCode::kInvalidArgument, kOp,
          ": kv_cache is empty but the batch has ", plan.split.num_decodes, " decode requests and ",
          plan.context_chunks.size(), " context chunks to read");
  const detail::DecodeRuns runs = detail::decode_runs(
      plan, batch->query_start_loc, batch->seq_lens,
      [&](std::span<const int32_t> lens, int64_t q_len) {
        const ops::DecodePlanShape shape{c.device,
                                         static_cast<int64_t>(lens.size()),
                                         q_len,
                                         d.num_heads,
                                         c.block_size,
                                         batch->block_table.shape[1] * c.block_size,
                                         c.batch_invariant};
        return ops::plan_mla_decode(shape, lens);
      });

  // Size the workspace with the same carving code that uses it.
  StepIndices indices = collect_indices(plan, batch->seq_lens);
  detail::Arena measure(c.device);
  carve(measure, c, plan, runs, indices);
  if (state_->workspace.numel() < measure.used()) {
    state_->workspace = Tensor::empty({measure.used()}, DType::kU8, c.device);
  }
  detail::Arena arena(state_->workspace.view().data, state_->workspace.numel(), c.device);
  const StepBuffers buf = carve(arena, c, plan, runs, indices);
  if (!c.device.is_cpu()) {  // one upload of every index array of the step
    ops::copy(indices.host_view(), buf.indices, stream);
    indices.base = buf.indices;
  }

  // 1. Every actual token goes into the cache before any attention (spec A.3).
  if (kv_cache.numel() > 0 && tokens > 0) {
    ops::concat_and_cache_mla(kv_c_normed.narrow(0, 0, tokens), k_pe.narrow(0, 0, tokens), kv_cache,
                              batch->slot_mapping.narrow(0, 0, tokens), c.kv_cache_dtype,
                              scales.k_scale, stream);
  }

  const AbsorbedWeights& w = state_->weights;
  const int64_t n = d.num_heads, p = d.qk_nope_head_dim, l = d.kv_lora_rank, r = d.qk_rope_head_dim,
                v = d.v_head_dim, npv = n * d.kv_b_out_dim();
  // kv_b_proj as the right operand of x @ W^T: [1, L, N * (P + V)], a transposed matrix.
  const TensorView w_kv_b_t = TensorView::strided(w.kv_b_proj.view().data, c.act_dtype, {1, l, npv},
                                                  {npv * l, 1, l}, c.device);
  // x [rows, L] (any row stride) up-projected into dst [rows, N * (P + V)].
  auto up_project = [&](const TensorView& x, const TensorView& dst) {
    const int64_t rows = x.shape[0];
    ops::batched_matmul(
        TensorView::strided(x.data, x.dtype, {1, rows, l}, {rows * x.strides[0], x.strides[0], 1},
                            c.device),
        w_kv_b_t,
        TensorView::strided(dst.data, dst.dtype, {1, rows, npv}, {rows * npv, npv, 1}, c.device),
        stream);
  };

  // 2. Prefill path (spec A.5): tokens [num_decode_tokens, num_decode_tokens + Tp).
  const int64_t td = plan.split.num_decode_tokens;
  const int64_t tp = plan.split.num_prefills ? plan.prefill_query_start_loc.back() : 0;
  if (tp > 0) {
    const TensorView q_p = q.narrow(0, td, tp);
    const TensorView kv_up_new = buf.kv_up_new;
    up_project(kv_c_normed.narrow(0, td, tp), kv_up_new);
    const TensorView k_nope_new =
        rows_as_heads(kv_up_new, 0, tp, n, d.kv_b_out_dim()).narrow(2, 0, p);
    const TensorView v_new = rows_as_heads(kv_up_new, 0, tp, n, d.kv_b_out_dim()).narrow(2, p, v);
    const TensorView cu_q = indices.view(indices.prefill_query_start_loc);
    const TensorView out_p = rows_as_heads(output, td, tp, n, v);
    if (!plan.has_context()) {
      ops::mla_prefill(q_p, k_nope_new, k_pe.narrow(0, td, tp), v_new, cu_q, cu_q,
                       plan.prefill_max_query_len, plan.prefill_max_query_len, c.scale,
                       /*causal=*/true, out_p, std::nullopt, stream);
    } else {
      ops::mla_prefill(q_p, k_nope_new, k_pe.narrow(0, td, tp), v_new, cu_q, cu_q,
                       plan.prefill_max_query_len, plan.prefill_max_query_len, c.scale,
                       /*causal=*/true, buf.suffix_out, buf.suffix_lse, stream);
      const TensorView block_table_p =
          batch->block_table.narrow(0, plan.split.num_decodes, plan.split.num_prefills);
      bool first = true;
      for (size_t i = 0; i < plan.context_chunks.size(); ++i) {
        const ContextChunk& chunk = plan.context_chunks[i];
        const TensorView chunk_cu = indices.view(indices.chunk_cu_seq_lens[i]);
        const int64_t rows = chunk.total_tokens;
        const TensorView gather = buf.gather.narrow(0, 0, rows);
        ops::gather_and_maybe_dequant_cache(
            kv_cache, gather, block_table_p, chunk_cu, indices.view(indices.chunk_token_to_seq[i]),
            rows, c.kv_cache_dtype, scales.k_scale, indices.view(indices.chunk_starts[i]), stream);
        const TensorView kv_up = buf.kv_up_ctx.narrow(0, 0, rows);
        up_project(gather.narrow(1, 0, l), kv_up);
        const TensorView out = first ? buf.ctx_out : buf.chunk_out;
        const TensorView lse = first ? buf.ctx_lse : buf.chunk_lse;
        ops::mla_prefill(q_p, rows_as_heads(kv_up, 0, rows, n, d.kv_b_out_dim()).narrow(2, 0, p),
                         gather.narrow(1, l, r),
                         rows_as_heads(kv_up, 0, rows, n, d.kv_b_out_dim()).narrow(2, p, v), cu_q,
                         chunk_cu, plan.prefill_max_query_len, chunk.max_seq_len, c.scale,
                         /*causal=*/false, out, lse, stream);
        if (!first) {
          ops::merge_attn_states(buf.ctx_out, buf.ctx_lse, buf.ctx_out, buf.ctx_lse, buf.chunk_out,
                                 buf.chunk_lse, stream);
        }
        first = false;
      }
      ops::merge_attn_states(out_p, std::nullopt, buf.ctx_out, buf.ctx_lse, buf.suffix_out,
                             buf.suffix_lse, stream);
    }
  }

  // 3. Decode path (spec A.6): absorb W_UK, latent MQA over the cache, V up-projection.
  if (td > 0) {
    const TensorView q_d = q.narrow(0, 0, td);
    // ql[t, n, 0:L] = q_nope[t, n, :] @ W_UK_T[n]   (as a per-head batch: [N, Td, P] @ [N, P, L])
    ops::batched_matmul(q_d.narrow(2, 0, p).transpose(0, 1), w.w_uk_t,
                        buf.ql.narrow(2, 0, l).transpose(0, 1), stream);
    ops::copy(q_d.narrow(2, p, r), buf.ql.narrow(2, l, r), stream);
    TensorView q_kernel = buf.ql;
    if (c.kv_cache_dtype == KvCacheDType::kFp8E4m3) {
      ops::scaled_fp8_quant(buf.ql, buf.ql_fp8, scales.q_scale, stream);
      q_kernel = buf.ql_fp8;
    }
    const ops::DecodeParams params{c.scale, c.kv_cache_dtype, scales.q_scale, scales.k_scale};
    const TensorView seq_lens_all = indices.view(indices.seq_lens);
    if (runs.first_padding_token < td) {
      ops::fill_zero(buf.o_lat.narrow(0, runs.first_padding_token, td - runs.first_padding_token),
                     stream);
    }
    for (const detail::DecodeRun& run : runs.runs) {
      const int64_t reqs = run.num_requests, sq = run.query_len, rows = reqs * sq;
      ops::mla_decode(
          q_kernel.narrow(0, run.first_token, rows).reshape({reqs, sq, n, d.entry_dim()}), kv_cache,
          batch->block_table.narrow(0, run.first_request, reqs),
          seq_lens_all.narrow(0, run.first_request, reqs),
          buf.o_lat.narrow(0, run.first_token, rows).reshape({reqs, sq, n, l}),
          buf.lse.narrow(0, run.first_token, rows).reshape({reqs, sq, n}), params, run.schedule,
          buf.split_ws, stream);
    }
    // out[t, n * V + :] = o_lat[t, n, :] @ W_UV[n]   ([N, Td, L] @ [N, L, V])
    ops::batched_matmul(buf.o_lat.transpose(0, 1), w.w_uv,
                        rows_as_heads(output, 0, td, n, v).transpose(0, 1), stream);
  }
}

}  // namespace mlakit
