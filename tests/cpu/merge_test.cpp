// ops::merge_attn_states on the CPU against the fp64 merge of tests/reference (spec A.8, C.6,
// D.3): a sampled grid of sizes and dtypes with +inf LSEs, the empty-set edge cases, strided
// heads, in-place merging, an omitted output LSE, and every argument error.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "common/test_util.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"
#include "reference/reference.hpp"

namespace mlakit {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// LSEs are computed in f32 from O(1) inputs: a few f32 ulps of values below ~10.
constexpr test::Tolerance kLseTolerance{1e-5, 1e-5};

// LSE [H, T] ~ N(0, 1) with ~10 % of the positions +inf in the prefix, another ~10 % +inf in the
// suffix, never both at one position (spec D.3).
struct LsePair {
  Tensor prefix, suffix;
};
LsePair random_lse_pair(std::mt19937_64& rng, int64_t heads, int64_t tokens) {
  LsePair p{test::random_tensor(rng, {heads, tokens}, DType::kF32),
            test::random_tensor(rng, {heads, tokens}, DType::kF32)};
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t i = 0; i < heads * tokens; ++i) {
    const double x = u(rng);
    if (x < 0.1) {
      p.prefix.data<float>()[i] = std::numeric_limits<float>::infinity();
    } else if (x < 0.2) {
      p.suffix.data<float>()[i] = std::numeric_limits<float>::infinity();
    }
  }
  return p;
}

ref::MergeResult reference_merge(const TensorView& prefix, const TensorView& prefix_lse,
                                 const TensorView& suffix, const TensorView& suffix_lse) {
  return ref::merge(test::to_doubles(prefix), test::to_doubles(prefix_lse),
                    test::to_doubles(suffix), test::to_doubles(suffix_lse), prefix.shape[0],
                    prefix.shape[1], prefix.shape[2]);
}

TEST(MergeAttnStates, SampledGridMatchesReference) {
  auto rng = test::make_rng(1);
  const int64_t head_sizes[] = {32, 48, 128, 256};
  constexpr int64_t kMaxElements = 1 << 18;  // elements of one output; keeps the grid ~1 s
  int case_index = 0;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t tokens : {1, 7, 256, 613}) {
      for (int64_t heads : {1, 4, 48}) {
        // Head sizes rotate so each meets every dtype; the largest token x head cases take the
        // smallest head size that keeps the case under kMaxElements (test runtime).
        int64_t size_index = case_index++ % 4;
        while (size_index > 0 && tokens * heads * head_sizes[size_index] > kMaxElements) {
          --size_index;
        }
        const int64_t d = head_sizes[size_index];
        SCOPED_TRACE(testing::Message()
                     << dtype_name(dtype) << " T=" << tokens << " H=" << heads << " D=" << d);
        Tensor prefix = test::random_tensor(rng, {tokens, heads, d}, dtype);
        Tensor suffix = test::random_tensor(rng, {tokens, heads, d}, dtype);
        LsePair lse = random_lse_pair(rng, heads, tokens);
        Tensor out = test::nan_tensor({tokens, heads, d}, dtype);
        Tensor out_lse = test::nan_tensor({heads, tokens}, DType::kF32);
        ops::merge_attn_states(out, out_lse.view(), prefix, lse.prefix, suffix, lse.suffix);
        const ref::MergeResult expected = reference_merge(prefix, lse.prefix, suffix, lse.suffix);
        EXPECT_TRUE(test::all_close(out, expected.out, test::tolerance_for(dtype)));
        EXPECT_TRUE(test::all_close(out_lse, expected.lse, kLseTolerance));
      }
    }
  }
}

// Runs a merge of 3 tokens x 2 heads x 8 dims with the given LSE values at every position and
// returns {out, lse}.
struct SmallMerge {
  Tensor prefix, suffix, out, out_lse;
};
SmallMerge merge_with_lse(std::mt19937_64& rng, float prefix_lse, float suffix_lse, DType dtype,
                          bool poison_prefix = false) {
  SmallMerge m{test::random_tensor(rng, {3, 2, 8}, dtype),
               test::random_tensor(rng, {3, 2, 8}, dtype), test::nan_tensor({3, 2, 8}, dtype),
               test::nan_tensor({2, 3}, DType::kF32)};
  if (poison_prefix) test::fill_nan(m.prefix);
  Tensor pl = test::tensor_from(std::vector<double>(6, prefix_lse), {2, 3}, DType::kF32);
  Tensor sl = test::tensor_from(std::vector<double>(6, suffix_lse), {2, 3}, DType::kF32);
  ops::merge_attn_states(m.out, m.out_lse.view(), m.prefix, pl, m.suffix, sl);
  return m;
}

// The orchestrator merges f32 partial results into a 16-bit output: each tensor keeps its dtype.
TEST(MergeAttnStates, MixedDtypesRoundOnlyTheOutput) {
  auto rng = test::make_rng(11);
  const int64_t tokens = 37, heads = 3, d = 64;
  for (DType out_dtype : {DType::kBF16, DType::kF16}) {
    Tensor prefix = test::random_tensor(rng, {tokens, heads, d}, DType::kF32);
    Tensor suffix = test::random_tensor(rng, {tokens, heads, d}, out_dtype);
    LsePair lse = random_lse_pair(rng, heads, tokens);
    Tensor out = test::nan_tensor({tokens, heads, d}, out_dtype);
    ops::merge_attn_states(out, std::nullopt, prefix, lse.prefix, suffix, lse.suffix);
    const ref::MergeResult expected = reference_merge(prefix, lse.prefix, suffix, lse.suffix);
    EXPECT_TRUE(test::all_close(out, expected.out, test::tolerance_for(out_dtype)));
  }
}

TEST(MergeAttnStates, BothSidesEmptyGiveZeroAndNegInf) {
  auto rng = test::make_rng(2);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // -inf/-inf (FA3 empty sets), +inf/+inf (FA2 empty sets), the mixes, and NaN LSEs.
  const float empties[][2] = {{-inf, -inf}, {inf, inf},  {-inf, inf},
                              {inf, -inf},  {nan, -inf}, {nan, nan}};
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const auto& e : empties) {
      SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " lse " << e[0] << ", " << e[1]);
      SmallMerge m = merge_with_lse(rng, e[0], e[1], dtype);
      EXPECT_TRUE(test::all_close(m.out, std::vector<double>(48, 0.0), {0, 0}));
      EXPECT_TRUE(test::all_close(m.out_lse, std::vector<double>(6, -kInf), {0, 0}));
    }
  }
}

TEST(MergeAttnStates, OneEmptySideGivesTheOtherExactly) {
  auto rng = test::make_rng(3);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (float empty : {-inf, inf, nan}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " empty lse " << empty);
      // Empty prefix: weight 1 on the suffix, so out == suffix bit for bit and lse == 0.75.
      SmallMerge m = merge_with_lse(rng, empty, 0.75f, dtype);
      EXPECT_TRUE(test::all_close(m.out, test::to_doubles(m.suffix), {0, 0}));
      EXPECT_TRUE(test::all_close(m.out_lse, std::vector<double>(6, 0.75), {0, 0}));
      // Empty suffix.
      m = merge_with_lse(rng, -2.5f, empty, dtype);
      EXPECT_TRUE(test::all_close(m.out, test::to_doubles(m.prefix), {0, 0}));
      EXPECT_TRUE(test::all_close(m.out_lse, std::vector<double>(6, -2.5), {0, 0}));
    }
  }
}

TEST(MergeAttnStates, EmptySideOutputIsNotRead) {
  // A kernel that reports an empty set may leave NaN in its output (spec F-5): with lse -inf
  // that side has weight 0 and must not turn the merged result into NaN.
  auto rng = test::make_rng(4);
  SmallMerge m = merge_with_lse(rng, -std::numeric_limits<float>::infinity(), 1.5f, DType::kBF16,
                                /*poison_prefix=*/true);
  EXPECT_TRUE(test::all_close(m.out, test::to_doubles(m.suffix), {0, 0}));
}

TEST(MergeAttnStates, EqualLsesAverage) {
  // Equal LSEs weigh both sides 1/2: out = (p + s) / 2, lse = l + ln 2; large LSEs must not
  // overflow (the max is subtracted before exp).
  auto rng = test::make_rng(5);
  SmallMerge m = merge_with_lse(rng, 80.0f, 80.0f, DType::kF32);
  const std::vector<double> p = test::to_doubles(m.prefix), s = test::to_doubles(m.suffix);
  std::vector<double> expected(p.size());
  for (size_t i = 0; i < p.size(); ++i) expected[i] = (p[i] + s[i]) / 2;
  EXPECT_TRUE(test::all_close(m.out, expected, test::tolerance_for(DType::kF32)));
  EXPECT_TRUE(
      test::all_close(m.out_lse, std::vector<double>(6, 80.0 + std::log(2.0)), kLseTolerance));
}

TEST(MergeAttnStates, StridedHeadsLeavePaddingUntouched) {
  // Padded-V prefill output: head stride 192, head size 128 (spec D.3, F-25); the LSEs are
  // transposed views of [T, H] buffers (strides honoured).
  auto rng = test::make_rng(6);
  const int64_t tokens = 37, heads = 5, d = 128, stride = 192;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor prefix_buf = test::random_tensor(rng, {tokens, heads, stride}, dtype);
    Tensor suffix_buf = test::random_tensor(rng, {tokens, heads, stride}, dtype);
    Tensor out_buf = test::nan_tensor({tokens, heads, stride}, dtype);
    Tensor prefix_lse_th = test::random_tensor(rng, {tokens, heads}, DType::kF32);
    Tensor suffix_lse_th = test::random_tensor(rng, {tokens, heads}, DType::kF32);
    Tensor out_lse_th = test::nan_tensor({tokens, heads}, DType::kF32);
    const TensorView prefix = prefix_buf.view().narrow(2, 0, d);
    const TensorView suffix = suffix_buf.view().narrow(2, 0, d);
    const TensorView out = out_buf.view().narrow(2, 0, d);
    const TensorView prefix_lse = prefix_lse_th.view().transpose(0, 1);  // [H, T]
    const TensorView suffix_lse = suffix_lse_th.view().transpose(0, 1);
    const TensorView out_lse = out_lse_th.view().transpose(0, 1);
    ops::merge_attn_states(out, out_lse, prefix, prefix_lse, suffix, suffix_lse);
    const ref::MergeResult expected = reference_merge(prefix, prefix_lse, suffix, suffix_lse);
    EXPECT_TRUE(test::all_close(out, expected.out, test::tolerance_for(dtype)));
    EXPECT_TRUE(test::all_close(out_lse, expected.lse, kLseTolerance));
    const TensorView padding = out_buf.view().narrow(2, d, stride - d);
    EXPECT_TRUE(test::all_close(padding, std::vector<double>(padding.numel(), NAN), {0, 0}));
  }
}

TEST(MergeAttnStates, OutputMayAliasEitherInput) {
  auto rng = test::make_rng(7);
  const int64_t tokens = 50, heads = 3, d = 96;
  for (bool into_prefix : {true, false}) {
    SCOPED_TRACE(into_prefix ? "output = prefix" : "output = suffix");
    Tensor prefix = test::random_tensor(rng, {tokens, heads, d}, DType::kF16);
    Tensor suffix = test::random_tensor(rng, {tokens, heads, d}, DType::kF16);
    LsePair lse = random_lse_pair(rng, heads, tokens);
    const ref::MergeResult expected = reference_merge(prefix, lse.prefix, suffix, lse.suffix);
    // The running LSE is updated in place too, as chunked-context merging does.
    Tensor& out = into_prefix ? prefix : suffix;
    Tensor& out_lse = into_prefix ? lse.prefix : lse.suffix;
    ops::merge_attn_states(out, out_lse.view(), prefix, lse.prefix, suffix, lse.suffix);
    EXPECT_TRUE(test::all_close(out, expected.out, test::tolerance_for(DType::kF16)));
    EXPECT_TRUE(test::all_close(out_lse, expected.lse, kLseTolerance));
  }
}

TEST(MergeAttnStates, OutputLseMayBeOmitted) {
  auto rng = test::make_rng(8);
  const int64_t tokens = 19, heads = 4, d = 64;
  Tensor prefix = test::random_tensor(rng, {tokens, heads, d}, DType::kBF16);
  Tensor suffix = test::random_tensor(rng, {tokens, heads, d}, DType::kBF16);
  LsePair lse = random_lse_pair(rng, heads, tokens);
  Tensor out = test::nan_tensor({tokens, heads, d}, DType::kBF16);
  ops::merge_attn_states(out, std::nullopt, prefix, lse.prefix, suffix, lse.suffix);
  const ref::MergeResult expected = reference_merge(prefix, lse.prefix, suffix, lse.suffix);
  EXPECT_TRUE(test::all_close(out, expected.out, test::tolerance_for(DType::kBF16)));
}

TEST(MergeAttnStates, EmptyTensorsAreANoOp) {
  Tensor states = Tensor::empty({0, 4, 16}, DType::kF32);
  Tensor lse = Tensor::empty({4, 0}, DType::kF32);
  EXPECT_NO_THROW(ops::merge_attn_states(states, lse.view(), states, lse, states, lse));
}

// NumPy 2 gives a zero-size array zero strides: such views read nothing and are accepted (stress
// finding: "must be contiguous in its last dimension, got stride 0").
TEST(MergeAttnStates, EmptyViewsWithZeroStridesAreANoOp) {
  float storage[1] = {0.0f};
  const TensorView states = TensorView::strided(storage, DType::kF32, {0, 4, 16}, {0, 0, 0});
  const TensorView lse = TensorView::strided(storage, DType::kF32, {4, 0}, {0, 0});
  EXPECT_NO_THROW(ops::merge_attn_states(states, lse, states, lse, states, lse));
}

// D = 0: the states have no element and may have no data pointer (the kernel must not offset
// one: fuzz finding, undefined behaviour); the merged LSE is still written.
TEST(MergeAttnStates, ZeroWidthStatesStillMergeTheLse) {
  auto rng = test::make_rng(12);
  const int64_t tokens = 5, heads = 3;
  const LsePair lse = random_lse_pair(rng, heads, tokens);
  const TensorView states = TensorView::contiguous(nullptr, DType::kF32, {tokens, heads, 0});
  const Tensor out_lse = test::nan_tensor({heads, tokens}, DType::kF32);
  ops::merge_attn_states(states, out_lse.view(), states, lse.prefix, states, lse.suffix);
  const ref::MergeResult expected = reference_merge(states, lse.prefix, states, lse.suffix);
  EXPECT_TRUE(test::all_close(out_lse, expected.lse, kLseTolerance));
}

TEST(MergeAttnStates, RejectsBadArguments) {
  auto rng = test::make_rng(9);
  const int64_t tokens = 6, heads = 2, d = 16;
  Tensor out = Tensor::empty({tokens, heads, d}, DType::kF32);
  Tensor prefix = test::random_tensor(rng, {tokens, heads, d}, DType::kF32);
  Tensor suffix = test::random_tensor(rng, {tokens, heads, d}, DType::kF32);
  Tensor lse = test::random_tensor(rng, {heads, tokens}, DType::kF32);
  Tensor out_lse = Tensor::empty({heads, tokens}, DType::kF32);
  auto merge = [&](const TensorView& o, const std::optional<TensorView>& ol, const TensorView& p,
                   const TensorView& pl, const TensorView& s,
                   const TensorView& sl) { ops::merge_attn_states(o, ol, p, pl, s, sl); };

  Tensor wrong_heads = Tensor::empty({tokens, heads + 1, d}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(merge(out, out_lse.view(), wrong_heads, lse, suffix, lse),
                          "merge_attn_states: prefix_output must have the [T, H, D] shape of "
                          "output and suffix_output [6, 2, 16], got [6, 3, 16]");
  Tensor wrong_d = Tensor::empty({tokens, heads, d + 1}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(merge(out, out_lse.view(), prefix, lse, wrong_d, lse),
                          "merge_attn_states: suffix_output must have the [T, H, D] shape of "
                          "prefix_output and output [6, 2, 16], got [6, 2, 17]");
  Tensor ints = Tensor::empty({tokens, heads, d}, DType::kI32);
  MLAKIT_EXPECT_THROW_MSG(
      merge(out, out_lse.view(), ints, lse, suffix, lse),
      "merge_attn_states: prefix_output must have dtype f32 or f16 or bf16, got i32");
  MLAKIT_EXPECT_THROW_MSG(merge(ints, out_lse.view(), prefix, lse, suffix, lse),
                          "merge_attn_states: output must have dtype f32 or f16 or bf16, got i32");
  Tensor flat = Tensor::empty({tokens, heads * d}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(merge(flat, out_lse.view(), prefix, lse, suffix, lse),
                          "merge_attn_states: output must have 3 dimensions, got 2");
  // Every other element of prefix: [T, H, D / 2] with strides (H * D, D, 2).
  const TensorView strided_d = TensorView::strided(prefix.view().data, DType::kF32,
                                                   {tokens, heads, d / 2}, {heads * d, d, 2});
  Tensor half = Tensor::empty({tokens, heads, d / 2}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(merge(half, std::nullopt, strided_d, lse, half, lse),
                          "merge_attn_states: prefix_output must be contiguous in its last "
                          "dimension, got stride 2");

  Tensor lse_t = test::random_tensor(rng, {tokens, heads}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(
      merge(out, out_lse.view(), prefix, lse_t, suffix, lse),
      "merge_attn_states: prefix_lse.shape[0] must equal output.shape[1] (heads H) = 2, got 6");
  Tensor lse_bf16 = Tensor::empty({heads, tokens}, DType::kBF16);
  MLAKIT_EXPECT_THROW_MSG(merge(out, out_lse.view(), prefix, lse, suffix, lse_bf16),
                          "merge_attn_states: suffix_lse must have dtype f32, got bf16");
  Tensor short_lse = Tensor::empty({heads, tokens - 1}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(
      merge(out, short_lse.view(), prefix, lse, suffix, lse),
      "merge_attn_states: output_lse.shape[1] must equal output.shape[0] (tokens T) = 6, got 5");

  // Partial overlap: output shifted by one token inside the prefix buffer.
  Tensor big = test::random_tensor(rng, {tokens + 1, heads, d}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(
      merge(big.view().narrow(0, 1, tokens), std::nullopt, big.view().narrow(0, 0, tokens), lse,
            suffix, lse),
      "merge_attn_states: output overlaps prefix_output without being the same view");

  TensorView on_gpu = out.view();
  on_gpu.device = Device::cuda(0);
  MLAKIT_EXPECT_THROW_MSG(merge(on_gpu, std::nullopt, prefix, lse, suffix, lse),
                          "merge_attn_states: prefix_output is on cpu but output is on cuda:0");
#ifndef MLAKIT_WITH_CUDA  // with the CUDA backend these host pointers would reach a real kernel
  TensorView p_gpu = prefix.view(), s_gpu = suffix.view(), pl_gpu = lse.view(), sl_gpu = lse.view();
  for (TensorView* t : {&p_gpu, &s_gpu, &pl_gpu, &sl_gpu}) t->device = Device::cuda(0);
  MLAKIT_EXPECT_THROW_MSG(merge(on_gpu, std::nullopt, p_gpu, pl_gpu, s_gpu, sl_gpu),
                          "merge_attn_states: no kernel for cuda:0");
#endif
}

}  // namespace
}  // namespace mlakit
