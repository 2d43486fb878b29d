// ops::check_device_errors on the host side: the CPU has nothing recorded (CPU ops throw at the
// bad index itself); a CPU-only build rejects a CUDA device by name. The GPU behaviour (a bad
// index reported once, then cleared) is tested in tests/cuda (cache write, gathers, prefill,
// graph replay).
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
#endif

}  // namespace
}  // namespace mlakit
