// Conversions checked against values derived independently of the conversion code.
#include "mlakit/dtype.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/fp8_reference.hpp"
#include "common/test_util.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/types.hpp"

namespace mlakit {
namespace {

TEST(DType, E4m3DecodeMatchesDefinition) {
  for (int b = 0; b < 256; ++b) {
    const double expected = test::e4m3_value(b);
    const float got = e4m3_bits_to_float(static_cast<uint8_t>(b));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << b;
    } else {
      EXPECT_EQ(got, expected) << b;
    }
  }
}

TEST(DType, E4m3EncodeIsNearestEvenSaturating) {
  auto rng = test::make_rng(1);
  std::uniform_real_distribution<double> log_mag(-12, 10);
  for (int i = 0; i < 20000; ++i) {
    const float x = static_cast<float>((i & 1 ? -1 : 1) * std::exp2(log_mag(rng)));
    EXPECT_EQ(float_to_e4m3_bits(x), test::e4m3_nearest(x)) << x;
  }
  // Midpoints between neighbours round to the even mantissa.
  for (int b = 0; b < 0x7e; ++b) {
    const double mid = (test::e4m3_value(b) + test::e4m3_value(b + 1)) / 2;
    EXPECT_EQ(float_to_e4m3_bits(static_cast<float>(mid)), (b & 1) ? b + 1 : b) << mid;
  }
  EXPECT_EQ(float_to_e4m3_bits(1e9f), 0x7e);
  EXPECT_EQ(float_to_e4m3_bits(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_TRUE(std::isnan(e4m3_bits_to_float(float_to_e4m3_bits(NAN))));
}

TEST(DType, Bf16AndF16RoundTripAndTies) {
  // 1 + 2^-8 is the midpoint between bf16 neighbours 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(bf16_bits_to_float(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_bits_to_float(float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8))),
            1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(f16_bits_to_float(float_to_f16_bits(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  EXPECT_EQ(f16_bits_to_float(float_to_f16_bits(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_bits_to_float(float_to_f16_bits(65520.0f))));
  EXPECT_EQ(f16_bits_to_float(float_to_f16_bits(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive half survives a round trip
    EXPECT_EQ(float_to_f16_bits(f16_bits_to_float(static_cast<uint16_t>(h))), h);
  }
  for (uint32_t b = 0; b < 0x7f80; b += 7) {
    EXPECT_EQ(float_to_bf16_bits(bf16_bits_to_float(static_cast<uint16_t>(b))), b);
  }
}

TEST(TensorView, NarrowTransposeReshape) {
  Tensor t = Tensor::empty({4, 3, 5}, DType::kF32);
  EXPECT_TRUE(t.view().is_contiguous());
  TensorView n = t.view().narrow(2, 1, 3);
  EXPECT_EQ(n.size(2), 3);
  EXPECT_EQ(n.stride(1), 5);
  EXPECT_FALSE(n.is_contiguous());
  TensorView tr = t.view().transpose(0, 1);
  EXPECT_EQ(tr.size(0), 3);
  EXPECT_EQ(tr.stride(0), 5);
  MLAKIT_EXPECT_THROW_MSG(t.view().narrow(1, 2, 2), "out of range");
  // start + length wrapped past int64 and passed: a view of 2^63 - 1 rows over 3.
  MLAKIT_EXPECT_THROW_MSG(t.view().narrow(1, 1, std::numeric_limits<int64_t>::max()),
                          "out of range for size 3");
  MLAKIT_EXPECT_THROW_MSG(t.view().narrow(1, 4, 0), "out of range for size 3");
  EXPECT_EQ(t.view().narrow(1, 3, 0).size(1), 0);
  // A view without data stays without: narrowing it gave the address NULL + offset, which the
  // ops took for data (fill_zero wrote there and crashed).
  const TensorView no_data = TensorView::contiguous(nullptr, DType::kF32, {4, 3});
  EXPECT_EQ(no_data.narrow(0, 2, 2).data, nullptr);
  MLAKIT_EXPECT_THROW_MSG(ops::fill_zero(no_data.narrow(0, 2, 2)),
                          "fill_zero: dst has no data pointer but 6 elements");
  MLAKIT_EXPECT_THROW_MSG(n.reshape({12}), "contiguous");
  EXPECT_EQ(t.view().reshape({12, 5}).size(0), 12);
#ifndef MLAKIT_WITH_CUDA
  MLAKIT_EXPECT_THROW_MSG(Tensor::empty({2}, DType::kF32, Device::cuda()), "built without CUDA");
#endif
}

TEST(Tensor, SizesPastInt64AreRefused) {
  // 2^62 f32 elements: the byte count wrapped to 0, and Tensor::empty returned a view of 2^62
  // elements with no storage (a null data pointer).
  MLAKIT_EXPECT_THROW_MSG(Tensor::empty({int64_t{1} << 31, int64_t{1} << 31}, DType::kF32),
                          "Tensor::empty: shape [2147483648, 2147483648] of f32 needs more than "
                          "2^63 bytes");
  // An element count past int64 (numel saturates).
  MLAKIT_EXPECT_THROW_MSG(Tensor::empty({int64_t{1} << 40, int64_t{1} << 40}, DType::kU8),
                          "needs more than 2^63 bytes");
  // A view with no element may claim any sizes; its strides saturate instead of wrapping.
  const TensorView empty = TensorView::contiguous(
      nullptr, DType::kF32, {0, int64_t{1} << 40, int64_t{1} << 40, int64_t{1} << 40});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.stride(0), std::numeric_limits<int64_t>::max());
}

}  // namespace
}  // namespace mlakit
