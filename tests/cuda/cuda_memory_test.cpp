// Device memory through Tensor; skips cleanly without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "mlakit/types.hpp"

namespace mlakit {
namespace {

bool has_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

TEST(CudaMemory, ZerosRoundTrip) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  Tensor t = Tensor::zeros({3, 5}, DType::kF32, Device::cuda(0));
  std::vector<float> host(15, 1.0f);
  ASSERT_EQ(cudaMemcpy(host.data(), t.view().data, 15 * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (float x : host) EXPECT_EQ(x, 0.0f);
}

}  // namespace
}  // namespace mlakit
