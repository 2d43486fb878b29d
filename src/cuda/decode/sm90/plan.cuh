// The plan kernel of the sm90 decode: one CTA that reads the device seq_lens and writes the work
// plan (work_plan.hpp) into the split workspace, on the decode's stream right before the decode
// kernel. Host-side declaration; the device code is plan_kernel.cuh.
#pragma once

#include <cuda_runtime.h>

#include "cuda/decode/sm90/params.cuh"

namespace mlakit::cuda::decode_sm90 {

// Threads of the one plan CTA: each handles every 256th request and every 256th part; its scans
// run over 256 values per step (the emulation test models CTAs of 256 threads).
inline constexpr int kPlanThreads = 256;

// Launches the plan kernel (one CTA); the launcher checks for errors.
void launch_plan_kernel(const PlanParams& params, cudaStream_t stream);

}  // namespace mlakit::cuda::decode_sm90
