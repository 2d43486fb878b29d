// ops::scaled_fp8_quant (static per-tensor, spec D.13 / F-37): exact bytes against an independent
// nearest-e4m3 search (common/fp8_reference.hpp), the x * (1 / scale) rounding, saturation,
// strides and input validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/fp8_reference.hpp"
#include "common/test_util.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {
namespace {

// What the op must produce: the f32 product of x and the f32 reciprocal, then nearest e4m3.
uint8_t expected_byte(float x, float scale) {
  const float inv = 1.0f / scale;
  return test::e4m3_nearest(static_cast<double>(x * inv));
}

TEST(ScaledFp8Quant, MatchesNearestE4m3ExactlyForEveryDtype) {
  uint64_t stream = 1;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (auto [tokens, hidden] : {std::pair<int64_t, int64_t>{1, 17}, {7, 1024}, {3, 1025}}) {
      for (float scale : {1.0f, 0.37f, 3.0f}) {
        auto rng = test::make_rng(stream++);
        // Wide magnitudes: saturating, normal and subnormal e4m3 codes all occur.
        const Tensor x = test::random_tensor(rng, {tokens, hidden}, dtype, 60.0);
        const Tensor out = test::nan_tensor({tokens, hidden}, DType::kFp8E4m3);
        ops::scaled_fp8_quant(x, out, scale);
        const std::vector<double> xs = test::to_doubles(x);
        int64_t mismatches = 0;
        for (int64_t i = 0; i < x.numel(); ++i) {
          const uint8_t want = expected_byte(static_cast<float>(xs[i]), scale);
          const uint8_t got = out.data<uint8_t>()[i];
          if (got != want && mismatches++ < 3) {
            ADD_FAILURE() << dtype_name(dtype) << " scale " << scale << " element " << i << " x "
                          << xs[i] << ": got 0x" << std::hex << int(got) << ", want 0x"
                          << int(want);
          }
        }
        EXPECT_EQ(mismatches, 0);
      }
    }
  }
}

TEST(ScaledFp8Quant, MultipliesByTheReciprocalNotDivides) {
  // 0.1708984375 / 7 is exactly the midpoint 0.0244140625 between codes 12 and 13 (ties to even:
  // 12); times the f32 reciprocal of 7 it lands just above the midpoint (code 13).
  const float x = 0.1708984375f, scale = 7.0f;
  ASSERT_EQ(test::e4m3_nearest(x / scale), 12);
  ASSERT_EQ(expected_byte(x, scale), 13);
  const Tensor xt = test::tensor_from({x, -x}, {2}, DType::kF32);
  const Tensor out = Tensor::zeros({2}, DType::kU8);
  ops::scaled_fp8_quant(xt, out, scale);
  EXPECT_EQ(out.data<uint8_t>()[0], 13);
  EXPECT_EQ(out.data<uint8_t>()[1], 0x80 | 13);
}

TEST(ScaledFp8Quant, SaturatesAndKeepsNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor x =
      test::tensor_from({1000.0, -1000.0, 448.0, inf, -inf, std::nan(""), 0.0}, {7}, DType::kF32);
  const Tensor out = Tensor::zeros({7}, DType::kFp8E4m3);
  ops::scaled_fp8_quant(x, out, 2.0f);
  const uint8_t* o = out.data<uint8_t>();
  EXPECT_EQ(o[0], 0x7e);  // 500 -> 448
  EXPECT_EQ(o[1], 0xfe);  // -500 -> -448
  EXPECT_EQ(o[2], 0x76);  // 224 = 1.75 * 2^7: exponent 7 + 7 = 14, mantissa 6
  EXPECT_EQ(o[3], 0x7e);
  EXPECT_EQ(o[4], 0xfe);
  EXPECT_EQ(o[5] & 0x7f, 0x7f);
  EXPECT_EQ(o[6], 0x00);
}

TEST(ScaledFp8Quant, HonoursStrides) {
  auto rng = test::make_rng(50);
  const Tensor x = test::random_tensor(rng, {6, 40}, DType::kBF16, 10.0);
  const TensorView xt = x.view().transpose(0, 1);  // [40, 6], inner stride 40
  const Tensor wide = Tensor::zeros({40, 9}, DType::kU8);
  const TensorView out = wide.view().narrow(1, 1, 6);  // [40, 6] with row stride 9
  ops::scaled_fp8_quant(xt, out, 0.5f);
  const std::vector<double> xs = test::to_doubles(xt);
  for (int64_t i = 0; i < 40; ++i) {
    EXPECT_EQ(wide.data<uint8_t>()[i * 9], 0) << "column 0 of row " << i << " was written";
    for (int64_t j = 0; j < 6; ++j) {
      ASSERT_EQ(wide.data<uint8_t>()[i * 9 + 1 + j],
                expected_byte(static_cast<float>(xs[i * 6 + j]), 0.5f))
          << i << ", " << j;
    }
    for (int64_t j = 7; j < 9; ++j) EXPECT_EQ(wide.data<uint8_t>()[i * 9 + j], 0);
  }
}

TEST(ScaledFp8Quant, EmptyAndFourDimensionalShapes) {
  const Tensor empty_x = Tensor::empty({0, 576}, DType::kF32);
  const Tensor empty_out = Tensor::empty({0, 576}, DType::kU8);
  ops::scaled_fp8_quant(empty_x, empty_out, 1.0f);  // nothing to do, no error
  auto rng = test::make_rng(60);
  const Tensor x = test::random_tensor(rng, {2, 3, 4, 5}, DType::kF32, 4.0);
  const Tensor out = Tensor::zeros({2, 3, 4, 5}, DType::kFp8E4m3);
  ops::scaled_fp8_quant(x, out, 1.5f);
  const std::vector<double> xs = test::to_doubles(x);
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(out.data<uint8_t>()[i], expected_byte(static_cast<float>(xs[i]), 1.5f)) << i;
  }
}

TEST(ScaledFp8Quant, RejectsBadArguments) {
  const Tensor x = Tensor::zeros({4, 8}, DType::kF32);
  const Tensor out = Tensor::zeros({4, 8}, DType::kU8);
  for (float bad : {0.0f, -1.0f, std::nanf(""), std::numeric_limits<float>::infinity(), 1e-40f}) {
    MLAKIT_EXPECT_THROW_MSG(ops::scaled_fp8_quant(x, out, bad),
                            "scaled_fp8_quant: scale must be finite and > 0");
  }
  const Tensor out_f32 = Tensor::zeros({4, 8}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(ops::scaled_fp8_quant(x, out_f32, 1.0f),
                          "scaled_fp8_quant: out must have dtype fp8_e4m3 or u8, got f32");
  const Tensor out_shape = Tensor::zeros({4, 9}, DType::kU8);
  MLAKIT_EXPECT_THROW_MSG(ops::scaled_fp8_quant(x, out_shape, 1.0f),
                          "scaled_fp8_quant: out.shape[1] must equal input.shape[1] (out has "
                          "input's shape) = 8, got 9");
  const Tensor out_rank = Tensor::zeros({32}, DType::kU8);
  MLAKIT_EXPECT_THROW_MSG(ops::scaled_fp8_quant(x, out_rank, 1.0f),
                          "scaled_fp8_quant: out must have 2 dimensions");
  const Tensor x_int = Tensor::zeros({4, 8}, DType::kI32);
  MLAKIT_EXPECT_THROW_MSG(ops::scaled_fp8_quant(x_int, out, 1.0f),
                          "scaled_fp8_quant: input must have dtype f32 or f16 or bf16, got i32");
#ifndef MLAKIT_WITH_CUDA  // with the CUDA backend these host pointers would reach a real kernel
  TensorView x_gpu = x.view();
  x_gpu.device = Device::cuda(0);
  TensorView out_gpu = out.view();
  out_gpu.device = Device::cuda(0);
  MLAKIT_EXPECT_THROW_MSG(ops::scaled_fp8_quant(x_gpu, out_gpu, 1.0f),
                          "scaled_fp8_quant: no kernel for cuda:0");
#endif
}

}  // namespace
}  // namespace mlakit
