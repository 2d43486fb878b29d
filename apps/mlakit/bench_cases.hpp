// The cases of `mlakit bench`: the decode kernel (ops::mla_decode), the prefill kernel
// (ops::mla_prefill) and whole layer steps (plan_step + MlaAttention::forward), each with its work
// model (FLOPs and bytes) for the roofline.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mlakit/config.hpp"
#include "mlakit/types.hpp"

namespace mlakit::cli {

enum class BenchKind { kDecode, kPrefill, kForwardDecode, kForwardPrefill };
const char* bench_kind_name(BenchKind kind);  // "decode", "prefill", "forward"

struct BenchCase {
  BenchKind kind;
  int64_t batch = 1;   // requests (prefill: 1)
  int64_t tokens = 0;  // decode: context length s_kv of every request; prefill: prompt tokens
  std::string label() const;
};

struct BenchSetup {
  Device device;
  MlaDims dims;
  float scale = 0.0f;
  DType dtype = DType::kBF16;
  int reps = 3;
};

struct BenchResult {
  BenchCase bench_case;
  double seconds = 0.0;  // median of the timed runs
  double flops = 0.0;    // useful floating-point operations of one run
  double bytes = 0.0;    // bytes one run must move at least (inputs read, outputs written)
};

// The grid: --quick is small enough for a 2-core CPU in well under a minute, the full grid
// covers the serving range of the device (GPU sizes are larger).
std::vector<BenchCase> bench_grid(Device device, bool quick);

BenchResult run_bench_case(const BenchSetup& setup, const BenchCase& bench_case);

}  // namespace mlakit::cli
