// CUDA backend of ops::mla_decode (sm90 kernels; docs/kernels/decode_sm90.md).
#pragma once

#include "core/decode_problem.hpp"
#include "mlakit/plan.hpp"
#include "mlakit/types.hpp"

namespace mlakit::cuda {

// Runs an op-validated decode problem whose tensors are on one CUDA device, on `stream`: the plan
// kernel, the decode kernel and (when a request can be split) the combine. No host
// synchronization, no allocation, capturable in a CUDA graph. `schedule` must be kDevicePlanned for
// this shape (schedule.hpp); problem.workspace must hold the schedule's workspace
// (ops::mla_decode_workspace_elems) and start on a 16-byte boundary. Throws kUnsupported for shapes
// or dtypes the kernel does not implement (L + R other than 512 + 64, an f32 cache) and
// kInvalidArgument for another schedule or misaligned tensors. Index contents stay on the device
// and are not checked here: a request whose seq_len is outside [0, min(max_blocks * block_size,
// schedule max_seq_len)] or whose keys reach a block id outside [0, num_blocks) gets NaN rows and
// sets kDecodeBadIndex in the device error word.
void mla_decode(const DecodeProblem& problem, const DecodeSchedule& schedule, Stream stream);

// Launches the plan kernel alone: the work plan of a kDevicePlanned `schedule` for the device
// seq_lens (i32 [B]; lengths beyond block_table's width x block_size, block_table i32 [B, width],
// are planned as bad, as mla_decode does) into `workspace` (the schedule's split workspace), on
// `stream`. mla_decode with the schedule marked planned_ahead then skips planning.
void mla_decode_plan_ahead(const DecodeSchedule& schedule, const TensorView& block_table,
                           const TensorView& seq_lens, int64_t block_size, float* workspace,
                           Stream stream);

}  // namespace mlakit::cuda
