// ops::check_device_errors on the host side: the CPU has nothing recorded (CPU ops throw at the
// bad index itself); a CPU-only build rejects a CUDA device by name, and an op given CUDA tensors
// says the build has no CUDA backend. The GPU behaviour (a bad index reported once, then cleared)
// is tested in tests/cuda (cache write, gathers, prefill, graph replay).
#include <gtest/gtest.h>

#include "common/test_util.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {
namespace {

TEST(DeviceErrors, HostHasNothingToReport) {
  EXPECT_NO_THROW(ops::check_device_errors(Device::cpu()));
  EXPECT_NO_THROW(ops::check_device_errors(Device::cpu(), Stream{}));
}

#ifndef MLAKIT_WITH_CUDA
TEST(DeviceErrors, CpuOnlyBuildRejectsACudaDevice) {
  MLAKIT_EXPECT_THROW_MSG(ops::check_device_errors(Device::cuda(0)),
                          "check_device_errors: cuda:0: mlakit was built without CUDA");
}

TEST(DeviceErrors, CpuOnlyBuildSaysItHasNoCudaBackend) {
  // An op given CUDA tensors: the build has no CUDA backend at all, not an op the backend lacks.
  float value = 0.0f;
  TensorView x = TensorView::strided(&value, DType::kF32, {1}, {1});
  x.device = Device::cuda(0);
  try {
    ops::abs_max(x);
    ADD_FAILURE() << "abs_max on cuda:0 did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_STREQ(e.what(),
                 "abs_max: no kernel for cuda:0 in this build (mlakit was built without CUDA)");
  }
}
#endif

}  // namespace
}  // namespace mlakit
