// ops::abs_max on the GPU equals the CPU kernel (itself checked against fp64 in
// tests/e2e/kv_scales_test.cpp) on strided views of every float dtype; NaN wins; the layer's
// calculate_kv_scales gives the CPU layer's scales.
#include <gtest/gtest.h>

#include <cmath>

#include "common/test_util.hpp"
#include "gpu_test_util.hpp"
#include "mlakit/attention.hpp"
#include "mlakit/ops.hpp"

namespace mlakit::test {
namespace {

TEST(CudaAbsMax, MatchesTheCpuOnStridedViews) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = make_rng(3100);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const Tensor host = random_tensor(rng, {33, 17, 65}, dtype, 2.0);
    const Tensor dev = to_device(host);
    const TensorView h = host.view().narrow(1, 3, 9).narrow(2, 1, 60);
    const TensorView d = mirror(h, host, dev);
    EXPECT_EQ(ops::abs_max(d), ops::abs_max(h)) << dtype_name(dtype);
    EXPECT_EQ(ops::abs_max(dev), ops::abs_max(host)) << dtype_name(dtype);
  }
  Tensor with_nan = random_tensor(rng, {1000}, DType::kBF16);
  store_float(with_nan.view().data, DType::kBF16, 999, NAN);
  EXPECT_TRUE(std::isnan(ops::abs_max(to_device(with_nan))));
  EXPECT_EQ(ops::abs_max(to_device(Tensor::empty({0}, DType::kF32))), 0.0f);
}

TEST(CudaAbsMax, LayerScalesMatchTheCpuLayer) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = make_rng(3101);
  MlaAttentionConfig cfg;
  cfg.dims = MlaDims{16, 512, 64, 128, 128};
  cfg.scale = 0.1f;
  cfg.act_dtype = DType::kBF16;
  cfg.kv_cache_dtype = KvCacheDType::kFp8E4m3;
  const Tensor w = random_tensor(rng, {16 * 256, 512}, DType::kBF16, 0.044);
  MlaAttention cpu_layer(cfg, w);
  cfg.device = Device::cuda(0);
  MlaAttention gpu_layer(cfg, w);
  const Tensor q = random_tensor(rng, {12, 16, 192}, DType::kBF16);
  const Tensor kv = random_tensor(rng, {12, 576}, DType::kBF16);
  const Tensor q_d = to_device(q), kv_d = to_device(kv);
  const ForwardScales c = cpu_layer.calculate_kv_scales(q, kv.view().narrow(1, 0, 512),
                                                        kv.view().narrow(1, 512, 64), 12);
  const ForwardScales g = gpu_layer.calculate_kv_scales(q_d, kv_d.view().narrow(1, 0, 512),
                                                        kv_d.view().narrow(1, 512, 64), 12);
  EXPECT_EQ(g.k_scale, c.k_scale);
  // The absorbed query is a GEMM on each side (OpenBLAS f32 vs cuBLAS), rounded to bf16.
  EXPECT_NEAR(g.q_scale, c.q_scale, 1e-2 * c.q_scale);
}

}  // namespace
}  // namespace mlakit::test
