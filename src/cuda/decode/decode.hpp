// CUDA backend of ops::mla_decode (sm90 kernel; docs/kernels/decode_sm90.md).
#pragma once

#include "core/decode_problem.hpp"
#include "mlakit/plan.hpp"
#include "mlakit/types.hpp"

namespace mlakit::cuda {

// Runs an op-validated decode problem whose tensors are on one CUDA device, on `stream`: no host
// synchronization, no allocation, capturable in a CUDA graph. `schedule` must be uniform
// (schedule.hpp); problem.workspace must hold B x S x s_q x N x 513 floats when S > 1. Throws
// kUnsupported for shapes or dtypes the kernel does not implement (L + R other than 512 + 64, an
// f32 cache) and kInvalidArgument for a non-uniform schedule or misaligned tensors. Index contents
// stay on the device and are not checked here: a request whose seq_len is outside
// [0, max_blocks * block_size] or whose keys reach a block id outside [0, num_blocks) gets NaN
// rows.
void mla_decode(const DecodeProblem& problem, const DecodeSchedule& schedule, Stream stream);

}  // namespace mlakit::cuda
