// ops::copy, ops::fill_zero and the fp8 quantization kernel on the GPU. copy and fill_zero run
// through the CPU backend and the CUDA backend on copies of one poisoned buffer, which must then
// be equal bit for bit (NaN == NaN); the quantization is compared with e4m3(x * (1 / scale))
// computed here on the host for every bf16 and f16 bit pattern and random f32 ones.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/test_util.hpp"
#include "cuda/elementwise/launch.hpp"
#include "gpu_test_util.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {
namespace {

using test::Mirrored;

constexpr DType kFloatDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// Values whose conversions are delicate: infinities, NaN, the f16 overflow edge (65520 rounds to
// inf, 65519 does not), f16 and f32 subnormals, bf16 ties, signed zero.
void add_special_values(const Tensor& t) {
  const float special[] = {
      INFINITY,  -INFINITY, NAN,    65520.0f,      65519.0f,
      -65504.0f, 1e-8f,     1e-40f, -0.0f,         1.00390625f /* 1 + 2^-8: bf16 tie */,
      FLT_MAX,   6.1e-5f,   3e-5f,  -1.0009765625f};
  for (int64_t i = 0; i < 14 && i < t.numel(); ++i)
    store_float(t.view().data, t.view().dtype, i, special[i]);
}

// A source view and a destination view of the same logical shape [5, 7, 64], in one of several
// layouts, each inside its own poisoned storage.
enum class Layout { kDense, kSrcTransposed, kUnalignedRows, kBroadcastSrc, kPaddedDst };

struct CopyViews {
  Tensor src_storage, dst_storage;
  TensorView src, dst;
};

CopyViews make_copy_views(std::mt19937_64& rng, Layout layout, DType from, DType to) {
  CopyViews v;
  switch (layout) {
    case Layout::kDense:
      v.src_storage = test::random_tensor(rng, {5, 7, 64}, from);
      v.dst_storage = test::nan_tensor({5, 7, 64}, to);
      v.src = v.src_storage.view();
      v.dst = v.dst_storage.view();
      break;
    case Layout::kSrcTransposed:  // innermost stride 35: element by element
      v.src_storage = test::random_tensor(rng, {64, 7, 5}, from);
      v.dst_storage = test::nan_tensor({5, 7, 64}, to);
      v.src = v.src_storage.view().transpose(0, 2);
      v.dst = v.dst_storage.view();
      break;
    case Layout::kUnalignedRows:  // row stride 67: no vector packs
      v.src_storage = test::random_tensor(rng, {5, 7, 67}, from);
      v.dst_storage = test::nan_tensor({5, 7, 67}, to);
      v.src = v.src_storage.view().narrow(2, 1, 64);
      v.dst = v.dst_storage.view().narrow(2, 3, 64);
      break;
    case Layout::kBroadcastSrc:  // stride 0 over the first dimension
      v.src_storage = test::random_tensor(rng, {7, 64}, from);
      v.dst_storage = test::nan_tensor({5, 7, 64}, to);
      v.src = TensorView::strided(v.src_storage.view().data, from, {5, 7, 64}, {0, 64, 1});
      v.dst = v.dst_storage.view();
      break;
    case Layout::kPaddedDst:  // aligned row strides of 80: vector packs with a gap
      v.src_storage = test::random_tensor(rng, {5, 7, 64}, from);
      v.dst_storage = test::nan_tensor({5, 7, 80}, to);
      v.src = v.src_storage.view();
      v.dst = v.dst_storage.view().narrow(2, 8, 64);
      break;
  }
  add_special_values(v.src_storage);
  return v;
}

TEST(CudaCopy, MatchesCpuForEveryDtypePairAndLayout) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(1);
  for (Layout layout : {Layout::kDense, Layout::kSrcTransposed, Layout::kUnalignedRows,
                        Layout::kBroadcastSrc, Layout::kPaddedDst}) {
    for (DType from : kFloatDtypes) {
      for (DType to : kFloatDtypes) {
        SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to) + ", layout " +
                     std::to_string(static_cast<int>(layout)));
        const CopyViews v = make_copy_views(rng, layout, from, to);
        const Mirrored d_src(v.src_storage), d_dst(v.dst_storage);
        ops::copy(d_src.on_device(v.src), d_dst.on_device(v.dst));
        ops::copy(v.src, v.dst);
        EXPECT_TRUE(test::same_bits(v.dst_storage, test::to_host(d_dst.device)));
      }
    }
  }
}

TEST(CudaCopy, FourDimensionsAndSingleElement) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(2);
  const Tensor src = test::random_tensor(rng, {2, 3, 4, 40}, DType::kBF16);
  const Tensor dst = test::nan_tensor({3, 2, 4, 40}, DType::kF32);
  const TensorView dst_view = dst.view().transpose(0, 1);  // [2, 3, 4, 40], outer dims permuted
  const Mirrored d_src(src), d_dst(dst);
  ops::copy(d_src.device, d_dst.on_device(dst_view));
  ops::copy(src, dst_view);
  EXPECT_TRUE(test::same_bits(dst, test::to_host(d_dst.device)));

  const Tensor one = test::random_tensor(rng, {1}, DType::kF32);
  const Tensor out = test::nan_tensor({1}, DType::kF16);
  const Mirrored d_one(one), d_out(out);
  ops::copy(d_one.device, d_out.device);
  ops::copy(one, out);
  EXPECT_TRUE(test::same_bits(out, test::to_host(d_out.device)));
}

TEST(CudaFillZero, MatchesCpuForDtypesAndLayouts) {
  MLAKIT_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kU8, DType::kI32, DType::kI64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor storage = test::nan_tensor({6, 9, 40}, dtype);  // ints: every byte 0xff
    const TensorView views[] = {
        storage.view(),                                   // one dense run: cudaMemsetAsync
        storage.view().narrow(2, 8, 24),                  // aligned rows with gaps: vector units
        storage.view().narrow(2, 1, 23),                  // odd offsets: narrower units
        storage.view().transpose(0, 2).narrow(0, 3, 30),  // innermost stride 360: elements
        storage.view().narrow(0, 2, 0),                   // empty
    };
    for (const TensorView& view : views) {
      const Tensor host = test::nan_tensor({6, 9, 40}, dtype);
      const TensorView host_view = test::mirror(view, storage, host);
      const Mirrored d(host);
      ops::fill_zero(d.on_device(host_view));
      ops::fill_zero(host_view);
      EXPECT_TRUE(test::same_bits(host, test::to_host(d.device), false));
    }
  }
}

// e4m3(x * inv_scale) with the CPU's conversion: the reference of the quantization kernel.
Tensor quantize_on_host(const TensorView& x, float inv_scale) {
  const std::vector<double> values = test::to_doubles(x);
  Tensor out = Tensor::empty({x.numel()}, DType::kU8);
  for (int64_t i = 0; i < x.numel(); ++i)
    out.data<uint8_t>()[i] = float_to_e4m3_bits(static_cast<float>(values[i]) * inv_scale);
  return out;
}

// Every bit pattern of a 16-bit dtype as a [256, 256] tensor.
Tensor all_16bit_patterns(DType dtype) {
  Tensor t = Tensor::empty({256, 256}, dtype);
  for (int64_t i = 0; i < 65536; ++i) t.data<uint16_t>()[i] = static_cast<uint16_t>(i);
  return t;
}

TEST(CudaScaledFp8Quant, EveryBf16AndF16PatternAndRandomF32) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(3);
  Tensor f32 = Tensor::empty({400, 512}, DType::kF32);
  std::uniform_int_distribution<uint32_t> bits;
  for (int64_t i = 0; i < f32.numel(); ++i) f32.data<uint32_t>()[i] = bits(rng);
  add_special_values(f32);
  const Tensor inputs[] = {all_16bit_patterns(DType::kBF16), all_16bit_patterns(DType::kF16), f32};
  for (const Tensor& x : inputs) {
    for (float scale : {1.0f, 0.37f, 448.0f, 1e-3f}) {
      SCOPED_TRACE(std::string(dtype_name(x.view().dtype)) + " scale " + std::to_string(scale));
      const float inv_scale = 1.0f / scale;
      const Tensor out = Tensor::empty({x.size(0), x.size(1)}, DType::kFp8E4m3);
      const Mirrored d_x(x), d_out(out);
      cuda::scaled_fp8_quant(d_x.device, d_out.device, inv_scale, {});
      const Tensor expected = quantize_on_host(x, inv_scale);
      const Tensor got = test::to_host(d_out.device);
      const auto* e = expected.data<uint8_t>();
      const auto* g = got.data<uint8_t>();
      int64_t bad = 0, first = -1;
      for (int64_t i = 0; i < x.numel(); ++i) {
        const bool both_nan = (e[i] & 0x7f) == 0x7f && (g[i] & 0x7f) == 0x7f;
        if (e[i] != g[i] && !both_nan && bad++ == 0) first = i;
      }
      EXPECT_EQ(bad, 0) << "first mismatch at " << first << ": expected 0x" << std::hex
                        << int(e[first]) << ", got 0x" << int(g[first]);
    }
  }
}

TEST(CudaScaledFp8Quant, StridedInputAndOutput) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(4);
  for (DType dtype : kFloatDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x_storage = test::random_tensor(rng, {576, 12}, dtype, 100.0);
    const TensorView x = x_storage.view().transpose(0, 1);  // [12, 576], innermost stride 12
    const Tensor out_storage = test::nan_tensor({12, 600}, DType::kU8);
    const TensorView out = out_storage.view().narrow(1, 7, 576);
    const Mirrored d_x(x_storage), d_out(out_storage);
    cuda::scaled_fp8_quant(d_x.on_device(x), d_out.on_device(out), 1.0f / 3.0f, {});
    const Tensor got = test::to_host(d_out.device);
    const std::vector<double> values = test::to_doubles(x);
    int64_t bad = 0;
    for (int64_t r = 0; r < 12; ++r) {
      for (int64_t c = 0; c < 600; ++c) {
        const uint8_t g = got.data<uint8_t>()[r * 600 + c];
        const bool inside = c >= 7 && c < 7 + 576;
        const uint8_t e =
            inside ? float_to_e4m3_bits(static_cast<float>(values[r * 576 + c - 7]) * (1.0f / 3.0f))
                   : 0xff;  // untouched poison
        bad += g != e;
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

}  // namespace
}  // namespace mlakit
