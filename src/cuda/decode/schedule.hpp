// Schedule of the CUDA decode (ops::mla_decode on CUDA tensors): a kDevicePlanned DecodeSchedule
// (mlakit/plan.hpp) that records the shape and the number of parts P. The keys themselves are cut
// at run time on the device, from the device seq_lens (work_plan.hpp, sm90/plan_kernel.cuh), so
// one CUDA graph serves any seq_lens and block tables of the shape it was planned for.
#pragma once

#include <cstdint>

#include "cuda/decode/work_plan.hpp"
#include "mlakit/plan.hpp"
#include "mlakit/types.hpp"

namespace mlakit::cuda {

// Parts per row tile for `batch` requests of `rows_per_request` = s_q * N query rows, every
// seq_len at most max_seq_len, on a GPU with `num_sms` SMs: the grid of parts x row tiles CTAs
// fills the GPU once (one CTA per SM), at least one part and at most kMaxDecodeParts; and no more
// parts than give each a share of at least one segment's fixed cost (kSegmentCostTiles) of the
// batch's largest cost line: below that, more parts add partial rows (written and read back by
// the combine) faster than they take key tiles off a part (B1 s_kv 4096 h_q 128: 33 parts, 2 key
// tiles each, instead of 66 with 1).
int64_t decode_num_parts(int64_t rows_per_request, int64_t num_sms, int64_t batch,
                         int64_t max_seq_len);

// The schedule of B requests of s_q x N query rows, every seq_len at most max_seq_len, over
// `num_parts` parts; batch_invariant cuts each request into pieces that depend on its own length
// only. total_splits = the most partial results, max_splits = the most segments of one request.
DecodeSchedule device_decode_schedule(int64_t batch, int64_t s_q, int64_t num_heads,
                                      int64_t max_seq_len, int64_t num_parts, bool batch_invariant);

// Both steps for `device` (reads its SM count). Host-only; safe to call while a stream captures.
DecodeSchedule plan_decode_splits_cuda(int64_t batch, int64_t s_q, int64_t num_heads,
                                       int64_t max_seq_len, bool batch_invariant, Device device);

// The bounds and the split-workspace layout of a kDevicePlanned schedule for `rows` = s_q * N
// query rows of `value_dim` (L) values. Throws kInvalidArgument, naming `op`, for a schedule that
// device_decode_schedule could not have made or whose rows differ.
struct DevicePlanSizes {
  WorkPlanBounds bounds;
  WorkspaceLayout layout;
};
DevicePlanSizes device_plan_sizes(const DecodeSchedule& schedule, int64_t rows, int64_t value_dim,
                                  const char* op);

}  // namespace mlakit::cuda
