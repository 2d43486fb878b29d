// ops::batched_matmul against an fp64 triple loop: every operand layout BLAS accepts, the strided
// MLA layouts (spec A.6, C.4), 16-bit operands and outputs, zero sizes and bad arguments.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/gemm_reference.hpp"
#include "common/test_util.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/types.hpp"

namespace mlakit {
namespace {

using Operand = test::GemmOperand;
using test::count_nan;
using test::make_gemm_operand;

// Any f32 dot product of K terms, in any order, with or without FMA, is within
// gamma_K * sum|a||w| of the exact value (gamma_K = K u / (1 - K u), u = 2^-24, f32's unit
// roundoff); storing it in a 16-bit c adds half an ulp of the result.
const double kF32UnitRoundoff = std::ldexp(1.0, -24);

void run_and_check(const Operand& a, const Operand& w, const Operand& c) {
  ops::batched_matmul(a.view, w.view, c.view);
  EXPECT_TRUE(test::within_gemm_bound(c.view, test::reference_bmm(a.view, w.view), a.view.shape[2],
                                      kF32UnitRoundoff));
  EXPECT_EQ(count_nan(c.storage.view()), c.storage.numel() - c.view.numel())
      << "elements outside c were written, or elements of c were not";
}

TEST(BatchedMatmul, EveryLayoutF32) {
  auto rng = test::make_rng(101);
  std::uniform_int_distribution<int64_t> size(1, 40), batch_size(1, 3), pad(0, 3);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t batch = batch_size(rng), m = size(rng), k = size(rng), n = size(rng);
    for (int layout = 0; layout < 8; ++layout) {
      SCOPED_TRACE(::testing::Message() << "batch " << batch << " M " << m << " K " << k << " N "
                                        << n << " layout " << layout);
      const Operand a = make_gemm_operand(rng, batch, m, k, DType::kF32, layout & 1, pad(rng));
      const Operand w = make_gemm_operand(rng, batch, k, n, DType::kF32, layout & 2, pad(rng));
      const Operand c =
          make_gemm_operand(rng, batch, m, n, DType::kF32, layout & 4, pad(rng), true);
      run_and_check(a, w, c);
    }
  }
}

TEST(BatchedMatmul, DegenerateMatricesOfOneRowOrColumn) {
  auto rng = test::make_rng(102);
  for (const auto& [m, k, n] :
       std::vector<std::array<int64_t, 3>>{{1, 7, 5}, {6, 1, 5}, {6, 7, 1}, {1, 1, 1}, {1, 9, 1}}) {
    for (int layout = 0; layout < 8; ++layout) {
      SCOPED_TRACE(::testing::Message()
                   << "M " << m << " K " << k << " N " << n << " layout " << layout);
      const Operand a = make_gemm_operand(rng, 2, m, k, DType::kF32, layout & 1, 1);
      const Operand w = make_gemm_operand(rng, 2, k, n, DType::kF32, layout & 2, 0);
      const Operand c = make_gemm_operand(rng, 2, m, n, DType::kF32, layout & 4, 2, true);
      run_and_check(a, w, c);
    }
  }
}

TEST(BatchedMatmul, SixteenBitOperandsAndOutputs) {
  auto rng = test::make_rng(103);
  using D = DType;
  const std::vector<std::array<DType, 3>> combos = {{D::kBF16, D::kBF16, D::kBF16},
                                                    {D::kF16, D::kF16, D::kF16},
                                                    {D::kBF16, D::kBF16, D::kF32},
                                                    {D::kF32, D::kBF16, D::kF16},
                                                    {D::kF16, D::kF32, D::kBF16}};
  std::uniform_int_distribution<int64_t> size(1, 50), pad(0, 2);
  for (const auto& [da, dw, dc] : combos) {
    for (int layout = 0; layout < 8; ++layout) {
      const int64_t m = size(rng), n = size(rng), k = 300;  // K long enough to see accumulation
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(da) << " x " << dtype_name(dw) << " -> " << dtype_name(dc) << " M "
                   << m << " N " << n << " layout " << layout);
      const Operand a = make_gemm_operand(rng, 2, m, k, da, layout & 1, pad(rng));
      const Operand w = make_gemm_operand(rng, 2, k, n, dw, layout & 2, pad(rng));
      const Operand c = make_gemm_operand(rng, 2, m, n, dc, layout & 4, pad(rng), true);
      run_and_check(a, w, c);
    }
  }
}

// Integer inputs make every f32 sum exact, so a 16-bit c must hold exactly the nearest-even
// rounding of the exact value; ties (odd integers past the last exact one) must go to even.
TEST(BatchedMatmul, RoundsSixteenBitOutputToNearestEven) {
  auto rng = test::make_rng(104);
  // |x| <= 64 is exact in bf16 and f16; K 64 keeps |sum| <= 64 * 64 * 64 = 2^18 < 2^24 (exact f32).
  std::uniform_int_distribution<int> value(-64, 64);
  constexpr int64_t kBatch = 2, kM = 24, kK = 64, kN = 40;
  for (DType dc : {DType::kBF16, DType::kF16}) {
    for (bool c_transposed : {false, true}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dc) << " transposed c " << c_transposed);
      Operand a = make_gemm_operand(rng, kBatch, kM, kK, DType::kBF16, false, 0);
      Operand w = make_gemm_operand(rng, kBatch, kK, kN, DType::kF16, true, 0);
      for (const Operand* op : {&a, &w}) {
        const TensorView& s = op->storage.view();
        for (int64_t i = 0; i < s.numel(); ++i) store_float(s.data, s.dtype, i, value(rng));
      }
      const Operand c = make_gemm_operand(rng, kBatch, kM, kN, dc, c_transposed, 1, true);
      ops::batched_matmul(a.view, w.view, c.view);
      const test::GemmReference ref = test::reference_bmm(a.view, w.view);
      const std::vector<double> got = test::to_doubles(c.view);
      int64_t rounded = 0, ties = 0, wrong = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double exact = ref.value[i];
        const double expected = round_to_dtype(static_cast<float>(exact), dc);
        rounded += expected != exact;
        int exponent = 0;  // |exact| = f * 2^exponent, f in [0.5, 1)
        std::frexp(exact, &exponent);
        const int mantissa_bits = dc == DType::kBF16 ? 7 : 10;  // stored fraction bits
        const double ulp = std::ldexp(1.0, exponent - 1 - mantissa_bits);
        ties += exact != 0 && 2 * std::fabs(exact - expected) == ulp;
        if (got[i] != expected) {
          if (wrong++ == 0)
            ADD_FAILURE() << "element " << i << ": got " << got[i] << ", expected " << expected
                          << " (exact " << exact << ")";
        }
      }
      EXPECT_EQ(wrong, 0);
      EXPECT_GT(rounded, 0) << "the test must exercise rounding";
      if (dc == DType::kBF16) {
        EXPECT_GT(ties, 0) << "the test must exercise ties";
      }
    }
  }
}

// Decode q absorption (spec A.6, C.4): a = q_nope^T per head, a strided view of q [B, N, 192];
// c = ql_nope^T per head, a view of the MQA query buffer [B, N, 576] whose q_pe part stays as is.
TEST(BatchedMatmul, MlaQueryAbsorptionLayouts) {
  auto rng = test::make_rng(105);
  constexpr int64_t kTokens = 3, kHeads = 16, kP = 128, kR = 64, kL = 512;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(dtype));
    Operand a;
    a.storage = test::random_tensor(rng, {kTokens, kHeads, kP + kR}, dtype);  // q
    a.view = a.storage.view().narrow(2, 0, kP).transpose(0, 1);               // [N, B, P]
    ASSERT_EQ(a.view.strides[0], kP + kR);
    ASSERT_EQ(a.view.strides[1], kHeads * (kP + kR));
    Operand w;
    w.storage = test::random_tensor(rng, {kHeads, kP, kL}, dtype);  // W_UK_T
    w.view = w.storage.view();
    Operand c;
    c.storage = test::nan_tensor({kTokens, kHeads, kL + kR}, dtype);  // [ql_nope | q_pe]
    c.view = c.storage.view().narrow(2, 0, kL).transpose(0, 1);       // [N, B, L]
    ASSERT_EQ(c.view.strides[0], kL + kR);
    ASSERT_EQ(c.view.strides[1], kHeads * (kL + kR));
    run_and_check(a, w, c);
  }
}

// Decode V up-projection (spec A.6): a = o_lat [B, N, L] per head, c = output rows [B, N * V]
// viewed [N, B, V] with strides (V, N * V, 1). The output has one more row that must stay.
TEST(BatchedMatmul, MlaValueUpProjectionLayouts) {
  auto rng = test::make_rng(106);
  constexpr int64_t kTokens = 5, kHeads = 16, kL = 512, kV = 128;
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(dtype));
    Operand a;
    a.storage = test::random_tensor(rng, {kTokens, kHeads, kL}, dtype);  // o_lat
    a.view = a.storage.view().transpose(0, 1);                           // [N, B, L]
    Operand w;
    w.storage = test::random_tensor(rng, {kHeads, kL, kV}, dtype);  // W_UV
    w.view = w.storage.view();
    Operand c;
    c.storage = test::nan_tensor({kTokens + 1, kHeads * kV}, dtype);  // output, one spare row
    c.view = TensorView::strided(c.storage.view().data, dtype, {kHeads, kTokens, kV},
                                 {kV, kHeads * kV, 1});
    run_and_check(a, w, c);
  }
}

// Prefill up-projection kv_b_proj(kv_c) (spec C.5): batch 1, a = kv_c rows of a [T, 576]
// workspace, w = weight^T (a column-major view of weight [N * (P + V), L]); T spans two row tiles.
TEST(BatchedMatmul, KvBProjUpProjectionLayout) {
  auto rng = test::make_rng(107);
  constexpr int64_t kTokens = 260, kHeads = 1, kL = 512, kR = 64, kOut = kHeads * (128 + 128);
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(dtype));
    Operand a;
    a.storage = test::random_tensor(rng, {kTokens, kL + kR}, dtype);  // gathered [kv_c | k_pe]
    a.view = TensorView::strided(a.storage.view().data, dtype, {1, kTokens, kL},
                                 {kTokens * (kL + kR), kL + kR, 1});
    Operand w;
    w.storage = test::random_tensor(rng, {kOut, kL}, dtype);  // kv_b_proj.weight (out x in)
    w.view = TensorView::strided(w.storage.view().data, dtype, {1, kL, kOut}, {0, 1, kL});
    Operand c;
    c.storage = test::nan_tensor({1, kTokens, kOut}, dtype);
    c.view = c.storage.view();
    run_and_check(a, w, c);
  }
}

// Enough rows and columns for several tiles in both directions, with a column-major 16-bit c.
TEST(BatchedMatmul, ManyTilesPerMatrix) {
  auto rng = test::make_rng(108);
  const Operand a = make_gemm_operand(rng, 2, 530, 9, DType::kF32, false, 0);
  const Operand w = make_gemm_operand(rng, 2, 9, 2100, DType::kBF16, true, 1);
  const Operand c = make_gemm_operand(rng, 2, 530, 2100, DType::kBF16, true, 0, true);
  run_and_check(a, w, c);
}

// One weight shared by every batch index (batch stride 0), in f32 and through the 16-bit path.
TEST(BatchedMatmul, BroadcastWeight) {
  auto rng = test::make_rng(109);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Operand a = make_gemm_operand(rng, 4, 10, 33, dtype, false, 0);
    Operand w;
    w.storage = test::random_tensor(rng, {33, 12}, dtype);
    w.view = TensorView::strided(w.storage.view().data, dtype, {4, 33, 12}, {0, 12, 1});
    const Operand c = make_gemm_operand(rng, 4, 10, 12, DType::kF32, false, 0, true);
    run_and_check(a, w, c);
  }
}

TEST(BatchedMatmul, ZeroSizes) {
  auto rng = test::make_rng(110);
  // An empty batch, M or Ncol: nothing to do (c's padding stays poisoned).
  for (const auto& [batch, m, k, n] :
       std::vector<std::array<int64_t, 4>>{{0, 4, 5, 6}, {2, 0, 5, 6}, {2, 4, 5, 0}}) {
    const Operand a = make_gemm_operand(rng, batch, m, k, DType::kBF16, false, 0);
    const Operand w = make_gemm_operand(rng, batch, k, n, DType::kF32, true, 0);
    const Operand c = make_gemm_operand(rng, batch, m, n, DType::kBF16, false, 2, true);
    ops::batched_matmul(a.view, w.view, c.view);
    EXPECT_EQ(count_nan(c.storage.view()), c.storage.numel());
  }
  // K = 0: every output is an empty sum, 0.
  for (DType dc : {DType::kF32, DType::kBF16}) {
    const Operand a = make_gemm_operand(rng, 2, 4, 0, DType::kF32, false, 0);
    const Operand w = make_gemm_operand(rng, 2, 0, 6, DType::kF16, false, 0);
    const Operand c = make_gemm_operand(rng, 2, 4, 6, dc, true, 1, true);
    ops::batched_matmul(a.view, w.view, c.view);
    for (double x : test::to_doubles(c.view)) EXPECT_EQ(x, 0.0);
    EXPECT_EQ(count_nan(c.storage.view()), c.storage.numel() - c.view.numel());
  }
}

TEST(BatchedMatmul, RejectsBadArguments) {
  auto rng = test::make_rng(111);
  const Operand a = make_gemm_operand(rng, 2, 4, 5, DType::kF32, false, 0);
  const Operand w = make_gemm_operand(rng, 2, 5, 6, DType::kF32, false, 0);
  const Operand c = make_gemm_operand(rng, 2, 4, 6, DType::kF32, false, 0, true);
  const auto bmm = [&](const TensorView& x, const TensorView& y, const TensorView& z) {
    ops::batched_matmul(x, y, z);
  };
  const Tensor flat = Tensor::empty({4, 5}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(bmm(flat, w.view, c.view),
                          "batched_matmul: a must have 3 dimensions, got 2");
  const Tensor ints = Tensor::empty({2, 4, 6}, DType::kI32);
  MLAKIT_EXPECT_THROW_MSG(bmm(a.view, w.view, ints), "batched_matmul: c must have dtype f32");

  const Operand w3 = make_gemm_operand(rng, 3, 5, 6, DType::kF32, false, 0);
  MLAKIT_EXPECT_THROW_MSG(bmm(a.view, w3.view, c.view),
                          "w.shape[0] must equal the batch a.shape[0] = 2, got 3");
  const Operand w_k = make_gemm_operand(rng, 2, 7, 6, DType::kF32, false, 0);
  MLAKIT_EXPECT_THROW_MSG(bmm(a.view, w_k.view, c.view),
                          "w.shape[1] must equal K = a.shape[2] = 5, got 7");
  const Operand c_b = make_gemm_operand(rng, 1, 4, 6, DType::kF32, false, 0);
  MLAKIT_EXPECT_THROW_MSG(bmm(a.view, w.view, c_b.view),
                          "c.shape[0] must equal the batch a.shape[0] = 2, got 1");
  const Operand c_m = make_gemm_operand(rng, 2, 3, 6, DType::kF32, false, 0);
  MLAKIT_EXPECT_THROW_MSG(bmm(a.view, w.view, c_m.view),
                          "c.shape[1] must equal M = a.shape[1] = 4, got 3");
  const Operand c_n = make_gemm_operand(rng, 2, 4, 8, DType::kF32, false, 0);
  MLAKIT_EXPECT_THROW_MSG(bmm(a.view, w.view, c_n.view),
                          "c.shape[2] must equal Ncol = w.shape[2] = 6, got 8");

  // Neither dimension contiguous: every other element of a wider tensor.
  const Tensor wide = Tensor::empty({2, 4, 10}, DType::kF32);
  const TensorView strided_a =
      TensorView::strided(wide.view().data, DType::kF32, {2, 4, 5}, {40, 10, 2});
  MLAKIT_EXPECT_THROW_MSG(bmm(strided_a, w.view, c.view),
                          "a must be a row-major or a transposed matrix per batch index");
  // Rows overlapping each other (row stride 3 < 5 columns).
  const TensorView overlapping_a =
      TensorView::strided(wide.view().data, DType::kF32, {2, 4, 5}, {20, 3, 1});
  MLAKIT_EXPECT_THROW_MSG(bmm(overlapping_a, w.view, c.view),
                          "got shape [2, 4, 5] with strides [20, 3, 1]");
  // Every batch index writing the same matrix.
  const Tensor one_c = Tensor::empty({4, 6}, DType::kF32);
  const TensorView shared_c =
      TensorView::strided(one_c.view().data, DType::kF32, {2, 4, 6}, {0, 6, 1});
  MLAKIT_EXPECT_THROW_MSG(bmm(a.view, w.view, shared_c), "c must not overlap itself");
  const TensorView negative_a =
      TensorView::strided(a.view.data, DType::kF32, {2, 4, 5}, {-20, 5, 1});
  MLAKIT_EXPECT_THROW_MSG(bmm(negative_a, w.view, c.view), "a must have non-negative strides");
  TensorView no_data = w.view;
  no_data.data = nullptr;
  MLAKIT_EXPECT_THROW_MSG(bmm(a.view, no_data, c.view), "w has no data pointer");

  TensorView cuda_c = c.view;
  cuda_c.device = Device::cuda(0);
  MLAKIT_EXPECT_THROW_MSG(bmm(a.view, w.view, cuda_c),
                          "c is on cuda:0 but a is on cpu; all tensors must be on one device");
#if !defined(MLAKIT_WITH_CUDA)  // with CUDA the call reaches the CUDA backend instead
  TensorView cuda_a = a.view, cuda_w = w.view;
  cuda_a.device = cuda_w.device = Device::cuda(0);
  try {
    ops::batched_matmul(cuda_a, cuda_w, cuda_c);
    ADD_FAILURE() << "a CUDA call must throw in a CPU-only build";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("batched_matmul: no kernel for cuda:0"), std::string::npos)
        << e.what();
  }
#endif
}

}  // namespace
}  // namespace mlakit
