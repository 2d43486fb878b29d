// MlaAttention behind the C ABI: create from a config struct and the kv_b_proj weight, plan,
// forward, destroy.
#include "mlakit/attention.hpp"

#include <memory>
#include <span>

#include "capi/boundary.hpp"

using mlakit::capi::guarded;
using mlakit::capi::require_count;
using mlakit::capi::require_pointer;
using mlakit::capi::to_view;
using mlakit::capi::to_views;

struct mlakit_attention {
  explicit mlakit_attention(const mlakit::MlaAttentionConfig& config,
                            const mlakit::TensorView& weight,
                            const std::optional<mlakit::TensorView>& scale_inv)
      : layer(config, weight, scale_inv) {}
  mlakit::MlaAttention layer;
};

namespace {

DLDataType dl_dtype(uint8_t code, uint8_t bits) { return DLDataType{code, bits, 1}; }

DLDataType to_dl_dtype(mlakit::DType dtype) {
  switch (dtype) {
    case mlakit::DType::kF16:
      return dl_dtype(kDLFloat, 16);
    case mlakit::DType::kBF16:
      return dl_dtype(kDLBfloat, 16);
    default:
      return dl_dtype(kDLFloat, 32);
  }
}

mlakit::MlaAttentionConfig to_config(const char* op, const mlakit_mla_config_t& c) {
  mlakit::MlaAttentionConfig config;
  config.dims.num_heads = c.num_heads;
  config.dims.kv_lora_rank = c.kv_lora_rank;
  config.dims.qk_rope_head_dim = c.qk_rope_head_dim;
  config.dims.qk_nope_head_dim = c.qk_nope_head_dim;
  config.dims.v_head_dim = c.v_head_dim;
  config.scale = c.scale;
  config.act_dtype = mlakit::capi::to_dtype(op, "config.act_dtype", c.act_dtype);
  config.kv_cache_dtype = mlakit::capi::to_kv_cache_dtype(op, c.kv_cache_dtype);
  config.block_size = c.block_size;
  config.decode_threshold = c.decode_threshold;
  config.query_len_support = mlakit::capi::to_query_len_support(op, c.query_len_support);
  config.chunk_policy = mlakit::capi::to_chunk_policy(op, c.chunk_policy);
  config.workspace_tokens = c.workspace_tokens;
  config.max_model_len = c.max_model_len;
  config.max_num_seqs = c.max_num_seqs;
  config.batch_invariant = c.batch_invariant != 0;
  // The device comes through a zero-size tensor so that it gets the same checks as any tensor's.
  DLTensor probe{};
  probe.device = c.device;
  probe.dtype = dl_dtype(kDLFloat, 32);
  config.device = to_view(op, "config.device", &probe).device;
  return config;
}

// The host arrays and device tensors of a C batch; the spans borrow the caller's arrays.
mlakit::ForwardBatch to_batch(const char* op, const mlakit_forward_batch_t& b) {
  require_count(op, "batch.num_reqs", b.num_reqs);
  require_pointer(op, "batch.query_start_loc", b.query_start_loc);
  if (b.num_reqs > 0) require_pointer(op, "batch.seq_lens", b.seq_lens);
  mlakit::ForwardBatch batch;
  batch.query_start_loc = std::span<const int32_t>(b.query_start_loc, b.num_reqs + 1);
  batch.seq_lens = std::span<const int32_t>(b.seq_lens, static_cast<size_t>(b.num_reqs));
  batch.num_actual_tokens = b.num_actual_tokens;
  batch.block_table = to_view(op, "batch.block_table", b.block_table);
  batch.slot_mapping = to_view(op, "batch.slot_mapping", b.slot_mapping);
  return batch;
}

}  // namespace

extern "C" {

MLAKIT_API void mlakit_mla_config_init(mlakit_mla_config_t* config) {
  if (config == nullptr) return;
  const mlakit::MlaAttentionConfig d;
  config->num_heads = d.dims.num_heads;
  config->kv_lora_rank = d.dims.kv_lora_rank;
  config->qk_rope_head_dim = d.dims.qk_rope_head_dim;
  config->qk_nope_head_dim = d.dims.qk_nope_head_dim;
  config->v_head_dim = d.dims.v_head_dim;
  config->scale = d.scale;
  config->act_dtype = to_dl_dtype(d.act_dtype);
  config->kv_cache_dtype = MLAKIT_KV_CACHE_AUTO;
  config->block_size = d.block_size;
  config->decode_threshold = d.decode_threshold;
  config->query_len_support = MLAKIT_QUERY_LEN_VARLEN;
  config->chunk_policy = MLAKIT_CHUNK_PACKED;
  config->workspace_tokens = d.workspace_tokens;
  config->max_model_len = d.max_model_len;
  config->max_num_seqs = d.max_num_seqs;
  config->device = DLDevice{kDLCPU, 0};
  config->batch_invariant = d.batch_invariant ? 1 : 0;
}

MLAKIT_API mlakit_status_t mlakit_attention_create(const mlakit_mla_config_t* config,
                                                   const DLTensor* kv_b_proj_weight,
                                                   const DLTensor* kv_b_proj_scale_inv,
                                                   mlakit_attention_t** attention) {
  constexpr const char* kOp = "MlaAttention";
  return guarded(kOp, [&] {
    require_pointer(kOp, "attention", attention);
    *attention = nullptr;
    require_pointer(kOp, "config", config);
    const mlakit::MlaAttentionConfig layer_config = to_config(kOp, *config);
    const mlakit::TensorView weight = to_view(kOp, "kv_b_proj_weight", kv_b_proj_weight);
    const std::optional<mlakit::TensorView> scale_inv =
        mlakit::capi::to_optional_view(kOp, "kv_b_proj_scale_inv", kv_b_proj_scale_inv);
    *attention = new mlakit_attention(layer_config, weight, scale_inv);
  });
}

MLAKIT_API void mlakit_attention_destroy(mlakit_attention_t* attention) { delete attention; }

MLAKIT_API mlakit_status_t mlakit_attention_workspace_tokens(const mlakit_attention_t* attention,
                                                             int64_t* tokens) {
  constexpr const char* kOp = "MlaAttention::workspace_tokens";
  return guarded(kOp, [&] {
    require_pointer(kOp, "attention", attention);
    require_pointer(kOp, "tokens", tokens);
    *tokens = attention->layer.workspace_tokens();
  });
}

MLAKIT_API mlakit_status_t mlakit_attention_plan(const mlakit_attention_t* attention,
                                                 const mlakit_forward_batch_t* batch,
                                                 mlakit_plan_t** plan) {
  constexpr const char* kOp = "MlaAttention::plan";
  return guarded(kOp, [&] {
    require_pointer(kOp, "plan", plan);
    *plan = nullptr;
    require_pointer(kOp, "attention", attention);
    require_pointer(kOp, "batch", batch);
    auto handle = std::make_unique<mlakit_plan>();
    handle->plan = attention->layer.plan(to_batch(kOp, *batch));
    *plan = handle.release();
  });
}

MLAKIT_API mlakit_status_t mlakit_attention_forward(mlakit_attention_t* attention,
                                                    const DLTensor* q, const DLTensor* kv_c_normed,
                                                    const DLTensor* k_pe, const DLTensor* kv_cache,
                                                    const mlakit_forward_batch_t* batch,
                                                    const DLTensor* output, float q_scale,
                                                    float k_scale, void* stream) {
  constexpr const char* kOp = "MlaAttention::forward";
  return guarded(kOp, [&] {
    require_pointer(kOp, "attention", attention);
    std::optional<mlakit::ForwardBatch> forward_batch;
    if (batch != nullptr) forward_batch = to_batch(kOp, *batch);
    mlakit::ForwardScales scales;
    scales.q_scale = q_scale;
    scales.k_scale = k_scale;
    const auto [q_view, kv_c_normed_view, k_pe_view, kv_cache_view, output_view] =
        to_views(kOp, {{"q", q},
                       {"kv_c_normed", kv_c_normed},
                       {"k_pe", k_pe},
                       {"kv_cache", kv_cache},
                       {"output", output}});
    attention->layer.forward(q_view, kv_c_normed_view, k_pe_view, kv_cache_view,
                             forward_batch ? &*forward_batch : nullptr, output_view, scales,
                             mlakit::Stream{stream});
  });
}

}  // extern "C"
