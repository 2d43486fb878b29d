// Engine steps behind the C ABI: the shared Workspace, plan_step once per step, and each layer's
// forward against the step's plan (mlakit/step.hpp).
#include <memory>

#include "capi/boundary.hpp"
#include "capi/layer.hpp"

using mlakit::capi::guarded;
using mlakit::capi::require_pointer;
using mlakit::capi::to_batch;
using mlakit::capi::to_config;
using mlakit::capi::to_views;

extern "C" {

MLAKIT_API mlakit_status_t mlakit_workspace_bytes(const mlakit_mla_config_t* config,
                                                  int64_t* bytes) {
  constexpr const char* kOp = "workspace_bytes";
  return guarded(kOp, [&] {
    require_pointer(kOp, "bytes", bytes);
    require_pointer(kOp, "config", config);
    *bytes = mlakit::workspace_bytes(to_config(kOp, *config));
  });
}

MLAKIT_API mlakit_status_t mlakit_workspace_create(const mlakit_mla_config_t* config,
                                                   mlakit_workspace_t** workspace) {
  constexpr const char* kOp = "Workspace";
  return guarded(kOp, [&] {
    require_pointer(kOp, "workspace", workspace);
    *workspace = nullptr;
    require_pointer(kOp, "config", config);
    auto handle = std::make_unique<mlakit_workspace>();
    handle->workspace = std::make_shared<mlakit::Workspace>(to_config(kOp, *config));
    *workspace = handle.release();
  });
}

MLAKIT_API void mlakit_workspace_destroy(mlakit_workspace_t* workspace) { delete workspace; }

MLAKIT_API mlakit_status_t mlakit_workspace_get_bytes(const mlakit_workspace_t* workspace,
                                                      int64_t* bytes) {
  constexpr const char* kOp = "Workspace::bytes";
  return guarded(kOp, [&] {
    require_pointer(kOp, "workspace", workspace);
    require_pointer(kOp, "bytes", bytes);
    *bytes = workspace->workspace->bytes();
  });
}

MLAKIT_API mlakit_status_t mlakit_workspace_touch(mlakit_workspace_t* workspace, void* stream) {
  constexpr const char* kOp = "Workspace::touch";
  return guarded(kOp, [&] {
    require_pointer(kOp, "workspace", workspace);
    workspace->workspace->touch(mlakit::Stream{stream});
  });
}

MLAKIT_API mlakit_status_t mlakit_plan_step(const mlakit_mla_config_t* config,
                                            const mlakit_forward_batch_t* batch,
                                            mlakit_workspace_t* workspace, void* stream,
                                            mlakit_step_plan_t** plan) {
  constexpr const char* kOp = "plan_step";
  return guarded(kOp, [&] {
    require_pointer(kOp, "plan", plan);
    *plan = nullptr;
    require_pointer(kOp, "config", config);
    require_pointer(kOp, "batch", batch);
    require_pointer(kOp, "workspace", workspace);
    const mlakit::MlaAttentionConfig step_config = to_config(kOp, *config);
    const mlakit::ForwardBatch step_batch = to_batch(kOp, *batch);
    auto handle = std::make_unique<mlakit_step_plan>();
    handle->plan =
        mlakit::plan_step(step_config, step_batch, *workspace->workspace, mlakit::Stream{stream});
    handle->workspace = workspace->workspace;
    *plan = handle.release();
  });
}

MLAKIT_API void mlakit_step_plan_destroy(mlakit_step_plan_t* plan) { delete plan; }

MLAKIT_API mlakit_status_t mlakit_step_plan_get_info(const mlakit_step_plan_t* plan,
                                                     mlakit_step_plan_info_t* info) {
  constexpr const char* kOp = "StepPlan::info";
  return guarded(kOp, [&] {
    require_pointer(kOp, "plan", plan);
    require_pointer(kOp, "info", info);
    const mlakit::Plan& p = plan->plan.plan();
    info->num_reqs = p.num_reqs;
    info->num_actual_tokens = plan->plan.num_actual_tokens();
    info->split = mlakit_split_counts_t{p.split.num_decodes, p.split.num_prefills,
                                        p.split.num_decode_tokens, p.split.num_prefill_tokens};
    info->num_context_chunks = static_cast<int64_t>(p.context_chunks.size());
    info->workspace_bytes_used = plan->plan.workspace_bytes_used();
  });
}

MLAKIT_API mlakit_status_t mlakit_step_plan_get_plan(const mlakit_step_plan_t* plan,
                                                     mlakit_plan_t** copy) {
  constexpr const char* kOp = "StepPlan::plan";
  return guarded(kOp, [&] {
    require_pointer(kOp, "copy", copy);
    *copy = nullptr;
    require_pointer(kOp, "plan", plan);
    auto handle = std::make_unique<mlakit_plan>();
    handle->plan = plan->plan.plan();
    *copy = handle.release();
  });
}

MLAKIT_API mlakit_status_t mlakit_step_plan_same_launches(const mlakit_step_plan_t* a,
                                                          const mlakit_step_plan_t* b,
                                                          int32_t* same) {
  constexpr const char* kOp = "StepPlan::same_launches";
  return guarded(kOp, [&] {
    require_pointer(kOp, "a", a);
    require_pointer(kOp, "b", b);
    require_pointer(kOp, "same", same);
    *same = a->plan.same_launches(b->plan) ? 1 : 0;
  });
}

MLAKIT_API mlakit_status_t mlakit_attention_forward_step(
    mlakit_attention_t* attention, const DLTensor* q, const DLTensor* kv_c_normed,
    const DLTensor* k_pe, const DLTensor* kv_cache, const mlakit_step_plan_t* plan,
    const DLTensor* output, float q_scale, float k_scale, void* stream) {
  constexpr const char* kOp = "MlaAttention::forward";
  return guarded(kOp, [&] {
    require_pointer(kOp, "attention", attention);
    require_pointer(kOp, "plan", plan);
    mlakit::ForwardScales scales;
    scales.q_scale = q_scale;
    scales.k_scale = k_scale;
    const auto [q_view, kv_c_normed_view, k_pe_view, kv_cache_view, output_view] =
        to_views(kOp, {{"q", q},
                       {"kv_c_normed", kv_c_normed},
                       {"k_pe", k_pe},
                       {"kv_cache", kv_cache},
                       {"output", output}});
    attention->layer.forward(q_view, kv_c_normed_view, k_pe_view, kv_cache_view, plan->plan,
                             output_view, scales, mlakit::Stream{stream});
  });
}

}  // extern "C"
