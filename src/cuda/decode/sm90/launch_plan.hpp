// Host-side plan of one decode launch: the CUDA-specific checks, the kernel arguments, the
// configuration (cache format, MMA element type, rows per CTA) and the grids. launch.cu launches
// it; tests/cuda/decode_emulated_test.cpp runs it through the kernel source on the CPU.
#pragma once

#include <cstdint>

#include "core/decode_problem.hpp"
#include "cuda/decode/sm90/params.cuh"
#include "mlakit/plan.hpp"

namespace mlakit::cuda::decode_sm90 {

struct LaunchPlan {
  DecodeKernelParams decode;
  CombineParams combine;  // used when decode.num_splits > 1
  CacheFormat format;
  bool bf16_mma = true;      // MMA element type: bf16, else f16
  int rows_per_cta = 16;     // 16 or 64 (tile_shape.hpp)
  int64_t decode_ctas = 0;   // 1-D grid of the decode kernel; 0: nothing to do
  int64_t combine_ctas = 0;  // 1-D grid of the combine kernel; 0: one split, no combine
};

// Throws kUnsupported / kInvalidArgument for what the kernel cannot serve (cuda/decode/decode.hpp).
LaunchPlan plan_launch(const DecodeProblem& problem, const DecodeSchedule& schedule);

}  // namespace mlakit::cuda::decode_sm90
