// ops::abs_max and MlaAttention::calculate_kv_scales (spec A.2, F-36) against maxima computed
// here in fp64 from the inputs and the layer's kv_b_proj.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/test_util.hpp"
#include "mlakit/attention.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/step.hpp"

namespace mlakit::test {
namespace {

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

TEST(AbsMax, StridedViewsOfEveryFloatDtype) {
  auto rng = make_rng(3000);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const Tensor t = random_tensor(rng, {5, 7, 9}, dtype, 3.0);
    // Every other row of the middle dimension, columns 2..7: a strided view.
    const TensorView v = t.view().narrow(2, 2, 6);
    TensorView strided = v;
    strided.shape[1] = 4;
    strided.strides[1] = v.strides[1] * 2;
    EXPECT_EQ(ops::abs_max(strided), static_cast<float>(max_abs(to_doubles(strided))))
        << dtype_name(dtype);
    EXPECT_EQ(ops::abs_max(t), static_cast<float>(max_abs(to_doubles(t))));
  }
  const Tensor empty = Tensor::empty({0, 4}, DType::kF32);
  EXPECT_EQ(ops::abs_max(empty), 0.0f);
  Tensor with_nan = random_tensor(rng, {3, 4}, DType::kBF16);
  store_float(with_nan.view().data, DType::kBF16, 7, NAN);
  EXPECT_TRUE(std::isnan(ops::abs_max(with_nan)));
  MLAKIT_EXPECT_THROW_MSG(ops::abs_max(Tensor::empty({3}, DType::kI32)), "x");
}

class KvScales : public ::testing::Test {
 protected:
  void SetUp() override {
    dims_ = MlaDims{3, 32, 8, 16, 16};
    cfg_.dims = dims_;
    cfg_.scale = 0.25f;
    cfg_.act_dtype = DType::kF32;
    cfg_.kv_cache_dtype = KvCacheDType::kFp8E4m3;
    auto rng = make_rng(3001);
    weight_ = random_tensor(rng, {dims_.num_heads * dims_.kv_b_out_dim(), dims_.kv_lora_rank},
                            DType::kF32, 0.2);
    layer_ = std::make_unique<MlaAttention>(cfg_, weight_);
    q_ = random_tensor(rng, {kRows, dims_.num_heads, dims_.qk_head_dim()}, DType::kF32);
    kv_c_ = random_tensor(rng, {kRows, dims_.kv_lora_rank}, DType::kF32);
    k_pe_ = random_tensor(rng, {kRows, dims_.qk_rope_head_dim}, DType::kF32);
  }

  // max |[q_nope W_UK | q_pe]| over the first `tokens` rows, in fp64 from kv_b_proj.
  double absorbed_q_max(int64_t tokens) const {
    const MlaDims& d = dims_;
    const std::vector<double> w = to_doubles(weight_), q = to_doubles(q_);
    const int64_t l = d.kv_lora_rank, p = d.qk_nope_head_dim, dqk = d.qk_head_dim();
    double m = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < d.num_heads; ++h) {
        const double* qh = &q[(t * d.num_heads + h) * dqk];
        for (int64_t i = 0; i < l; ++i) {
          double acc = 0;  // k_nope rows of head h in kv_b_proj: [h (P + V) + j, :]
          for (int64_t j = 0; j < p; ++j) acc += qh[j] * w[(h * d.kv_b_out_dim() + j) * l + i];
          m = std::max(m, std::fabs(acc));
        }
        for (int64_t i = p; i < dqk; ++i) m = std::max(m, std::fabs(qh[i]));
      }
    }
    return m;
  }

  static constexpr int64_t kRows = 6;
  MlaDims dims_;
  MlaAttentionConfig cfg_;
  Tensor weight_, q_, kv_c_, k_pe_;
  std::unique_ptr<MlaAttention> layer_;
};

TEST_F(KvScales, KScaleCoversKPeAndQScaleTheAbsorbedQuery) {
  // A k_pe value larger than every kv_c value: vLLM's k_scale (kv_c only) would saturate it.
  store_float(k_pe_.view().data, DType::kF32, 3, 40.0f);
  const int64_t tokens = 5;  // the sixth row must not count
  store_float(kv_c_.view().data, DType::kF32, 5 * dims_.kv_lora_rank + 1, 1000.0f);
  const ForwardScales s = layer_->calculate_kv_scales(q_, kv_c_, k_pe_, tokens);
  EXPECT_FLOAT_EQ(s.k_scale, 40.0f / 200.0f);
  EXPECT_NEAR(s.q_scale, absorbed_q_max(tokens) / 200.0, 1e-5 * s.q_scale);
  // k_pe in vLLM's [T, 1, R] form gives the same.
  const TensorView k_pe3 =
      TensorView::strided(k_pe_.view().data, DType::kF32, {kRows, 1, dims_.qk_rope_head_dim},
                          {dims_.qk_rope_head_dim, 0, 1});
  EXPECT_EQ(layer_->calculate_kv_scales(q_, kv_c_, k_pe3, tokens).k_scale, s.k_scale);
}

TEST_F(KvScales, ZerosGiveOneAndNonFiniteInputsAreRejected) {
  const Tensor zq = Tensor::zeros({kRows, dims_.num_heads, dims_.qk_head_dim()}, DType::kF32);
  const Tensor zkv = Tensor::zeros({kRows, dims_.kv_lora_rank}, DType::kF32);
  const Tensor zpe = Tensor::zeros({kRows, dims_.qk_rope_head_dim}, DType::kF32);
  const ForwardScales s = layer_->calculate_kv_scales(zq, zkv, zpe, kRows);
  EXPECT_EQ(s.q_scale, 1.0f);
  EXPECT_EQ(s.k_scale, 1.0f);
  store_float(k_pe_.view().data, DType::kF32, 2, INFINITY);
  MLAKIT_EXPECT_THROW_MSG(layer_->calculate_kv_scales(q_, kv_c_, k_pe_, kRows),
                          "[kv_c_normed | k_pe] holds NaN or infinity");
  MLAKIT_EXPECT_THROW_MSG(layer_->calculate_kv_scales(q_, kv_c_, k_pe_, kRows + 1),
                          "q.shape[0] must be at least 7");
  MLAKIT_EXPECT_THROW_MSG(layer_->calculate_kv_scales(q_, kv_c_, k_pe_, 0), "num_tokens");
}

TEST_F(KvScales, TinyInputsGiveAtLeastFltMinAndTheNextFp8ForwardRuns) {
  // Maxima of 1e-37: / 200 is 5e-40, a subnormal whose reciprocal is infinite (the fp8 q
  // quantization then refused q_scale). Both scales are floored to FLT_MIN instead.
  const float tiny = 1e-37f;
  const Tensor zq = Tensor::zeros({kRows, dims_.num_heads, dims_.qk_head_dim()}, DType::kF32);
  const Tensor zkv = Tensor::zeros({kRows, dims_.kv_lora_rank}, DType::kF32);
  const Tensor zpe = Tensor::zeros({kRows, dims_.qk_rope_head_dim}, DType::kF32);
  // The absorbed query's maximum is q_pe's: q_nope is zero.
  store_float(zq.view().data, DType::kF32, dims_.qk_nope_head_dim, -tiny);
  store_float(zpe.view().data, DType::kF32, 1, tiny);
  const ForwardScales s = layer_->calculate_kv_scales(zq, zkv, zpe, kRows);
  EXPECT_EQ(s.q_scale, FLT_MIN);
  EXPECT_EQ(s.k_scale, FLT_MIN);
  // 400 FLT_MIN / 200 = 2 FLT_MIN, a normal float: the floor leaves it alone.
  store_float(zpe.view().data, DType::kF32, 1, 400 * FLT_MIN);
  EXPECT_FLOAT_EQ(layer_->calculate_kv_scales(zq, zkv, zpe, kRows).k_scale, 2 * FLT_MIN);

  // One decode token of a one-token request, with the floored scales, through an fp8 cache.
  constexpr int64_t kBlockSize = 4;  // one block holds the request's single key
  const std::vector<int32_t> qsl = {0, 1}, seq_lens = {1};
  Tensor table = Tensor::zeros({1, 1}, DType::kI32);
  Tensor slots = Tensor::zeros({1}, DType::kI64);
  Tensor cache = Tensor::zeros({1, kBlockSize, dims_.entry_dim()}, DType::kFp8E4m3);
  Tensor out = nan_tensor({1, dims_.num_heads * dims_.v_head_dim}, DType::kF32);
  MlaAttentionConfig cfg = cfg_;
  cfg.block_size = kBlockSize;
  MlaAttention layer(cfg, weight_);
  ForwardBatch batch;
  batch.query_start_loc = qsl;
  batch.seq_lens = seq_lens;
  batch.num_actual_tokens = 1;
  batch.block_table = table;
  batch.slot_mapping = slots;
  store_float(zpe.view().data, DType::kF32, 1, tiny);
  const ForwardScales tiny_scales = layer.calculate_kv_scales(zq, zkv, zpe, 1);
  EXPECT_EQ(tiny_scales.q_scale, FLT_MIN);
  layer.forward(zq.view().narrow(0, 0, 1), zkv.view().narrow(0, 0, 1), zpe.view().narrow(0, 0, 1),
                cache, &batch, out, tiny_scales);
  for (double v : to_doubles(out)) EXPECT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace mlakit::test
