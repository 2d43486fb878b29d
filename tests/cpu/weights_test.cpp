// absorb_kv_b_proj: the C.3 permutation of kv_b_proj.weight, rounding to the activation dtype,
// fp8 128x128 block dequantization (F-40), the absorbed-form identity and bad arguments.
#include "mlakit/weights.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <vector>

#include "common/fp8_reference.hpp"
#include "common/test_util.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/error.hpp"

namespace mlakit {
namespace {

MlaDims make_dims(int64_t heads, int64_t nope, int64_t v, int64_t latent) {
  MlaDims dims;
  dims.num_heads = heads;
  dims.qk_nope_head_dim = nope;
  dims.v_head_dim = v;
  dims.kv_lora_rank = latent;
  return dims;
}

// Checks the three outputs against the dequantized weight `expected` [N * (P + V), L] (already
// rounded to act_dtype): kv_b_proj is it, and W_UK_T / W_UV follow spec C.3 element by element.
void expect_layout(const AbsorbedWeights& out, const std::vector<double>& expected,
                   const MlaDims& dims, DType act_dtype) {
  const int64_t N = dims.num_heads, P = dims.qk_nope_head_dim, V = dims.v_head_dim;
  const int64_t L = dims.kv_lora_rank, rows = N * (P + V);
  for (const Tensor* t : {&out.kv_b_proj, &out.w_uk_t, &out.w_uv}) {
    EXPECT_EQ(t->view().dtype, act_dtype);
    EXPECT_TRUE(t->view().is_contiguous());
    EXPECT_TRUE(t->view().device.is_cpu());
  }
  ASSERT_EQ(out.kv_b_proj.view().to_string(),
            TensorView::contiguous(nullptr, act_dtype, {rows, L}).to_string());
  ASSERT_EQ(out.w_uk_t.view().to_string(),
            TensorView::contiguous(nullptr, act_dtype, {N, P, L}).to_string());
  ASSERT_EQ(out.w_uv.view().to_string(),
            TensorView::contiguous(nullptr, act_dtype, {N, L, V}).to_string());
  int64_t mismatches = 0;
  const auto expect_eq = [&](double got, double want, const char* what, int64_t i, int64_t j,
                             int64_t k) {
    if (got == want) return;
    if (mismatches++ < 5)
      ADD_FAILURE() << what << "[" << i << ", " << j << ", " << k << "] = " << got << ", expected "
                    << want;
  };
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t l = 0; l < L; ++l)
      expect_eq(test::element(out.kv_b_proj, {r, l}), expected[r * L + l], "kv_b_proj", r, l, 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t p = 0; p < P; ++p)  // W_UK_T[n, p, l] = W_UK[l, n, p] = weight[n(P+V) + p, l]
        expect_eq(test::element(out.w_uk_t, {n, p, l}), expected[(n * (P + V) + p) * L + l],
                  "w_uk_t", n, p, l);
      for (int64_t v = 0; v < V; ++v)  // W_UV[n, l, v] = weight[n(P+V) + P + v, l]
        expect_eq(test::element(out.w_uv, {n, l, v}), expected[(n * (P + V) + P + v) * L + l],
                  "w_uv", n, l, v);
    }
  EXPECT_EQ(mismatches, 0);
}

// A weight whose rows are `pad` elements longer than L (a strided view), random in `dtype`.
struct Weight {
  Tensor storage;
  TensorView view;
};
Weight random_weight(std::mt19937_64& rng, int64_t rows, int64_t cols, DType dtype, int64_t pad) {
  Tensor storage = test::random_tensor(rng, {rows, cols + pad}, dtype);
  const TensorView view = storage.view().narrow(1, 0, cols);
  return {storage, view};
}

TEST(AbsorbKvBProj, PermutesSixteenAndThirtyTwoBitWeightsExactly) {
  auto rng = test::make_rng(201);
  const MlaDims dims = make_dims(3, 5, 4, 7);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Weight w = random_weight(rng, 3 * (5 + 4), 7, dtype, 3);
    const AbsorbedWeights out = absorb_kv_b_proj(w.view, std::nullopt, dims, dtype);
    expect_layout(out, test::to_doubles(w.view), dims, dtype);
  }
}

TEST(AbsorbKvBProj, RoundsToTheActivationDtype) {
  auto rng = test::make_rng(202);
  const MlaDims dims = make_dims(2, 6, 3, 9);
  const Weight w = random_weight(rng, 2 * (6 + 3), 9, DType::kF32, 0);
  for (DType act : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(act));
    std::vector<double> expected = test::to_doubles(w.view);
    int64_t changed = 0;
    for (double& x : expected) {
      const double rounded = round_to_dtype(static_cast<float>(x), act);
      changed += rounded != x;
      x = rounded;
    }
    EXPECT_GT(changed, 0) << "random f32 values must need rounding";
    expect_layout(absorb_kv_b_proj(w.view, std::nullopt, dims, act), expected, dims, act);
  }
  const Weight b = random_weight(rng, 2 * (6 + 3), 9, DType::kBF16, 1);  // widening is exact
  expect_layout(absorb_kv_b_proj(b.view, std::nullopt, dims, DType::kF32), test::to_doubles(b.view),
                dims, DType::kF32);
}

// fp8 weights with 128x128 block scales, in shapes that are not multiples of 128 (312 rows,
// 200 columns: partial last blocks both ways) and DeepSeek's (N 3 of 128 + 128, L 512).
TEST(AbsorbKvBProj, DequantizesFp8BlockScales) {
  auto rng = test::make_rng(203);
  std::uniform_int_distribution<int> code(0, 255);
  std::uniform_real_distribution<double> log2_scale(-10, 2);
  struct Case {
    MlaDims dims;
    DType weight_dtype;
    DType act;
    bool transposed_scales;
  };
  const std::vector<Case> cases = {
      {make_dims(3, 64, 40, 200), DType::kFp8E4m3, DType::kBF16, false},
      {make_dims(3, 64, 40, 200), DType::kU8, DType::kF32, true},
      {make_dims(3, 128, 128, 512), DType::kFp8E4m3, DType::kF32, false},
      {make_dims(1, 100, 29, 130), DType::kU8, DType::kF16, true}};
  for (const Case& c : cases) {
    const MlaDims& d = c.dims;
    const int64_t rows = d.num_heads * (d.qk_nope_head_dim + d.v_head_dim), cols = d.kv_lora_rank;
    const int64_t block_rows = (rows + 127) / 128, block_cols = (cols + 127) / 128;  // 128: block
    SCOPED_TRACE(::testing::Message() << "weight [" << rows << ", " << cols << "] "
                                      << dtype_name(c.weight_dtype) << " -> " << dtype_name(c.act));
    Tensor weight = Tensor::empty({rows, cols}, c.weight_dtype);
    for (int64_t i = 0; i < weight.numel(); ++i) {
      int byte = code(rng);
      if ((byte & 0x7f) == 0x7f) byte ^= 1;  // no NaN codes: every value must compare equal
      weight.data<uint8_t>()[i] = static_cast<uint8_t>(byte);
    }
    // Scales stored transposed (column-major) in some cases: strides must be honoured.
    Tensor scale_storage = Tensor::empty({block_rows * block_cols}, DType::kF32);
    const TensorView scales = c.transposed_scales
                                  ? TensorView::strided(scale_storage.view().data, DType::kF32,
                                                        {block_rows, block_cols}, {1, block_rows})
                                  : TensorView::contiguous(scale_storage.view().data, DType::kF32,
                                                           {block_rows, block_cols});
    for (int64_t i = 0; i < scale_storage.numel(); ++i)
      scale_storage.data<float>()[i] = static_cast<float>(std::exp2(log2_scale(rng)) * 1.37);

    std::vector<double> expected(rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t l = 0; l < cols; ++l) {
        const double value = test::e4m3_value(weight.data<uint8_t>()[r * cols + l]) *
                             test::element(scales, {r / 128, l / 128});
        // The product is formed in f32 (rounded once), then rounded to the activation dtype.
        expected[r * cols + l] = round_to_dtype(static_cast<float>(value), c.act);
      }
    expect_layout(absorb_kv_b_proj(weight, scales, d, c.act), expected, d, c.act);
  }
}

// Spec C.3 from the produced tensors, in fp64: for a query q_nope of head n and a latent kv_c,
// (q_nope . W_UK_T[n]) . kv_c equals q_nope . k_nope with k_nope = kv_b_proj(kv_c)[n, :P] (the
// MHA form, from the input weight), and o_lat . W_UV[n] equals the V rows of kv_b_proj applied
// to o_lat.
TEST(AbsorbKvBProj, AbsorbedFormMatchesUpProjection) {
  auto rng = test::make_rng(204);
  const MlaDims dims = make_dims(3, 16, 8, 32);
  const int64_t N = 3, P = 16, V = 8, L = 32;
  const Weight w = random_weight(rng, N * (P + V), L, DType::kF32, 0);
  const AbsorbedWeights out = absorb_kv_b_proj(w.view, std::nullopt, dims, DType::kF32);
  const std::vector<double> weight = test::to_doubles(w.view);
  const std::vector<double> w_uk_t = test::to_doubles(out.w_uk_t);
  const std::vector<double> w_uv = test::to_doubles(out.w_uv);
  std::normal_distribution<double> normal;
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<double> q(P), kv_c(L);
    for (double& x : q) x = normal(rng);
    for (double& x : kv_c) x = normal(rng);
    for (int64_t n = 0; n < N; ++n) {
      double absorbed = 0, mha = 0, magnitude = 0;
      for (int64_t l = 0; l < L; ++l) {
        double ql = 0;  // (q_nope . W_UK_T[n])[l]
        for (int64_t p = 0; p < P; ++p) ql += q[p] * w_uk_t[(n * P + p) * L + l];
        absorbed += ql * kv_c[l];
      }
      for (int64_t p = 0; p < P; ++p) {
        double k_nope = 0;  // kv_b_proj(kv_c) = weight @ kv_c, row n (P + V) + p
        for (int64_t l = 0; l < L; ++l) {
          k_nope += weight[(n * (P + V) + p) * L + l] * kv_c[l];
          magnitude += std::fabs(q[p] * weight[(n * (P + V) + p) * L + l] * kv_c[l]);
        }
        mha += q[p] * k_nope;
      }
      EXPECT_NEAR(absorbed, mha, 1e-12 * magnitude) << "head " << n;
      for (int64_t v = 0; v < V; ++v) {
        double up = 0, from_weight = 0;  // kv_c plays o_lat here
        for (int64_t l = 0; l < L; ++l) {
          up += kv_c[l] * w_uv[(n * L + l) * V + v];
          from_weight += weight[(n * (P + V) + P + v) * L + l] * kv_c[l];
        }
        EXPECT_NEAR(up, from_weight, 1e-12 * L) << "head " << n << " v " << v;
      }
    }
  }
}

TEST(AbsorbKvBProj, RejectsBadArguments) {
  const MlaDims dims = make_dims(2, 4, 3, 5);  // weight [14, 5]
  const Tensor weight = Tensor::zeros({14, 5}, DType::kBF16);
  const Tensor fp8 = Tensor::zeros({14, 5}, DType::kFp8E4m3);
  const Tensor scales = Tensor::zeros({1, 1}, DType::kF32);

  MLAKIT_EXPECT_THROW_MSG(
      absorb_kv_b_proj(Tensor::zeros({14, 6}, DType::kBF16), std::nullopt, dims, DType::kBF16),
      "absorb_kv_b_proj: kv_b_proj_weight must have shape [N * (P + V), L] = [14, 5] (N 2, P 4, V "
      "3, L 5), "
      "got [14, 6]");
  MLAKIT_EXPECT_THROW_MSG(
      absorb_kv_b_proj(Tensor::zeros({14, 5, 1}, DType::kBF16), std::nullopt, dims, DType::kBF16),
      "got [14, 5, 1]");
  MLAKIT_EXPECT_THROW_MSG(absorb_kv_b_proj(weight, std::nullopt, dims, DType::kFp8E4m3),
                          "absorb_kv_b_proj: act_dtype must be f32, f16 or bf16, got fp8_e4m3");
  MLAKIT_EXPECT_THROW_MSG(
      absorb_kv_b_proj(Tensor::zeros({14, 5}, DType::kI32), std::nullopt, dims, DType::kBF16),
      "absorb_kv_b_proj: kv_b_proj_weight must have dtype f32 or f16 or bf16 or fp8_e4m3 or u8, "
      "got i32");
  MLAKIT_EXPECT_THROW_MSG(absorb_kv_b_proj(fp8, std::nullopt, dims, DType::kBF16),
                          "absorb_kv_b_proj: kv_b_proj_scale_inv (f32 [1, 1]) is required for an "
                          "fp8 kv_b_proj_weight");
  MLAKIT_EXPECT_THROW_MSG(
      absorb_kv_b_proj(weight, scales.view(), dims, DType::kBF16),
      "absorb_kv_b_proj: kv_b_proj_scale_inv given for a non-fp8 kv_b_proj_weight (bf16)");
  MLAKIT_EXPECT_THROW_MSG(
      absorb_kv_b_proj(fp8, Tensor::zeros({2, 1}, DType::kF32).view(), dims, DType::kBF16),
      "absorb_kv_b_proj: kv_b_proj_scale_inv must have shape [1, 1] (one scale per 128x128 block "
      "of "
      "a [14, 5] kv_b_proj_weight), got [2, 1]");
  MLAKIT_EXPECT_THROW_MSG(
      absorb_kv_b_proj(fp8, Tensor::zeros({1, 1}, DType::kBF16).view(), dims, DType::kBF16),
      "absorb_kv_b_proj: kv_b_proj_scale_inv must have dtype f32, got bf16");
  MlaDims bad_dims = dims;
  bad_dims.num_heads = 0;
  MLAKIT_EXPECT_THROW_MSG(absorb_kv_b_proj(weight, std::nullopt, bad_dims, DType::kBF16),
                          "num_heads must be > 0, got 0");
  TensorView device_weight = weight.view();
  device_weight.device = Device::cuda(0);
  MLAKIT_EXPECT_THROW_MSG(
      absorb_kv_b_proj(device_weight, std::nullopt, dims, DType::kBF16),
      "absorb_kv_b_proj: kv_b_proj_weight must be a host (cpu) tensor, got one on cuda:0");
  TensorView no_data = weight.view();
  no_data.data = nullptr;
  MLAKIT_EXPECT_THROW_MSG(absorb_kv_b_proj(no_data, std::nullopt, dims, DType::kBF16),
                          "weight has no data pointer");
#if !defined(MLAKIT_WITH_CUDA)  // with CUDA the results go to the device instead
  try {
    absorb_kv_b_proj(weight, std::nullopt, dims, DType::kBF16, Device::cuda(0));
    ADD_FAILURE() << "placing the weights on cuda:0 must throw in a CPU-only build";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
  }
#endif
}

// A NaN, infinite, zero or negative block scale would spoil every output of the layer: each is
// rejected, naming the block (its index and the weight rows and columns it scales).
TEST(AbsorbKvBProj, RejectsBadBlockScalesNamingTheBlock) {
  const MlaDims dims = make_dims(2, 100, 60, 200);  // weight [320, 200]: 3 x 2 blocks of 128x128
  const Tensor fp8 = Tensor::zeros({320, 200}, DType::kFp8E4m3);
  for (const float bad : {std::nanf(""), INFINITY, -INFINITY, 0.0f, -0.5f}) {
    SCOPED_TRACE(testing::Message() << "scale " << bad);
    const Tensor scales = test::tensor_from({1, 1, 1, 1, 1, 1}, {3, 2}, DType::kF32);
    scales.data<float>()[2 * 2 + 1] = bad;  // block [2, 1]: rows [256, 320), columns [128, 200)
    std::ostringstream shown;
    shown << bad;
    MLAKIT_EXPECT_THROW_MSG(absorb_kv_b_proj(fp8, scales.view(), dims, DType::kBF16),
                            "absorb_kv_b_proj: kv_b_proj_scale_inv[2, 1] must be finite and > 0 "
                            "(the scale of kv_b_proj_weight rows [256, 320), columns [128, 200)), "
                            "got " +
                                shown.str());
  }
  // Scales [3, 2] viewed in a [3, 4] buffer: a bad value outside the view is never read, one
  // inside it is found at its strided position.
  const Tensor wide = test::tensor_from(std::vector<double>(12, 1.0), {3, 4}, DType::kF32);
  const TensorView strided = wide.view().narrow(1, 0, 2);
  wide.data<float>()[1 * 4 + 3] = std::nanf("");
  EXPECT_NO_THROW(absorb_kv_b_proj(fp8, strided, dims, DType::kBF16));
  wide.data<float>()[2 * 4 + 1] = 0.0f;
  MLAKIT_EXPECT_THROW_MSG(absorb_kv_b_proj(fp8, strided, dims, DType::kBF16),
                          "kv_b_proj_scale_inv[2, 1] must be finite and > 0");
}

}  // namespace
}  // namespace mlakit
