// Scales given as one-element f32 tensors (ops.hpp, "Scales as tensors") on the CPU: the tensor
// forms of concat_and_cache_mla, gather_and_maybe_dequant_cache and scaled_fp8_quant must give
// the bytes of the float forms with the tensor's value, and both must match references written
// here from the formulas (common/fp8_reference.hpp, common/cache_reference.hpp). Also
// dynamic_scaled_fp8_quant: scale = amax / 448 in f32, codes of the static quant with it, zero
// input -> scale 0 and codes 0, inf / NaN input -> an error after the scale is written. Bad scale
// tensors (dtype, element count, device, values) are in the error table (tests/errors/cases/
// *_tensor_scale.json, dynamic_scaled_fp8_quant.json).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "common/cache_reference.hpp"
#include "common/cache_write_inputs.hpp"
#include "common/fp8_reference.hpp"
#include "common/paged_cache.hpp"
#include "common/test_util.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/error.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {
namespace {

// A one-element f32 tensor of `shape` ({} for a 0-d tensor) holding `value`.
Tensor scale_tensor(float value, std::initializer_list<int64_t> shape = {1}) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::memcpy(t.view().data, &value, sizeof(value));
  return t;
}

float random_scale(std::mt19937_64& rng) {
  // 2^[-6, 4): scales of real k_scale / activation ranges, exercising rounding of x / scale.
  return std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng),
                    std::uniform_int_distribution<int>(-6, 3)(rng));
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const int64_t bytes = a.numel() * dtype_size(a.view().dtype);
  return bytes == b.numel() * dtype_size(b.view().dtype) &&
         std::memcmp(a.view().data, b.view().data, bytes) == 0;
}

// ---- concat_and_cache_mla -----------------------------------------------------------------------

TEST(TensorScale, ConcatAndCacheMlaMatchesFloatFormAndReference) {
  auto scale_rng = test::make_rng(11000);
  for (uint64_t i = 0; i < 6; ++i) {
    const float scale = random_scale(scale_rng);
    const DType act = i % 3 == 0 ? DType::kF32 : (i % 3 == 1 ? DType::kBF16 : DType::kF16);
    const test::CacheWriteCase c{.num_tokens = 37,
                                 .extra_rows = 2,
                                 .latent = 64,
                                 .rope = 16,
                                 .act = act,
                                 .kv_dtype = KvCacheDType::kFp8E4m3,
                                 .k_scale = scale,
                                 .sliced_inputs = i % 2 == 0,
                                 .stream = 11000 + i};
    SCOPED_TRACE(test::describe(c));
    auto rng = test::make_rng(c.stream);
    const test::CacheWriteInputs in = test::make_cache_write_inputs(rng, c);  // NaN-poisoned
    const Tensor by_float = Tensor::empty({in.cache_buffer.numel()}, DType::kU8);
    std::memcpy(by_float.view().data, in.cache_buffer.view().data, in.cache_buffer.numel());
    const TensorView float_cache = TensorView::strided(
        by_float.view().data, DType::kU8, {in.cache.shape[0], in.cache.shape[1], in.cache.shape[2]},
        {in.cache.strides[0], in.cache.strides[1], 1});

    ops::concat_and_cache_mla(in.kv_c, in.k_pe, float_cache, in.slot_mapping, c.kv_dtype, scale);
    ops::concat_and_cache_mla(in.kv_c, in.k_pe, in.cache, in.slot_mapping, c.kv_dtype,
                              scale_tensor(scale, {}));
    ASSERT_EQ(
        0, std::memcmp(by_float.view().data, in.cache_buffer.view().data, in.cache_buffer.numel()));

    // Reference: entry byte i of token t's slot is e4m3(x_i / scale); every other byte is the
    // poison (NaN codes 0xff) it was.
    std::vector<uint8_t> expected(in.cache_buffer.numel(), 0xff);
    for (int64_t t = 0; t < c.num_tokens; ++t) {
      const int64_t slot = in.slots[t];
      if (slot < 0) continue;
      uint8_t* entry = expected.data() + (slot / c.block_size) * in.cache.strides[0] +
                       (slot % c.block_size) * in.cache.strides[1];
      for (int64_t j = 0; j < c.latent + c.rope; ++j) {
        const float x =
            j < c.latent
                ? load_float(in.kv_c.element_ptr(t * in.kv_c.strides[0]), act, j)
                : load_float(in.k_pe.element_ptr(t * in.k_pe.strides[0]), act, j - c.latent);
        entry[j] = test::e4m3_nearest(static_cast<double>(x / scale));
      }
    }
    const auto* got = in.cache_buffer.data<uint8_t>();
    int64_t bad = 0;
    for (size_t b = 0; b < expected.size(); ++b) {
      const bool both_nan = (got[b] & 0x7f) == 0x7f && (expected[b] & 0x7f) == 0x7f;
      if (got[b] != expected[b] && !both_nan && bad++ < 3) {
        ADD_FAILURE() << "cache byte " << b << ": got " << int(got[b]) << ", want "
                      << int(expected[b]);
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(TensorScale, ConcatAndCacheMlaIgnoresTheValueOfAnUnusedScale) {
  // auto caches do not use the scale: any value, even NaN, is accepted as with the float form.
  const Tensor kv_c = test::tensor_from({1, 2, 3, 4}, {1, 4}, DType::kF32);
  const Tensor k_pe = test::tensor_from({5, 6}, {1, 2}, DType::kF32);
  const Tensor cache = test::nan_tensor({1, 2, 6}, DType::kF32);
  ops::concat_and_cache_mla(kv_c, k_pe, cache, test::int_tensor({1}, {1}, DType::kI64),
                            KvCacheDType::kAuto, scale_tensor(std::nanf("")));
  for (int j = 0; j < 6; ++j) EXPECT_EQ(cache.data<float>()[6 + j], j + 1.0f);
  EXPECT_TRUE(std::isnan(cache.data<float>()[0]));
}

// ---- gather_and_maybe_dequant_cache -------------------------------------------------------------

TEST(TensorScale, GatherAndMaybeDequantCacheMatchesFloatFormAndReference) {
  auto rng = test::make_rng(12000);
  for (DType dst_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const float scale = random_scale(rng);
    const test::PagedBatch batch = test::random_paged_batch(rng, 5, 16, true);
    constexpr int64_t kWidth = 40;  // L + R of a small cache
    const Tensor cache =
        test::random_paged_cache(rng, batch, KvCacheDType::kFp8E4m3, DType::kU8, kWidth, dst_dtype);
    const test::PagedIndices ix = test::make_paged_indices(rng, batch);
    const std::optional<Tensor> starts = ix.seq_starts();
    // dst: [num_tokens + 2, W] inside NaN-poisoned [num_tokens + 2, W + 8] buffers.
    const int64_t rows = ix.num_tokens + 2;
    const Tensor by_float = test::nan_tensor({rows, kWidth + 8}, dst_dtype);
    const Tensor by_tensor = test::nan_tensor({rows, kWidth + 8}, dst_dtype);
    for (const Tensor* buffer : {&by_float, &by_tensor}) {
      const TensorView dst = buffer->view().narrow(1, 0, kWidth);
      if (buffer == &by_float) {
        ops::gather_and_maybe_dequant_cache(
            cache, dst, ix.block_table(), ix.cu_seq_lens(), ix.token_to_seq(), ix.num_tokens,
            KvCacheDType::kFp8E4m3, scale, test::optional_view(starts));
      } else {
        ops::gather_and_maybe_dequant_cache(
            cache, dst, ix.block_table(), ix.cu_seq_lens(), ix.token_to_seq(), ix.num_tokens,
            KvCacheDType::kFp8E4m3, scale_tensor(scale), test::optional_view(starts));
      }
    }
    ASSERT_TRUE(same_bytes(by_float, by_tensor)) << dtype_name(dst_dtype);

    std::vector<double> expected(by_tensor.numel(), NAN);
    for (int64_t t = 0; t < ix.num_tokens; ++t) {
      const int64_t r = ix.seq_of_token[t];
      const auto [block, offset] = ix.locate(r, t - ix.cu[r] + ix.start_of(r));
      const uint8_t* entry = cache.data<uint8_t>() + (block * batch.block_size + offset) * kWidth;
      for (int64_t i = 0; i < kWidth; ++i) {
        expected[t * (kWidth + 8) + i] = test::expected_dequant_value(
            KvCacheDType::kFp8E4m3, DType::kU8, dst_dtype, scale, entry, i);
      }
    }
    EXPECT_TRUE(test::all_close(by_tensor, expected, {0.0, 0.0})) << dtype_name(dst_dtype);
  }
}

// ---- scaled_fp8_quant ---------------------------------------------------------------------------

// The static quant's byte: the f32 product of x and the f32 reciprocal, then nearest e4m3.
uint8_t quant_byte(float x, float scale) {
  const float inv = 1.0f / scale;
  return test::e4m3_nearest(static_cast<double>(x * inv));
}

TEST(TensorScale, ScaledFp8QuantMatchesFloatFormAndReference) {
  auto rng = test::make_rng(13000);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const float scale = random_scale(rng);
    // Magnitudes up to 60: saturating, normal and subnormal codes for these scales.
    const Tensor x = test::random_tensor(rng, {9, 33}, dtype, 60.0);
    const Tensor by_float = test::nan_tensor({9, 33}, DType::kFp8E4m3);
    const Tensor by_tensor = test::nan_tensor({9, 33}, DType::kFp8E4m3);
    ops::scaled_fp8_quant(x, by_float, scale);
    ops::scaled_fp8_quant(x, by_tensor, scale_tensor(scale, {1, 1}));
    ASSERT_TRUE(same_bytes(by_float, by_tensor)) << dtype_name(dtype);
    const std::vector<double> xs = test::to_doubles(x);
    for (int64_t i = 0; i < x.numel(); ++i) {
      ASSERT_EQ(by_tensor.data<uint8_t>()[i], quant_byte(static_cast<float>(xs[i]), scale))
          << dtype_name(dtype) << " element " << i;
    }
  }
}

// ---- dynamic_scaled_fp8_quant -------------------------------------------------------------------

TEST(TensorScale, DynamicQuantScaleIsAmaxOver448AndCodesUseIt) {
  auto rng = test::make_rng(14000);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const Tensor x = test::random_tensor(rng, {7, 65}, dtype, 5.0);
    const TensorView strided = x.view().narrow(1, 1, 63);  // row stride 65: not dense
    const Tensor out = test::nan_tensor({7, 63}, DType::kFp8E4m3);
    const Tensor scale = scale_tensor(std::nanf(""));
    ops::dynamic_scaled_fp8_quant(strided, out, scale);
    const std::vector<double> xs = test::to_doubles(strided);
    double amax = 0.0;
    for (double v : xs) amax = std::max(amax, std::fabs(v));
    const float want = static_cast<float>(amax) / 448.0f;  // f32 division (values are exact f32)
    ASSERT_EQ(scale.data<float>()[0], want) << dtype_name(dtype);
    for (int64_t i = 0; i < out.numel(); ++i) {
      ASSERT_EQ(out.data<uint8_t>()[i], quant_byte(static_cast<float>(xs[i]), want))
          << dtype_name(dtype) << " element " << i;
    }
  }
}

TEST(TensorScale, DynamicQuantOfZerosGivesScaleZeroAndZeroCodes) {
  const Tensor x = test::tensor_from({0.0, -0.0, 0.0, -0.0}, {2, 2}, DType::kBF16);
  const Tensor out = test::nan_tensor({2, 2}, DType::kFp8E4m3);
  const Tensor scale = scale_tensor(7.0f);
  ops::dynamic_scaled_fp8_quant(x, out, scale);
  EXPECT_EQ(scale.data<float>()[0], 0.0f);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out.data<uint8_t>()[i], 0) << i;
  const Tensor empty = Tensor::empty({0, 8}, DType::kF32);
  const Tensor empty_out = Tensor::empty({0, 8}, DType::kFp8E4m3);
  ops::dynamic_scaled_fp8_quant(empty, empty_out, scale);
  EXPECT_EQ(scale.data<float>()[0], 0.0f);
}

TEST(TensorScale, DynamicQuantOfInfOrNanInputWritesTheScaleThenThrows) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float special : {inf, -inf, std::nanf("")}) {
    const Tensor x = test::tensor_from({1.0, special, 2.0}, {3}, DType::kF32);
    const Tensor out = Tensor::zeros({3}, DType::kFp8E4m3);
    const Tensor scale = scale_tensor(1.0f);
    MLAKIT_EXPECT_THROW_MSG(ops::dynamic_scaled_fp8_quant(x, out, scale),
                            "dynamic_scaled_fp8_quant: the scale amax(|input|) / 448 = ");
    EXPECT_FALSE(std::isfinite(scale.data<float>()[0])) << special;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(out.data<uint8_t>()[i], 0) << "out was written";
  }
}

}  // namespace
}  // namespace mlakit
