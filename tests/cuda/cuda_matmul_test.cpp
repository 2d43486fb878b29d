// ops::batched_matmul on the GPU (cuBLAS): every operand orientation, the MLA layouts (q
// absorption, V up-projection, kv_b_proj), mixed operand dtypes through the conversion scratch,
// 16-bit outputs, broadcast weights and zero sizes. Results are checked against an fp64 product
// of the operands as cuBLAS multiplies them (an f32 operand next to a 16-bit one is first rounded
// to that 16-bit type: docs/kernels/gemm_cuda.md) within an f32-accumulation error bound; every
// element of c's storage outside c must stay poisoned.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "common/gemm_reference.hpp"
#include "common/test_util.hpp"
#include "cuda/gemm/cublas_context.hpp"
#include "gpu_test_util.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {
namespace {

using test::Mirrored;

// Operands live on the host; run_and_check makes their device copies.
using Operand = test::GemmOperand;
using test::make_gemm_operand;

// The type cuBLAS multiplies in (batched_gemm.hpp): the common type; else the 16-bit one; f32
// for f16 with bf16.
DType multiply_type(DType a, DType w) {
  if (a == w) return a;
  if (a == DType::kF32) return w;
  if (w == DType::kF32) return a;
  return DType::kF32;
}

// |got - exact| <= gamma_K sum|a||w| + half an ulp of c. Tensor cores add in f32 but may truncate
// rather than round the aligned addends, so gamma uses u = 2^-22 (4x f32's unit roundoff).
const double kTensorCoreUnitRoundoff = std::ldexp(1.0, -22);

void run_and_check(const Operand& a, const Operand& w, const Operand& c) {
  const Mirrored d_a(a.storage), d_w(w.storage), d_c(c.storage);
  ops::batched_matmul(d_a.on_device(a.view), d_w.on_device(w.view), d_c.on_device(c.view));
  const Tensor got = test::to_host(d_c.device);
  const TensorView got_c = test::mirror(c.view, c.storage, got);
  // fp64 products of the operands rounded to the multiply type (exact for f32 and for 16-bit
  // inputs already in that type).
  EXPECT_TRUE(test::within_gemm_bound(
      got_c, test::reference_bmm(a.view, w.view, multiply_type(a.view.dtype, w.view.dtype)),
      a.view.shape[2], kTensorCoreUnitRoundoff));
  EXPECT_EQ(test::count_nan(got.view()), c.storage.numel() - c.view.numel())
      << "elements outside c were written, or elements of c were not";
}

TEST(CudaBatchedMatmul, EveryOrientationAndDtypeCombination) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(201);
  using D = DType;
  const std::vector<std::array<DType, 3>> combos = {
      {D::kBF16, D::kBF16, D::kBF16}, {D::kBF16, D::kBF16, D::kF32},  // cuBLAS writes c
      {D::kF16, D::kF16, D::kF16},    {D::kF16, D::kF16, D::kF32},   {D::kF32, D::kF32, D::kF32},
      {D::kF32, D::kBF16, D::kBF16},  // a rounded to bf16 in the scratch (V up-projection)
      {D::kF16, D::kF32, D::kF32},    // w rounded to f16
      {D::kF16, D::kBF16, D::kF32},   // both widened to f32
      {D::kBF16, D::kBF16, D::kF16},  // c through an f32 scratch tile
      {D::kF32, D::kF32, D::kBF16}};
  std::uniform_int_distribution<int64_t> size(1, 70), pad(0, 3);
  for (const auto& [da, dw, dc] : combos) {
    for (int layout = 0; layout < 8; ++layout) {
      const int64_t batch = 1 + layout % 3, m = size(rng), n = size(rng), k = 300;
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(da) << " x " << dtype_name(dw) << " -> " << dtype_name(dc)
                   << " batch " << batch << " M " << m << " N " << n << " layout " << layout);
      const Operand a = make_gemm_operand(rng, batch, m, k, da, layout & 1, pad(rng));
      const Operand w = make_gemm_operand(rng, batch, k, n, dw, layout & 2, pad(rng));
      const Operand c = make_gemm_operand(rng, batch, m, n, dc, layout & 4, pad(rng), true);
      run_and_check(a, w, c);
    }
  }
}

TEST(CudaBatchedMatmul, DegenerateMatricesOfOneRowOrColumn) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(202);
  for (const auto& [m, k, n] :
       std::vector<std::array<int64_t, 3>>{{1, 7, 5}, {6, 1, 5}, {6, 7, 1}, {1, 1, 1}, {1, 9, 1}}) {
    for (int layout = 0; layout < 8; ++layout) {
      SCOPED_TRACE(::testing::Message()
                   << "M " << m << " K " << k << " N " << n << " layout " << layout);
      const Operand a = make_gemm_operand(rng, 2, m, k, DType::kBF16, layout & 1, 1);
      const Operand w = make_gemm_operand(rng, 2, k, n, DType::kBF16, layout & 2, 0);
      const Operand c = make_gemm_operand(rng, 2, m, n, DType::kF32, layout & 4, 2, true);
      run_and_check(a, w, c);
    }
  }
}

// The three calls of MlaAttention::forward, with the orchestrator's dtypes.
TEST(CudaBatchedMatmul, MlaLayouts) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(203);
  constexpr int64_t kTokens = 37, kHeads = 16, kP = 128, kR = 64, kL = 512, kV = 128;
  for (DType act : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(act));
    {  // q absorption: [N, B, P] view of q [B, N, 192] x W_UK_T [N, P, L] -> [N, B, L] of ql
      Operand a{test::random_tensor(rng, {kTokens, kHeads, kP + kR}, act), {}};
      a.view = a.storage.view().narrow(2, 0, kP).transpose(0, 1);
      Operand w{test::random_tensor(rng, {kHeads, kP, kL}, act), {}};
      w.view = w.storage.view();
      Operand c{test::nan_tensor({kTokens, kHeads, kL + kR}, act), {}};
      c.view = c.storage.view().narrow(2, 0, kL).transpose(0, 1);
      run_and_check(a, w, c);
    }
    {  // V up-projection: f32 o_lat [N, B, L] x W_UV [N, L, V] -> output [N, B, V], spare row
      Operand a{test::random_tensor(rng, {kTokens, kHeads, kL}, DType::kF32), {}};
      a.view = a.storage.view().transpose(0, 1);
      Operand w{test::random_tensor(rng, {kHeads, kL, kV}, act), {}};
      w.view = w.storage.view();
      Operand c{test::nan_tensor({kTokens + 1, kHeads * kV}, act), {}};
      c.view = TensorView::strided(c.storage.view().data, act, {kHeads, kTokens, kV},
                                   {kV, kHeads * kV, 1});
      run_and_check(a, w, c);
    }
    {  // kv_b_proj: kv_c rows of a [T, 576] gather x weight^T (column-major) -> [1, T, N * 256]
      constexpr int64_t kRows = 260, kOut = 2 * (kP + kV);
      Operand a{test::random_tensor(rng, {kRows, kL + kR}, act), {}};
      a.view = TensorView::strided(a.storage.view().data, act, {1, kRows, kL},
                                   {kRows * (kL + kR), kL + kR, 1});
      Operand w{test::random_tensor(rng, {kOut, kL}, act), {}};
      w.view = TensorView::strided(w.storage.view().data, act, {1, kL, kOut}, {0, 1, kL});
      Operand c{test::nan_tensor({1, kRows, kOut}, act), {}};
      c.view = c.storage.view();
      run_and_check(a, w, c);
    }
  }
}

TEST(CudaBatchedMatmul, BroadcastWeightAndLargeScratch) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(204);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Operand a = make_gemm_operand(rng, 4, 10, 33, dtype, false, 0);
    Operand w{test::random_tensor(rng, {33, 12}, DType::kBF16), {}};
    w.view = TensorView::strided(w.storage.view().data, DType::kBF16, {4, 33, 12}, {0, 12, 1});
    const Operand c = make_gemm_operand(rng, 4, 10, 12, DType::kF32, false, 0, true);
    run_and_check(a, w, c);
  }
  // A mixed call needing more than the initial 4 MiB scratch: it grows (outside capture).
  const Operand a = make_gemm_operand(rng, 8, 512, 600, DType::kF32, false, 0);  // 2.4M f32 -> bf16
  const Operand w = make_gemm_operand(rng, 8, 600, 64, DType::kBF16, true, 0);
  const Operand c = make_gemm_operand(rng, 8, 512, 64, DType::kF16, false, 0, true);  // + f32 tile
  run_and_check(a, w, c);
}

// The cuBLASLt plans of the default stream's context (docs/kernels/gemm_cuda.md, "Plans").
size_t default_stream_plans() { return cuda::cublas_context(nullptr, "test").lt_plans.size(); }

// A repeated call reuses its plan (the cache does not grow) and writes the same bits; the same
// problem on an operand moved off its 256-byte alignment gets a plan of its own and is right.
TEST(CudaBatchedMatmul, PlansAreReusedAndKeyedByAlignment) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(206);
  Operand a = make_gemm_operand(rng, 3, 40, 64, DType::kBF16, false, 1);
  const Operand w = make_gemm_operand(rng, 3, 64, 48, DType::kBF16, true, 0);
  const Operand c = make_gemm_operand(rng, 3, 40, 48, DType::kBF16, false, 0, true);
  run_and_check(a, w, c);
  const size_t plans = default_stream_plans();
  const Mirrored d_a(a.storage), d_w(w.storage), d_c(c.storage);
  ops::batched_matmul(d_a.on_device(a.view), d_w.on_device(w.view), d_c.on_device(c.view));
  const Tensor first = test::to_host(d_c.device);
  ops::batched_matmul(d_a.on_device(a.view), d_w.on_device(w.view), d_c.on_device(c.view));
  EXPECT_TRUE(test::same_bits(first, test::to_host(d_c.device), false));
  EXPECT_EQ(default_stream_plans(), plans) << "a repeated problem was planned again";
  // One element on (pad 1 leaves room at the end of each row): 2-byte aligned rows of a.
  a.view.data = static_cast<char*>(a.view.data) + dtype_size(DType::kBF16);
  run_and_check(a, w, c);
  EXPECT_EQ(default_stream_plans(), plans + 1) << "a less aligned operand reused a plan";
}

// More distinct problems than the cache holds: it stays bounded (emptied when full) and every
// call is still right.
TEST(CudaBatchedMatmul, PlanCacheStaysBounded) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(207);
  constexpr int64_t kRows = cuda::LtPlanCache::kMaxPlans + 8;  // every row count a problem
  const Operand a = make_gemm_operand(rng, 1, kRows, 16, DType::kF32, false, 0);
  const Operand w = make_gemm_operand(rng, 1, 16, 8, DType::kF32, false, 0);
  const Operand c = make_gemm_operand(rng, 1, kRows, 8, DType::kF32, false, 0, true);
  const Mirrored d_a(a.storage), d_w(w.storage), d_c(c.storage);
  for (int64_t m = 1; m <= kRows; ++m) {
    ops::batched_matmul(d_a.on_device(a.view).narrow(1, 0, m), d_w.on_device(w.view),
                        d_c.on_device(c.view).narrow(1, 0, m));
    ASSERT_LE(default_stream_plans(), cuda::LtPlanCache::kMaxPlans);
  }
  const Tensor got = test::to_host(d_c.device);  // the last call wrote every row
  EXPECT_TRUE(test::within_gemm_bound(test::mirror(c.view, c.storage, got),
                                      test::reference_bmm(a.view, w.view), 16,
                                      kTensorCoreUnitRoundoff));
}

TEST(CudaBatchedMatmul, ZeroSizes) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(205);
  for (const auto& [batch, m, k, n] :
       std::vector<std::array<int64_t, 4>>{{0, 4, 5, 6}, {2, 0, 5, 6}, {2, 4, 5, 0}}) {
    const Operand a = make_gemm_operand(rng, batch, m, k, DType::kBF16, false, 0);
    const Operand w = make_gemm_operand(rng, batch, k, n, DType::kBF16, true, 0);
    const Operand c = make_gemm_operand(rng, batch, m, n, DType::kBF16, false, 2, true);
    const Mirrored d_a(a.storage), d_w(w.storage), d_c(c.storage);
    ops::batched_matmul(d_a.on_device(a.view), d_w.on_device(w.view), d_c.on_device(c.view));
    EXPECT_EQ(test::count_nan(test::to_host(d_c.device).view()), c.storage.numel());
  }
  for (DType dc : {DType::kF32, DType::kBF16}) {  // K = 0: every output is 0
    const Operand a = make_gemm_operand(rng, 2, 4, 0, DType::kF32, false, 0);
    const Operand w = make_gemm_operand(rng, 2, 0, 6, DType::kF16, false, 0);
    const Operand c = make_gemm_operand(rng, 2, 4, 6, dc, true, 1, true);
    const Mirrored d_a(a.storage), d_w(w.storage), d_c(c.storage);
    ops::batched_matmul(d_a.on_device(a.view), d_w.on_device(w.view), d_c.on_device(c.view));
    const Tensor got = test::to_host(d_c.device);
    for (double x : test::to_doubles(test::mirror(c.view, c.storage, got))) EXPECT_EQ(x, 0.0);
    EXPECT_EQ(test::count_nan(got.view()), c.storage.numel() - c.view.numel());
  }
}

}  // namespace
}  // namespace mlakit
