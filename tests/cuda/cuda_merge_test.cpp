// merge_attn_states on the GPU against the fp64 merge of the oracle; skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/test_util.hpp"
#include "mlakit/ops.hpp"
#include "reference/reference.hpp"

namespace mlakit {
namespace {

bool has_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

Tensor to_gpu(const Tensor& host) {
  Tensor d = Tensor::empty(std::span<const int64_t>(host.view().shape, host.view().ndim),
                           host.view().dtype, Device::cuda(0));
  EXPECT_EQ(cudaMemcpy(d.view().data, host.view().data, host.numel() * host.view().element_size(),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  return d;
}

Tensor to_host(const Tensor& dev) {
  Tensor h =
      Tensor::empty(std::span<const int64_t>(dev.view().shape, dev.view().ndim), dev.view().dtype);
  EXPECT_EQ(cudaMemcpy(h.view().data, dev.view().data, dev.numel() * dev.view().element_size(),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  return h;
}

// LSEs with every special case: finite, +inf, -inf, NaN on either side, and both empty.
Tensor special_lse(std::mt19937_64& rng, int64_t heads, int64_t tokens, int salt) {
  Tensor t = test::random_tensor(rng, {heads, tokens}, DType::kF32, 3.0);
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), NAN};
  for (int64_t i = 0; i < t.numel(); ++i)
    if ((i + salt) % 7 == 0) t.data<float>()[i] = specials[(i / 7 + salt) % 3];
  return t;
}

TEST(CudaMerge, MatchesTheOracleForEveryDtypeAndEmptyCase) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  auto rng = test::make_rng(50);
  const int64_t tokens = 77, heads = 5, d = 160;
  for (DType in : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType out_dtype : {DType::kF32, DType::kBF16}) {
      Tensor prefix = test::random_tensor(rng, {tokens, heads, d}, in);
      Tensor suffix = test::random_tensor(rng, {tokens, heads, d}, in);
      Tensor p_lse = special_lse(rng, heads, tokens, 0), s_lse = special_lse(rng, heads, tokens, 3);
      Tensor out = test::nan_tensor({tokens, heads, d}, out_dtype);
      Tensor out_lse = test::nan_tensor({heads, tokens}, DType::kF32);
      Tensor out_d = to_gpu(out), out_lse_d = to_gpu(out_lse);
      ops::merge_attn_states(out_d, out_lse_d.view(), to_gpu(prefix), to_gpu(p_lse), to_gpu(suffix),
                             to_gpu(s_lse));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<double> pl = test::to_doubles(p_lse), sl = test::to_doubles(s_lse);
      for (auto* v : {&pl, &sl})
        for (double& x : *v)
          if (std::isnan(x)) x = -std::numeric_limits<double>::infinity();  // NaN: no keys
      const ref::MergeResult expected =
          ref::merge(test::to_doubles(prefix), pl, test::to_doubles(suffix), sl, tokens, heads, d);
      const test::Tolerance lse_tol{1e-5, 1e-5};  // f32 exp/log of O(10) values
      EXPECT_TRUE(test::all_close(to_host(out_d), expected.out, test::tolerance_for(out_dtype)))
          << dtype_name(in) << " -> " << dtype_name(out_dtype);
      EXPECT_TRUE(test::all_close(to_host(out_lse_d), expected.lse, lse_tol));
    }
  }
}

TEST(CudaMerge, InPlaceOverThePrefixWithPaddedHeads) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  auto rng = test::make_rng(51);
  const int64_t tokens = 9, heads = 3, d = 128, stride = 192;  // padded-V layout (spec F-25)
  Tensor prefix = test::random_tensor(rng, {tokens, heads, stride}, DType::kBF16);
  Tensor suffix = test::random_tensor(rng, {tokens, heads, stride}, DType::kBF16);
  Tensor p_lse = test::random_tensor(rng, {heads, tokens}, DType::kF32);
  Tensor s_lse = test::random_tensor(rng, {heads, tokens}, DType::kF32);
  const ref::MergeResult expected = ref::merge(
      test::to_doubles(prefix.view().narrow(2, 0, d)), test::to_doubles(p_lse),
      test::to_doubles(suffix.view().narrow(2, 0, d)), test::to_doubles(s_lse), tokens, heads, d);
  Tensor prefix_d = to_gpu(prefix), p_lse_d = to_gpu(p_lse);
  Tensor suffix_d = to_gpu(suffix), s_lse_d = to_gpu(s_lse);
  const TensorView view = prefix_d.view().narrow(2, 0, d);
  ops::merge_attn_states(view, p_lse_d.view(), view, p_lse_d, suffix_d.view().narrow(2, 0, d),
                         s_lse_d);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Tensor back = to_host(prefix_d);
  EXPECT_TRUE(test::all_close(back.view().narrow(2, 0, d), expected.out,
                              test::tolerance_for(DType::kBF16)));
  // The padding columns [128, 192) keep the prefix's values.
  EXPECT_TRUE(test::all_close(back.view().narrow(2, d, stride - d),
                              test::to_doubles(prefix.view().narrow(2, d, stride - d)), {0, 0}));
  EXPECT_TRUE(test::all_close(to_host(p_lse_d), expected.lse, {1e-5, 1e-5}));
}

}  // namespace
}  // namespace mlakit
