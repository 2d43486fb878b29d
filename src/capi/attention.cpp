// MlaAttention behind the C ABI: create from a config struct and the kv_b_proj weight, plan,
// forward, destroy.
#include <memory>
#include <optional>

#include "capi/boundary.hpp"
#include "capi/layer.hpp"

using mlakit::capi::guarded;
using mlakit::capi::require_pointer;
using mlakit::capi::to_batch;
using mlakit::capi::to_config;
using mlakit::capi::to_view;
using mlakit::capi::to_views;

extern "C" {

MLAKIT_API void mlakit_mla_config_init(mlakit_mla_config_t* config) {
  if (config != nullptr) mlakit::capi::init_config(*config);
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
