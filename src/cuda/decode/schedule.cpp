// Schedule of the CUDA decode (schedule.hpp).
#include "cuda/decode/schedule.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <limits>

#include "core/check.hpp"
#include "cuda/decode/tile_shape.hpp"

namespace mlakit::cuda {

using detail::require;

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Checks the shape of a device schedule and returns its bounds (naming `op` in messages).
WorkPlanBounds checked_bounds(const DeviceDecodeSchedule& d, const char* op) {
  require(d.batch >= 0 && d.s_q >= 1 && d.num_heads >= 1 && d.max_seq_len >= 0 &&
              d.max_seq_len <= kInt32Max,
          ErrorCode::kInvalidArgument, op,
          ": a CUDA decode schedule needs batch >= 0, s_q >= 1, num_heads >= 1 and max_seq_len in "
          "[0, 2^31 - 1], got batch ",
          d.batch, ", s_q ", d.s_q, ", num_heads ", d.num_heads, ", max_seq_len ", d.max_seq_len);
  require(d.num_parts >= 1 && d.num_parts <= kMaxDecodeParts, ErrorCode::kInvalidArgument, op,
          ": a CUDA decode schedule needs num_parts in [1, ", kMaxDecodeParts, "], got ",
          d.num_parts);
  // Row indices are int32 on the device; checked first, so that the bounds' products (batch times
  // at most kMaxRequestSegments) cannot overflow int64.
  int64_t request_rows = 0, batch_rows = 0;
  require(!__builtin_mul_overflow(d.s_q, d.num_heads, &request_rows) &&
              !__builtin_mul_overflow(d.batch, request_rows, &batch_rows) &&
              request_rows <= kInt32Max && batch_rows <= kInt32Max,
          ErrorCode::kInvalidArgument, op, ": batch ", d.batch, " x s_q ", d.s_q, " x num_heads ",
          d.num_heads, " query rows exceed 2^31 - 1; the CUDA decode indexes them with int32");
  const WorkPlanBounds b = work_plan_bounds(d.batch, d.num_parts, d.batch_invariant, d.max_seq_len);
  // Segment and slot indices are int32 on the device.
  require(b.max_segments <= kInt32Max && b.max_partials <= kInt32Max / 4,
          ErrorCode::kInvalidArgument, op, ": batch ", d.batch, " x s_q ", d.s_q, " x num_heads ",
          d.num_heads, " with max_seq_len ", d.max_seq_len, " needs ", b.max_segments,
          " segments; the CUDA decode indexes them with int32");
  return b;
}

}  // namespace

int64_t decode_num_parts(int64_t rows_per_request, int64_t num_sms, int64_t batch,
                         int64_t max_seq_len) {
  constexpr const char* kOp = "decode_num_parts";
  require(rows_per_request >= 1 && num_sms >= 1, ErrorCode::kInvalidArgument, kOp,
          ": rows_per_request and num_sms must be >= 1, got ", rows_per_request, " and ", num_sms);
  require(batch >= 0 && max_seq_len >= 0, ErrorCode::kInvalidArgument, kOp,
          ": batch and max_seq_len must be >= 0, got ", batch, " and ", max_seq_len);
  const int64_t rows_per_cta = decode_rows_per_cta(rows_per_request);
  const int64_t row_tiles = (rows_per_request + rows_per_cta - 1) / rows_per_cta;
  const int64_t filling = std::clamp<int64_t>(num_sms / row_tiles, 1, kMaxDecodeParts);
  // The cost line's largest total (every request at max_seq_len); a part's share of it should pay
  // for at least one segment's fixed cost. Both factors capped at int32: no int64 overflow.
  const int64_t cost = request_cost(false, key_tiles(std::min<int64_t>(max_seq_len, kInt32Max)));
  const int64_t total = std::min<int64_t>(batch, kInt32Max) * cost;
  return std::clamp<int64_t>(total / kSegmentCostTiles, 1, filling);
}

DecodeSchedule device_decode_schedule(int64_t batch, int64_t s_q, int64_t num_heads,
                                      int64_t max_seq_len, int64_t num_parts,
                                      bool batch_invariant) {
  DecodeSchedule s;
  s.kind = DecodeScheduleKind::kDevicePlanned;
  s.device = {batch, s_q, num_heads, max_seq_len, num_parts, batch_invariant};
  const WorkPlanBounds b = checked_bounds(s.device, "device_decode_schedule");
  const int64_t tiles = std::max<int64_t>(1, key_tiles(max_seq_len));
  s.total_splits = b.max_partials;
  s.max_splits = batch == 0        ? 0
                 : batch_invariant ? invariant_piece_target(tiles)
                                   : std::min(num_parts, tiles);
  return s;
}

DecodeSchedule plan_decode_splits_cuda(int64_t batch, int64_t s_q, int64_t num_heads,
                                       int64_t max_seq_len, bool batch_invariant, Device device) {
  constexpr const char* kOp = "plan_decode_splits_cuda";
  require(device.is_cuda(), ErrorCode::kInvalidArgument, kOp,
          ": device must be a CUDA device, got ", device_name(device));
  require(s_q >= 1 && num_heads >= 1, ErrorCode::kInvalidArgument, kOp,
          ": s_q and num_heads must be >= 1, got ", s_q, " and ", num_heads);
  int num_sms = 0;
  const cudaError_t status =
      cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device.index);
  require(status == cudaSuccess, ErrorCode::kBackend, kOp, ": cudaDeviceGetAttribute on ",
          device_name(device), " failed: ", cudaGetErrorString(status));
  return device_decode_schedule(batch, s_q, num_heads, max_seq_len,
                                decode_num_parts(s_q * num_heads, num_sms, batch, max_seq_len),
                                batch_invariant);
}

DevicePlanSizes device_plan_sizes(const DecodeSchedule& schedule, int64_t rows, int64_t value_dim,
                                  const char* op) {
  require(
      schedule.kind == DecodeScheduleKind::kDevicePlanned, ErrorCode::kInvalidArgument, op,
      ": CUDA tensors need a device-planned schedule (plan it with plan_mla_decode for the CUDA "
      "device), got a host-split schedule");
  const DeviceDecodeSchedule& d = schedule.device;
  DevicePlanSizes sizes;
  sizes.bounds = checked_bounds(d, op);
  require(rows == d.s_q * d.num_heads, ErrorCode::kInvalidArgument, op,
          ": the schedule was planned for s_q ", d.s_q, " x num_heads ", d.num_heads, " = ",
          d.s_q * d.num_heads, " query rows per request, got ", rows);
  require(value_dim >= 0, ErrorCode::kInvalidArgument, op, ": kv_lora_rank must be >= 0, got ",
          value_dim);
  // The partial outputs dominate the layout: the bounds above keep every other region below 2^61
  // words (at most 2^29 partials x 2^31 rows of LSEs, 2^31 16-byte records), so a total within
  // 2^62 words of partial outputs is representable.
  const int64_t partial_rows = sizes.bounds.max_partials * rows;
  int64_t partial_words = 0;
  require(!__builtin_mul_overflow(partial_rows, value_dim, &partial_words) &&
              partial_words <= std::numeric_limits<int64_t>::max() / 2,
          ErrorCode::kInvalidArgument, op, ": the split workspace of ", sizes.bounds.max_partials,
          " partials x ", rows, " rows x kv_lora_rank ", value_dim, " values overflows int64");
  sizes.layout = workspace_layout(d.num_parts, sizes.bounds, rows, value_dim);
  return sizes;
}

}  // namespace mlakit::cuda
