// ops::plan_mla_decode: the backend's split-KV schedule for one decode call.
#include <cstdint>
#include <span>

#include "core/check.hpp"
#include "cpu/parallel.hpp"
#include "mlakit/ops.hpp"

#ifdef MLAKIT_WITH_CUDA
#include "cuda/decode/decode.hpp"
#include "cuda/decode/schedule.hpp"
#endif

namespace mlakit::ops {

using detail::require;

namespace {

void check_shape(const char* op, const DecodePlanShape& shape) {
  require(shape.batch >= 0 && shape.s_q >= 1 && shape.num_heads >= 1 && shape.block_size >= 1 &&
              shape.max_seq_len >= 0,
          ErrorCode::kInvalidArgument, op,
          ": need batch >= 0, s_q >= 1, num_heads >= 1, block_size >= 1 and max_seq_len >= 0, got "
          "batch ",
          shape.batch, ", s_q ", shape.s_q, ", num_heads ", shape.num_heads, ", block_size ",
          shape.block_size, ", max_seq_len ", shape.max_seq_len);
}

}  // namespace

DecodeSchedule plan_mla_decode(const DecodePlanShape& shape, std::span<const int32_t> seq_lens) {
  constexpr const char* kOp = "plan_mla_decode";
  check_shape(kOp, shape);
  if (shape.device.is_cpu()) {
    require(static_cast<int64_t>(seq_lens.size()) == shape.batch, ErrorCode::kInvalidArgument, kOp,
            ": the CPU plans from the lengths: seq_lens must have batch (", shape.batch,
            ") entries, got ", seq_lens.size());
    // The GPU meets a longer seq_len only when the kernel runs (a bad index: NaN rows and the
    // device error word); the CPU has the lengths now and refuses the plan.
    for (size_t b = 0; b < seq_lens.size(); ++b) {
      require(seq_lens[b] <= shape.max_seq_len, ErrorCode::kInvalidArgument, kOp, ": seq_lens[", b,
              "] (", seq_lens[b], ") exceeds shape.max_seq_len (", shape.max_seq_len, ")");
    }
    return plan_decode_splits(seq_lens, shape.block_size, cpu::num_threads(),
                              shape.batch_invariant);
  }
#ifdef MLAKIT_WITH_CUDA
  if (shape.device.is_cuda()) {
    return cuda::plan_decode_splits_cuda(shape.batch, shape.s_q, shape.num_heads, shape.max_seq_len,
                                         shape.batch_invariant, shape.device);
  }
#endif
  detail::unsupported_device(kOp, shape.device);
}

int64_t mla_decode_max_workspace_elems(const DecodePlanShape& shape, int64_t kv_lora_rank) {
  constexpr const char* kOp = "mla_decode_max_workspace_elems";
  check_shape(kOp, shape);
  require(kv_lora_rank > 0, ErrorCode::kInvalidArgument, kOp, ": kv_lora_rank must be > 0, got ",
          kv_lora_rank);
  if (shape.device.is_cpu()) {
    DecodeSchedule bound;
    bound.total_splits = max_decode_splits(shape.batch, shape.max_seq_len, shape.block_size,
                                           cpu::num_threads(), shape.batch_invariant);
    return mla_decode_workspace_elems(bound, shape.s_q, shape.num_heads, kv_lora_rank);
  }
  // The other backends plan from the shape alone: their schedule for any lengths is this one.
  return mla_decode_workspace_elems(plan_mla_decode(shape, {}), shape.s_q, shape.num_heads,
                                    kv_lora_rank);
}

DecodeSchedule mla_decode_plan_ahead(const DecodeSchedule& schedule, const TensorView& block_table,
                                     const TensorView& seq_lens, int64_t block_size,
                                     int64_t kv_lora_rank, const TensorView& split_workspace,
                                     Stream stream) {
  constexpr const char* kOp = "mla_decode_plan_ahead";
  if (schedule.kind != DecodeScheduleKind::kDevicePlanned) return schedule;
  const Device device = detail::common_device(kOp, {{"block_table", &block_table},
                                                    {"seq_lens", &seq_lens},
                                                    {"split_workspace", &split_workspace}});
  const DeviceDecodeSchedule& d = schedule.device;
  detail::check_storage(kOp, "block_table", block_table);
  detail::check_ndim(kOp, "block_table", block_table, 2);
  detail::check_dtype(kOp, "block_table", block_table, {DType::kI32});
  detail::check_size(kOp, "block_table", block_table, 0, d.batch);
  detail::check_storage(kOp, "seq_lens", seq_lens);
  detail::check_ndim(kOp, "seq_lens", seq_lens, 1);
  detail::check_dtype(kOp, "seq_lens", seq_lens, {DType::kI32});
  detail::check_size(kOp, "seq_lens", seq_lens, 0, d.batch);
  require(block_size > 0, ErrorCode::kInvalidArgument, kOp, ": block_size must be > 0, got ",
          block_size);
  detail::check_storage(kOp, "split_workspace", split_workspace);
  detail::check_dtype(kOp, "split_workspace", split_workspace, {DType::kF32});
  detail::check_contiguous(kOp, "split_workspace", split_workspace);
  const int64_t needed = mla_decode_workspace_elems(schedule, d.s_q, d.num_heads, kv_lora_rank);
  require(split_workspace.numel() >= needed, ErrorCode::kInvalidArgument, kOp,
          ": split_workspace must hold at least ", needed, " f32 elements, got ",
          split_workspace.numel());
#ifdef MLAKIT_WITH_CUDA
  if (device.is_cuda()) {
    cuda::mla_decode_plan_ahead(schedule, block_table, seq_lens, block_size,
                                split_workspace.data_as<float>(), stream);
    DecodeSchedule planned = schedule;
    planned.device.planned_ahead = true;
    return planned;
  }
#else
  (void)stream;
#endif
  detail::unsupported_device(kOp, device);
}

}  // namespace mlakit::ops
