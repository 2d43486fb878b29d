// Absorbed MQA decode behind the C ABI: the convenience form (plans and allocates itself), the
// planners and the scheduled form (caller-made split-KV schedule and workspace).
#include <memory>
#include <span>

#include "capi/boundary.hpp"
#include "mlakit/ops.hpp"

using mlakit::capi::guarded;
using mlakit::capi::require_count;
using mlakit::capi::require_pointer;
using mlakit::capi::require_request_count;
using mlakit::capi::to_kv_cache_dtype;
using mlakit::capi::to_views;

namespace {

mlakit::ops::DecodeParams decode_params(const char* op, int64_t kv_lora_rank, float scale,
                                        int32_t kv_cache_dtype, float q_scale, float k_scale) {
  // 0 would mean "take L from out" in C++ (ops.hpp); C callers always say what L is.
  mlakit::detail::require(kv_lora_rank > 0, mlakit::ErrorCode::kInvalidArgument, op,
                          ": kv_lora_rank must be > 0, got ", kv_lora_rank);
  mlakit::ops::DecodeParams params;
  params.kv_lora_rank = kv_lora_rank;
  params.scale = scale;
  params.kv_dtype = to_kv_cache_dtype(op, kv_cache_dtype);
  params.q_scale = q_scale;
  params.k_scale = k_scale;
  return params;
}

// decode_params with q_scale / k_scale given as tensors (NULL: the float default, 1).
mlakit::ops::DecodeParams decode_params(const char* op, int64_t kv_lora_rank, float scale,
                                        int32_t kv_cache_dtype, const DLTensor* q_scale,
                                        const DLTensor* k_scale) {
  mlakit::ops::DecodeParams params =
      decode_params(op, kv_lora_rank, scale, kv_cache_dtype, 1.0f, 1.0f);
  params.q_scale_tensor = mlakit::capi::to_optional_view(op, "q_scale", q_scale);
  params.k_scale_tensor = mlakit::capi::to_optional_view(op, "k_scale", k_scale);
  return params;
}

// The argument views of a decode call.
struct DecodeViews {
  mlakit::TensorView q, kv_cache, block_table, seq_lens, out, lse;
};
DecodeViews decode_views(const char* op, const DLTensor* q, const DLTensor* kv_cache,
                         const DLTensor* block_table, const DLTensor* seq_lens, const DLTensor* out,
                         const DLTensor* lse) {
  const auto [q_view, kv_cache_view, block_table_view, seq_lens_view, out_view, lse_view] =
      to_views(op, {{"q", q},
                    {"kv_cache", kv_cache},
                    {"block_table", block_table},
                    {"seq_lens", seq_lens},
                    {"out", out},
                    {"lse", lse}});
  return {q_view, kv_cache_view, block_table_view, seq_lens_view, out_view, lse_view};
}

// The convenience decode (plans and allocates itself) behind both C entries; Scale: float (host
// scales) or const DLTensor*.
template <class Scale>
mlakit_status_t decode_planning_itself(const DLTensor* q, const DLTensor* kv_cache,
                                       const DLTensor* block_table, const DLTensor* seq_lens,
                                       const DLTensor* out, const DLTensor* lse,
                                       int64_t kv_lora_rank, float scale, int32_t kv_cache_dtype,
                                       Scale q_scale, Scale k_scale) {
  constexpr const char* kOp = "mla_decode";
  return guarded(kOp, [&] {
    const DecodeViews v = decode_views(kOp, q, kv_cache, block_table, seq_lens, out, lse);
    mlakit::ops::mla_decode(
        v.q, v.kv_cache, v.block_table, v.seq_lens, v.out, v.lse,
        decode_params(kOp, kv_lora_rank, scale, kv_cache_dtype, q_scale, k_scale));
  });
}

// The scheduled decode behind both C entries; Scale: float (host scales) or const DLTensor*.
template <class Scale>
mlakit_status_t decode_scheduled(const DLTensor* q, const DLTensor* kv_cache,
                                 const DLTensor* block_table, const DLTensor* seq_lens,
                                 const DLTensor* out, const DLTensor* lse, int64_t kv_lora_rank,
                                 float scale, int32_t kv_cache_dtype, Scale q_scale, Scale k_scale,
                                 const mlakit_decode_schedule_t* schedule,
                                 const DLTensor* split_workspace, void* stream) {
  constexpr const char* kOp = "mla_decode";
  return guarded(kOp, [&] {
    require_pointer(kOp, "schedule", schedule);
    const DecodeViews v = decode_views(kOp, q, kv_cache, block_table, seq_lens, out, lse);
    const auto [split_workspace_view] = to_views(kOp, {{"split_workspace", split_workspace}});
    mlakit::ops::mla_decode(
        v.q, v.kv_cache, v.block_table, v.seq_lens, v.out, v.lse,
        decode_params(kOp, kv_lora_rank, scale, kv_cache_dtype, q_scale, k_scale),
        schedule->schedule, split_workspace_view, mlakit::Stream{stream});
  });
}

}  // namespace

extern "C" {

MLAKIT_API mlakit_status_t mlakit_mla_decode(const DLTensor* q, const DLTensor* kv_cache,
                                             const DLTensor* block_table, const DLTensor* seq_lens,
                                             const DLTensor* out, const DLTensor* lse,
                                             int64_t kv_lora_rank, float scale,
                                             int32_t kv_cache_dtype, float q_scale, float k_scale) {
  return decode_planning_itself(q, kv_cache, block_table, seq_lens, out, lse, kv_lora_rank, scale,
                                kv_cache_dtype, q_scale, k_scale);
}

MLAKIT_API mlakit_status_t mlakit_mla_decode_tensor_scale(
    const DLTensor* q, const DLTensor* kv_cache, const DLTensor* block_table,
    const DLTensor* seq_lens, const DLTensor* out, const DLTensor* lse, int64_t kv_lora_rank,
    float scale, int32_t kv_cache_dtype, const DLTensor* q_scale, const DLTensor* k_scale) {
  return decode_planning_itself(q, kv_cache, block_table, seq_lens, out, lse, kv_lora_rank, scale,
                                kv_cache_dtype, q_scale, k_scale);
}

MLAKIT_API mlakit_status_t mlakit_plan_mla_decode(const mlakit_decode_plan_shape_t* shape,
                                                  const int32_t* seq_lens,
                                                  mlakit_decode_schedule_t** schedule) {
  constexpr const char* kOp = "plan_mla_decode";
  return guarded(kOp, [&] {
    require_pointer(kOp, "schedule", schedule);
    *schedule = nullptr;
    require_pointer(kOp, "shape", shape);
    mlakit::ops::DecodePlanShape plan_shape;
    plan_shape.device = mlakit::capi::to_device(kOp, "shape.device", shape->device);
    plan_shape.batch = shape->batch;
    plan_shape.s_q = shape->s_q;
    plan_shape.num_heads = shape->num_heads;
    plan_shape.block_size = shape->block_size;
    plan_shape.max_seq_len = shape->max_seq_len;
    plan_shape.batch_invariant = shape->batch_invariant != 0;
    std::span<const int32_t> lens;
    if (seq_lens != nullptr) {
      require_request_count(kOp, "shape.batch", shape->batch);
      lens = std::span<const int32_t>(seq_lens, static_cast<size_t>(shape->batch));
    }
    auto handle = std::make_unique<mlakit_decode_schedule>();
    handle->schedule = mlakit::ops::plan_mla_decode(plan_shape, lens);
    *schedule = handle.release();
  });
}

MLAKIT_API mlakit_status_t mlakit_plan_decode_splits(const int32_t* seq_lens, int64_t num_seqs,
                                                     int64_t block_size, int64_t num_workers,
                                                     mlakit_decode_schedule_t** schedule) {
  constexpr const char* kOp = "plan_decode_splits";
  return guarded(kOp, [&] {
    require_pointer(kOp, "schedule", schedule);
    *schedule = nullptr;
    require_count(kOp, "num_seqs", num_seqs);
    if (num_seqs > 0) require_pointer(kOp, "seq_lens", seq_lens);
    auto handle = std::make_unique<mlakit_decode_schedule>();
    handle->schedule = mlakit::plan_decode_splits(
        std::span<const int32_t>(seq_lens, static_cast<size_t>(num_seqs)), block_size, num_workers);
    *schedule = handle.release();
  });
}

MLAKIT_API void mlakit_decode_schedule_destroy(mlakit_decode_schedule_t* schedule) {
  delete schedule;
}

MLAKIT_API mlakit_status_t mlakit_decode_schedule_info(const mlakit_decode_schedule_t* schedule,
                                                       int64_t* total_splits, int64_t* max_splits) {
  constexpr const char* kOp = "decode_schedule_info";
  return guarded(kOp, [&] {
    require_pointer(kOp, "schedule", schedule);
    require_pointer(kOp, "total_splits", total_splits);
    require_pointer(kOp, "max_splits", max_splits);
    *total_splits = schedule->schedule.total_splits;
    *max_splits = schedule->schedule.max_splits;
  });
}

MLAKIT_API mlakit_status_t mlakit_decode_workspace_elems(const mlakit_decode_schedule_t* schedule,
                                                         int64_t s_q, int64_t num_heads,
                                                         int64_t kv_lora_rank, int64_t* elems) {
  constexpr const char* kOp = "decode_workspace_elems";
  return guarded(kOp, [&] {
    require_pointer(kOp, "schedule", schedule);
    require_pointer(kOp, "elems", elems);
    *elems =
        mlakit::ops::mla_decode_workspace_elems(schedule->schedule, s_q, num_heads, kv_lora_rank);
  });
}

MLAKIT_API mlakit_status_t mlakit_mla_decode_scheduled(
    const DLTensor* q, const DLTensor* kv_cache, const DLTensor* block_table,
    const DLTensor* seq_lens, const DLTensor* out, const DLTensor* lse, int64_t kv_lora_rank,
    float scale, int32_t kv_cache_dtype, float q_scale, float k_scale,
    const mlakit_decode_schedule_t* schedule, const DLTensor* split_workspace, void* stream) {
  return decode_scheduled(q, kv_cache, block_table, seq_lens, out, lse, kv_lora_rank, scale,
                          kv_cache_dtype, q_scale, k_scale, schedule, split_workspace, stream);
}

MLAKIT_API mlakit_status_t mlakit_mla_decode_scheduled_tensor_scale(
    const DLTensor* q, const DLTensor* kv_cache, const DLTensor* block_table,
    const DLTensor* seq_lens, const DLTensor* out, const DLTensor* lse, int64_t kv_lora_rank,
    float scale, int32_t kv_cache_dtype, const DLTensor* q_scale, const DLTensor* k_scale,
    const mlakit_decode_schedule_t* schedule, const DLTensor* split_workspace, void* stream) {
  return decode_scheduled(q, kv_cache, block_table, seq_lens, out, lse, kv_lora_rank, scale,
                          kv_cache_dtype, q_scale, k_scale, schedule, split_workspace, stream);
}

}  // extern "C"
