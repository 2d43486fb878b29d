// Host-side plan of one decode launch: the CUDA-specific checks, the arguments of the plan, decode
// and combine kernels, the configuration (cache format, MMA element type, rows per CTA) and the
// grids. launch.cu launches it; tests/cuda/decode_emulated_test.cpp runs it through the kernel
// source on the CPU.
#pragma once

#include <cstdint>

#include "core/decode_problem.hpp"
#include "cuda/decode/sm90/params.cuh"
#include "mlakit/plan.hpp"

namespace mlakit::cuda::decode_sm90 {

// Launch order on the caller's stream: the plan kernel (one CTA), the decode kernel, then the
// combine when the schedule can split a request.
struct LaunchPlan {
  PlanParams plan;
  DecodeKernelParams decode;
  CombineParams combine;  // used when combine_ctas > 0
  CacheFormat format;
  bool bf16_mma = true;       // MMA element type: bf16, else f16
  bool raw_e4m3 = false;      // fp8 q over fp8_e4m3: RawE4m3Mma (f16 MMAs on the raw tiles)
  bool raw_e4m3_q16 = false;  // 16-bit q over fp8_e4m3, 16 rows: RawE4m3Q16Mma (raw tiles)
  bool raw_ds_mla = false;    // 16-bit q over fp8_ds_mla, 16 rows: RawDsMlaMma (raw tiles)
  int rows_per_cta = 16;      // 16 or 64 (tile_shape.hpp)
  int64_t decode_ctas = 0;    // 1-D grid of the decode kernel (parts x row tiles); 0: nothing to do
  int64_t combine_ctas = 0;   // 1-D grid of the combine (combine.cuh); 0: no combine
  bool combine_by_warps = false;  // a warp per (split request, row), else a CTA per row slice
};

// Throws kUnsupported / kInvalidArgument for what the kernel cannot serve (cuda/decode/decode.hpp).
LaunchPlan plan_launch(const DecodeProblem& problem, const DecodeSchedule& schedule);

}  // namespace mlakit::cuda::decode_sm90
