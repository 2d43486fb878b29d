// The ceilings `mlakit bench` compares every case with, measured in the same process on the same
// device: memory bandwidth and the GEMM rate of ops::batched_matmul.
#pragma once

#include <string>

#include "mlakit/types.hpp"

namespace mlakit::cli {

struct Ceilings {
  double memory_gbs = 0.0;   // GB/s
  double gemm_gflops = 0.0;  // GFLOP/s
  std::string memory_method;
  std::string gemm_method;
};

// quick: smaller buffers and fewer repetitions.
Ceilings measure_ceilings(Device device, bool quick);

}  // namespace mlakit::cli
