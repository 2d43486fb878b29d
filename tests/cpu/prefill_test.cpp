// ops::mla_prefill on the CPU against the fp64 attention of tests/reference, request by request
// with K = [k_nope | k_pe broadcast over heads] (spec A.5, C.5): random varlen batches, causal
// and not, empty requests, keys shorter than queries, DeepSeek head sizes with k_nope / v as
// views of one kv_b_proj output and a padded output head stride, the chunked-context merge
// identity (C.6), and every argument error.
#include <gtest/gtest.h>

#include <algorithm>
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
// LSEs are f32 sums of O(1)-logit exponentials over a few hundred keys: values below ~10 with a
// few f32 ulps of error from the dot products.
constexpr test::Tolerance kLseTolerance{1e-4, 1e-5};

struct PrefillShape {
  int64_t heads, nope, rope, dv;
};
constexpr PrefillShape kSmall{4, 24, 8, 20};        // tails of every vector loop
constexpr PrefillShape kDeepSeek{2, 128, 64, 128};  // V2-Lite head sizes, few heads (test time)

// Inputs of one mla_prefill call, laid out the way the MLA forward produces them: q with a wider
// row than P + R, k_nope and v as views of one [S, N, P + V] kv_b_proj output, k_pe as the rope
// columns of a [S, 16 + R] buffer, out with a head stride wider than V; out and lse poisoned.
struct PrefillInputs {
  PrefillShape shape;
  std::vector<int64_t> sq, sk;
  int64_t tokens = 0, keys = 0;
  Tensor q_buf, kv_buf, k_pe_buf, out_buf, lse, cu_q, cu_k;
  TensorView q, k_nope, k_pe, v, out;
  int64_t max_q = 0, max_k = 0;
  float scale = 0.0f;
};

std::vector<int64_t> offsets_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu{0};
  for (int64_t len : lengths) cu.push_back(cu.back() + len);
  return cu;
}

// extra_tokens / extra_keys: rows of q / keys past the last request (not attended by anyone).
PrefillInputs make_inputs(std::mt19937_64& rng, DType dtype, const PrefillShape& shape,
                          const std::vector<int64_t>& sq, const std::vector<int64_t>& sk,
                          int64_t extra_tokens = 0, int64_t extra_keys = 0) {
  PrefillInputs in;
  in.shape = shape;
  in.sq = sq;
  in.sk = sk;
  const std::vector<int64_t> cu_q = offsets_of(sq), cu_k = offsets_of(sk);
  in.tokens = cu_q.back() + extra_tokens;
  in.keys = cu_k.back() + extra_keys;
  const int64_t n = shape.heads, dqk = shape.nope + shape.rope;
  const int64_t q_pad = 8, rope_offset = 16;  // arbitrary widenings: strides must be honoured
  const int64_t out_stride = shape.dv == 128 ? 192 : shape.dv + 5;  // 192: padded-V layout
  in.q_buf = test::random_tensor(rng, {in.tokens, n, dqk + q_pad}, dtype);
  in.kv_buf = test::random_tensor(rng, {in.keys, n, shape.nope + shape.dv}, dtype);
  in.k_pe_buf = test::random_tensor(rng, {in.keys, rope_offset + shape.rope}, dtype);
  in.out_buf = test::nan_tensor({in.tokens, n, out_stride}, dtype);
  in.lse = test::nan_tensor({n, in.tokens}, DType::kF32);
  in.q = in.q_buf.view().narrow(2, 0, dqk);
  in.k_nope = in.kv_buf.view().narrow(2, 0, shape.nope);
  in.v = in.kv_buf.view().narrow(2, shape.nope, shape.dv);
  in.k_pe = in.k_pe_buf.view().narrow(1, rope_offset, shape.rope);
  in.out = in.out_buf.view().narrow(2, 0, shape.dv);
  in.cu_q = test::int_tensor(cu_q, {static_cast<int64_t>(cu_q.size())}, DType::kI32);
  in.cu_k = test::int_tensor(cu_k, {static_cast<int64_t>(cu_k.size())}, DType::kI32);
  for (size_t b = 0; b < sq.size(); ++b) {
    in.max_q = std::max(in.max_q, sq[b]);
    in.max_k = std::max(in.max_k, sk[b]);
  }
  in.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dqk)));
  return in;
}

void run_prefill(const PrefillInputs& in, bool causal, bool with_lse = true) {
  ops::mla_prefill(in.q, in.k_nope, in.k_pe, in.v, in.cu_q, in.cu_k, in.max_q, in.max_k, in.scale,
                   causal, in.out, with_lse ? std::optional<TensorView>(in.lse) : std::nullopt);
}

// fp64 result of the whole batch: out [T, N, V], lse [N, T]; rows outside every request and
// queries without visible keys are 0 / -inf.
struct Expected {
  std::vector<double> out, lse;
};
Expected reference_prefill(const PrefillInputs& in, bool causal) {
  const int64_t n = in.shape.heads, p = in.shape.nope, r = in.shape.rope, dv = in.shape.dv;
  const int64_t dqk = p + r;
  Expected e{std::vector<double>(in.tokens * n * dv, 0.0),
             std::vector<double>(n * in.tokens, -kInf)};
  int64_t q0 = 0, k0 = 0;
  for (size_t b = 0; b < in.sq.size(); ++b) {
    const int64_t sq = in.sq[b], sk = in.sk[b];
    const std::vector<double> q = test::to_doubles(in.q.narrow(0, q0, sq));
    const std::vector<double> k_nope = test::to_doubles(in.k_nope.narrow(0, k0, sk));
    const std::vector<double> k_pe = test::to_doubles(in.k_pe.narrow(0, k0, sk));
    const std::vector<double> v = test::to_doubles(in.v.narrow(0, k0, sk));
    std::vector<double> k(sk * n * dqk);  // [sk, N, P + R] = [k_nope | k_pe]
    for (int64_t s = 0; s < sk; ++s) {
      for (int64_t h = 0; h < n; ++h) {
        for (int64_t j = 0; j < p; ++j) k[(s * n + h) * dqk + j] = k_nope[(s * n + h) * p + j];
        for (int64_t j = 0; j < r; ++j) k[(s * n + h) * dqk + p + j] = k_pe[s * r + j];
      }
    }
    const ref::AttentionResult a = ref::attention(q, k, v, sq, sk, n, n, dqk, dv, in.scale, causal);
    std::copy(a.out.begin(), a.out.end(), e.out.begin() + q0 * n * dv);
    for (int64_t i = 0; i < sq; ++i) {
      for (int64_t h = 0; h < n; ++h) e.lse[h * in.tokens + q0 + i] = a.lse[i * n + h];
    }
    q0 += sq;
    k0 += sk;
  }
  return e;
}

// Compares out and lse with the reference and checks the out padding was not written.
void expect_matches_reference(const PrefillInputs& in, bool causal, DType dtype,
                              bool with_lse = true) {
  const Expected e = reference_prefill(in, causal);
  EXPECT_TRUE(test::all_close(in.out, e.out, test::tolerance_for(dtype)));
  if (with_lse) {
    EXPECT_TRUE(test::all_close(in.lse, e.lse, kLseTolerance));
  }
  const int64_t width = in.out_buf.size(2);
  const TensorView padding = in.out_buf.view().narrow(2, in.shape.dv, width - in.shape.dv);
  EXPECT_TRUE(test::all_close(padding, std::vector<double>(padding.numel(), NAN), {0, 0}))
      << "out was written past its head size";
}

// P = 0 (or R = 0) makes k_nope (k_pe) empty, so it may come without a data pointer: the kernel
// must not offset one (fuzz finding, undefined behaviour) and the result is plain attention over
// the other part.
TEST(MlaPrefill, EmptyNopeOrRopePartWithoutDataPointer) {
  auto rng = test::make_rng(40);
  for (const PrefillShape shape : {PrefillShape{4, 0, 8, 20}, PrefillShape{4, 24, 0, 20}}) {
    SCOPED_TRACE(testing::Message() << "P " << shape.nope << " R " << shape.rope);
    PrefillInputs in = make_inputs(rng, DType::kF32, shape, {5, 3}, {7, 3});
    (shape.nope == 0 ? in.k_nope : in.k_pe).data = nullptr;
    run_prefill(in, true);
    expect_matches_reference(in, true, DType::kF32);
  }
}

TEST(MlaPrefill, RandomVarlenBatchesMatchReference) {
  auto rng = test::make_rng(1);
  std::uniform_int_distribution<int64_t> query_len(0, 40), context_len(0, 30), coin(0, 3);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (bool causal : {true, false}) {
      for (int trial = 0; trial < 3; ++trial) {
        std::vector<int64_t> sq, sk;
        for (int b = 0; b < 5; ++b) {
          sq.push_back(query_len(rng));
          // Mostly keys = context + queries (the prefill case); sometimes fewer keys than
          // queries, which leaves the first causal queries without keys.
          sk.push_back(coin(rng) == 0 ? query_len(rng) / 3 : sq.back() + context_len(rng));
        }
        SCOPED_TRACE(testing::Message()
                     << dtype_name(dtype) << (causal ? " causal" : "") << " trial " << trial);
        PrefillInputs in = make_inputs(rng, dtype, kSmall, sq, sk);
        run_prefill(in, causal);
        expect_matches_reference(in, causal, dtype);
      }
    }
  }
}

TEST(MlaPrefill, DeepSeekHeadSizesAcrossKeyBlocks) {
  // d_qk 192, d_v 128, output head stride 192; 300 keys span two key blocks and 130 queries three
  // query tiles, so tiles see the diagonal, partial blocks and whole blocks.
  auto rng = test::make_rng(2);
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (bool causal : {true, false}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dtype) << (causal ? " causal" : ""));
      PrefillInputs in = make_inputs(rng, dtype, kDeepSeek, {130, 1, 65}, {300, 1, 65});
      run_prefill(in, causal);
      expect_matches_reference(in, causal, dtype);
    }
  }
}

TEST(MlaPrefill, ManyHeadsLongRequest) {
  // 128 heads x 300 queries over 400 keys: enough work items for the large (256-row) items on up
  // to 32 threads, with a last item of 44 rows. With 100 context keys the later tiles of an item
  // see the whole first key block (one GEMM over several tiles), the earlier ones part of it.
  // Tiny head sizes keep the fp64 reference fast.
  auto rng = test::make_rng(3);
  const PrefillShape shape{128, 8, 8, 8};
  PrefillInputs in = make_inputs(rng, DType::kBF16, shape, {300}, {400});
  run_prefill(in, /*causal=*/true);
  expect_matches_reference(in, true, DType::kBF16);
}

TEST(MlaPrefill, SixteenHeads) {
  auto rng = test::make_rng(12);
  const PrefillShape shape{16, 24, 8, 20};
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    PrefillInputs in = make_inputs(rng, DType::kF16, shape, {33, 70, 2}, {50, 70, 9});
    run_prefill(in, causal);
    expect_matches_reference(in, causal, DType::kF16);
  }
}

TEST(MlaPrefill, SingleHead) {
  auto rng = test::make_rng(4);
  const PrefillShape shape{1, 32, 16, 32};
  PrefillInputs in = make_inputs(rng, DType::kF16, shape, {70, 3}, {70, 9});
  run_prefill(in, true);
  expect_matches_reference(in, true, DType::kF16);
}

TEST(MlaPrefill, EmptyRequestsAndUncoveredRowsGiveZeroAndNegInf) {
  // Requests with no queries, with no keys (an empty context chunk), and q rows past the last
  // request: every row of out and lse is still written.
  auto rng = test::make_rng(5);
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    PrefillInputs in = make_inputs(rng, DType::kBF16, kSmall, {0, 5, 7, 0, 3}, {4, 0, 7, 0, 20},
                                   /*extra_tokens=*/3, /*extra_keys=*/2);
    run_prefill(in, causal);
    expect_matches_reference(in, causal, DType::kBF16);
  }
}

TEST(MlaPrefill, NoRequestsWritesEveryRowEmpty) {
  auto rng = test::make_rng(6);
  PrefillInputs in = make_inputs(rng, DType::kF32, kSmall, {}, {}, /*extra_tokens=*/4, 1);
  run_prefill(in, true);
  expect_matches_reference(in, true, DType::kF32);
}

TEST(MlaPrefill, FewerKeysThanQueriesCausal) {
  // Bottom-right mask: query i sees keys [0, sk - sq + i]; the first sq - sk queries see none.
  auto rng = test::make_rng(7);
  PrefillInputs in = make_inputs(rng, DType::kF32, kSmall, {90, 10}, {20, 1});
  run_prefill(in, true);
  expect_matches_reference(in, true, DType::kF32);
  EXPECT_EQ(test::element(in.lse, {0, 69}), -kInf);
  EXPECT_EQ(test::element(in.out, {69, 0, 0}), 0.0);
  EXPECT_TRUE(std::isfinite(test::element(in.lse, {0, 70})));
}

TEST(MlaPrefill, LseMayBeOmitted) {
  auto rng = test::make_rng(8);
  PrefillInputs in = make_inputs(rng, DType::kBF16, kSmall, {17, 33}, {17, 50});
  run_prefill(in, true, /*with_lse=*/false);
  expect_matches_reference(in, true, DType::kBF16, /*with_lse=*/false);
  EXPECT_TRUE(std::isnan(test::element(in.lse, {0, 0}))) << "lse written although omitted";
}

TEST(MlaPrefill, NonContiguousInnerDimensions) {
  // Every element of q, k_pe and v two apart (inner stride 2): strides are honoured everywhere.
  auto rng = test::make_rng(9);
  const int64_t tokens = 21, n = 3, p = 16, r = 8, dv = 12;
  Tensor q_buf = test::random_tensor(rng, {tokens, n, 2 * (p + r)}, DType::kF32);
  Tensor k_nope = test::random_tensor(rng, {tokens, n, p}, DType::kF32);
  Tensor k_pe_buf = test::random_tensor(rng, {tokens, 2 * r}, DType::kF32);
  Tensor v_buf = test::random_tensor(rng, {tokens, n, 2 * dv}, DType::kF32);
  Tensor out_buf = test::nan_tensor({tokens, n, 2 * dv}, DType::kF32);
  Tensor lse = test::nan_tensor({n, tokens}, DType::kF32);
  const auto every_other = [](const Tensor& t, std::initializer_list<int64_t> shape) {
    const TensorView& b = t.view();
    return b.ndim == 3
               ? TensorView::strided(b.data, b.dtype, shape, {b.strides[0], b.strides[1], 2})
               : TensorView::strided(b.data, b.dtype, shape, {b.strides[0], 2});
  };
  const TensorView q = every_other(q_buf, {tokens, n, p + r});
  const TensorView k_pe = every_other(k_pe_buf, {tokens, r});
  const TensorView v = every_other(v_buf, {tokens, n, dv});
  const TensorView out = every_other(out_buf, {tokens, n, dv});
  Tensor cu = test::int_tensor({0, 9, tokens}, {3}, DType::kI32);
  const float scale = 0.3f;
  ops::mla_prefill(q, k_nope, k_pe, v, cu, cu, 12, 12, scale, true, out, lse.view());

  PrefillInputs in;  // the same tensors in the reference's terms
  in.shape = {n, p, r, dv};
  in.sq = in.sk = {9, 12};
  in.tokens = in.keys = tokens;
  in.q = q;
  in.k_nope = k_nope;
  in.k_pe = k_pe;
  in.v = v;
  in.scale = scale;
  const Expected e = reference_prefill(in, true);
  EXPECT_TRUE(test::all_close(out, e.out, test::tolerance_for(DType::kF32)));
  EXPECT_TRUE(test::all_close(lse, e.lse, kLseTolerance));
  const TensorView gaps =
      TensorView::strided(static_cast<float*>(out_buf.view().data) + 1, DType::kF32,
                          {tokens, n, dv}, {2 * n * dv, 2 * dv, 2});
  EXPECT_TRUE(test::all_close(gaps, std::vector<double>(gaps.numel(), NAN), {0, 0}));
}

TEST(MlaPrefill, ChunkedContextMergeEqualsFullAttention) {
  // Spec C.6: attention over a context split in two chunks (non-causal, with LSE), merged by
  // merge_attn_states, equals attention over the whole context.
  auto rng = test::make_rng(10);
  const std::vector<int64_t> sq = {12, 30}, ctx_a = {40, 0}, ctx_b = {25, 70};
  std::vector<int64_t> ctx_all;
  for (size_t b = 0; b < sq.size(); ++b) ctx_all.push_back(ctx_a[b] + ctx_b[b]);
  PrefillInputs full = make_inputs(rng, DType::kF32, kSmall, sq, ctx_all);
  run_prefill(full, false);

  // Chunk tensors: request b's first ctx_a[b] keys, then its remaining ctx_b[b] keys.
  PrefillInputs a = make_inputs(rng, DType::kF32, kSmall, sq, ctx_a);
  PrefillInputs b = make_inputs(rng, DType::kF32, kSmall, sq, ctx_b);
  for (PrefillInputs* chunk : {&a, &b}) {
    std::copy_n(full.q_buf.data<float>(), full.q_buf.numel(), chunk->q_buf.data<float>());
  }
  int64_t src = 0, dst_a = 0, dst_b = 0;
  const int64_t kv_row = full.kv_buf.numel() / full.keys, pe_row = full.k_pe_buf.size(1);
  const auto copy_keys = [&](PrefillInputs& chunk, int64_t dst, int64_t count) {
    std::copy_n(full.kv_buf.data<float>() + src * kv_row, count * kv_row,
                chunk.kv_buf.data<float>() + dst * kv_row);
    std::copy_n(full.k_pe_buf.data<float>() + src * pe_row, count * pe_row,
                chunk.k_pe_buf.data<float>() + dst * pe_row);
    src += count;
  };
  for (size_t r = 0; r < sq.size(); ++r) {
    copy_keys(a, dst_a, ctx_a[r]);
    dst_a += ctx_a[r];
    copy_keys(b, dst_b, ctx_b[r]);
    dst_b += ctx_b[r];
  }
  run_prefill(a, false);
  run_prefill(b, false);
  Tensor merged = test::nan_tensor({full.tokens, kSmall.heads, kSmall.dv}, DType::kF32);
  Tensor merged_lse = test::nan_tensor({kSmall.heads, full.tokens}, DType::kF32);
  ops::merge_attn_states(merged, merged_lse.view(), a.out, a.lse, b.out, b.lse);

  const Expected e = reference_prefill(full, false);
  EXPECT_TRUE(test::all_close(merged, e.out, test::tolerance_for(DType::kF32)));
  EXPECT_TRUE(test::all_close(merged_lse, e.lse, kLseTolerance));
}

TEST(MlaPrefill, RejectsBadArguments) {
  auto rng = test::make_rng(11);
  PrefillInputs in = make_inputs(rng, DType::kBF16, kSmall, {5, 3}, {6, 4});
  const TensorView q = in.q, kn = in.k_nope, kp = in.k_pe, v = in.v, out = in.out;
  const TensorView cq = in.cu_q, ck = in.cu_k;
  const std::optional<TensorView> lse = in.lse.view();
  const auto prefill = [&](const TensorView& q_, const TensorView& kn_, const TensorView& kp_,
                           const TensorView& v_, const TensorView& cq_, const TensorView& ck_,
                           int64_t mq, int64_t mk, float scale, const TensorView& out_,
                           const std::optional<TensorView>& lse_) {
    ops::mla_prefill(q_, kn_, kp_, v_, cq_, ck_, mq, mk, scale, true, out_, lse_);
  };
  const auto bf16 = [](std::initializer_list<int64_t> shape) {
    return Tensor::empty(shape, DType::kBF16);
  };
  const auto i32 = [](const std::vector<int64_t>& values) {
    return test::int_tensor(values, {static_cast<int64_t>(values.size())}, DType::kI32);
  };

  // Shapes.
  Tensor q2 = bf16({8, 4 * 32});
  MLAKIT_EXPECT_THROW_MSG(prefill(q2, kn, kp, v, cq, ck, 5, 6, 0.1f, out, lse),
                          "mla_prefill: q must have 3 dimensions, got 2");
  Tensor q_wide = bf16({8, 4, 33});
  MLAKIT_EXPECT_THROW_MSG(prefill(q_wide, kn, kp, v, cq, ck, 5, 6, 0.1f, out, lse),
                          "mla_prefill: q.shape[2] must equal k_nope.shape[2] + k_pe.shape[1] "
                          "(24 + 8 = 32), got 33");
  Tensor kn_heads = bf16({10, 5, 24});
  MLAKIT_EXPECT_THROW_MSG(
      prefill(q, kn_heads, kp, v, cq, ck, 5, 6, 0.1f, out, lse),
      "mla_prefill: k_nope.shape[1] must equal q.shape[1] (heads N) = 4, got 5");
  Tensor kp_rows = bf16({11, 8});
  MLAKIT_EXPECT_THROW_MSG(
      prefill(q, kn, kp_rows, v, cq, ck, 5, 6, 0.1f, out, lse),
      "mla_prefill: k_pe.shape[0] must equal k_nope.shape[0] (keys S) = 10, got 11");
  Tensor v_rows = bf16({9, 4, 20});
  MLAKIT_EXPECT_THROW_MSG(
      prefill(q, kn, kp, v_rows, cq, ck, 5, 6, 0.1f, out, lse),
      "mla_prefill: v.shape[0] must equal k_nope.shape[0] (keys S) = 10, got 9");
  Tensor v_heads = bf16({10, 2, 20});
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v_heads, cq, ck, 5, 6, 0.1f, out, lse),
                          "mla_prefill: v.shape[1] must equal q.shape[1] (heads N) = 4, got 2");
  Tensor out_dv = bf16({8, 4, 24});
  MLAKIT_EXPECT_THROW_MSG(
      prefill(q, kn, kp, v, cq, ck, 5, 6, 0.1f, out_dv, lse),
      "mla_prefill: out.shape[2] must equal v.shape[2] (value width V) = 20, got 24");
  Tensor out_rows = bf16({7, 4, 20});
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v, cq, ck, 5, 6, 0.1f, out_rows, lse),
                          "mla_prefill: out.shape[0] must equal q.shape[0] (tokens T) = 8, got 7");
  Tensor lse_th = Tensor::empty({8, 4}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v, cq, ck, 5, 6, 0.1f, out, lse_th.view()),
                          "mla_prefill: lse.shape[0] must equal q.shape[1] (heads N) = 4, got 8");
  Tensor cu_short = i32({0, 5});
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v, cq, cu_short, 5, 6, 0.1f, out, lse),
                          "mla_prefill: cu_seqlens_k.shape[0] must equal cu_seqlens_q.shape[0] "
                          "(batch B + 1) = 3, got 2");
  Tensor cu_empty = Tensor::empty({0}, DType::kI32);
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v, cu_empty, cu_empty, 5, 6, 0.1f, out, lse),
                          "mla_prefill: cu_seqlens_q.shape[0] must be at least 1, got 0");
  Tensor v_empty = bf16({10, 4, 0});
  Tensor out_empty = bf16({8, 4, 0});
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v_empty, cq, ck, 5, 6, 0.1f, out_empty, lse),
                          "mla_prefill: v.shape[2] must be at least 1, got 0");

  Tensor kn_huge = bf16({10, 4, 4100});
  Tensor q_huge = bf16({8, 4, 4108});
  MLAKIT_EXPECT_THROW_MSG(prefill(q_huge, kn_huge, kp, v, cq, ck, 5, 6, 0.1f, out, lse),
                          "mla_prefill: the CPU kernel takes head sizes up to 4096, got "
                          "q.shape[2] = 4108 and v.shape[2] = 20");

  // Dtypes.
  Tensor q_f16 = Tensor::empty({8, 4, 32}, DType::kF16);
  MLAKIT_EXPECT_THROW_MSG(prefill(q_f16, kn, kp, v, cq, ck, 5, 6, 0.1f, out, lse),
                          "mla_prefill: k_nope must have dtype f16, got bf16");
  Tensor q_i32 = Tensor::empty({8, 4, 32}, DType::kI32);
  MLAKIT_EXPECT_THROW_MSG(prefill(q_i32, kn, kp, v, cq, ck, 5, 6, 0.1f, out, lse),
                          "mla_prefill: q must have dtype f32 or f16 or bf16, got i32");
  Tensor out_i32 = Tensor::empty({8, 4, 20}, DType::kI32);
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v, cq, ck, 5, 6, 0.1f, out_i32, lse),
                          "mla_prefill: out must have dtype f32 or f16 or bf16, got i32");
  Tensor cu_i64 = test::int_tensor({0, 5, 8}, {3}, DType::kI64);
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v, cu_i64, ck, 5, 6, 0.1f, out, lse),
                          "mla_prefill: cu_seqlens_q must have dtype i32, got i64");
  Tensor lse_bf16 = bf16({4, 8});
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v, cq, ck, 5, 6, 0.1f, out, lse_bf16.view()),
                          "mla_prefill: lse must have dtype f32, got bf16");

  // Sequence offsets and maxima.
  Tensor cu_start = i32({1, 5, 8});
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v, cu_start, ck, 5, 6, 0.1f, out, lse),
                          "mla_prefill: cu_seqlens_q[0] must be 0, got 1");
  Tensor cu_down = i32({0, 6, 4});
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v, cq, cu_down, 5, 6, 0.1f, out, lse),
                          "mla_prefill: cu_seqlens_k must be non-decreasing, got cu_seqlens_k[2] "
                          "= 4 after 6");
  Tensor cu_past_q = i32({0, 5, 9});
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v, cu_past_q, ck, 5, 6, 0.1f, out, lse),
                          "mla_prefill: cu_seqlens_q[2] must be at most q.shape[0] (8), got 9");
  Tensor cu_past_k = i32({0, 6, 11});
  MLAKIT_EXPECT_THROW_MSG(
      prefill(q, kn, kp, v, cq, cu_past_k, 5, 6, 0.1f, out, lse),
      "mla_prefill: cu_seqlens_k[2] must be at most k_nope.shape[0] (10), got 11");
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v, cq, ck, 4, 6, 0.1f, out, lse),
                          "mla_prefill: max_seqlen_q must be at least the longest request in "
                          "cu_seqlens_q (5), got 4");
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v, cq, ck, 5, 5, 0.1f, out, lse),
                          "mla_prefill: max_seqlen_k must be at least the longest request in "
                          "cu_seqlens_k (6), got 5");
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v, cq, ck, 5, 6, 0.0f, out, lse),
                          "mla_prefill: scale must be finite and > 0, got 0");
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v, cq, ck, 5, 6, NAN, out, lse),
                          "mla_prefill: scale must be finite and > 0, got nan");

  // Devices.
  TensorView cq_gpu = cq;
  cq_gpu.device = Device::cuda(0);
  MLAKIT_EXPECT_THROW_MSG(prefill(q, kn, kp, v, cq_gpu, ck, 5, 6, 0.1f, out, lse),
                          "mla_prefill: cu_seqlens_q is on cuda:0 but q is on cpu");
  TensorView q_g = q, kn_g = kn, kp_g = kp, v_g = v, ck_g = ck, out_g = out, lse_g = *lse;
  for (TensorView* t : {&q_g, &kn_g, &kp_g, &v_g, &ck_g, &out_g, &lse_g}) {
    t->device = Device::cuda(0);
  }
#ifndef MLAKIT_WITH_CUDA
  MLAKIT_EXPECT_THROW_MSG(prefill(q_g, kn_g, kp_g, v_g, cq_gpu, ck_g, 5, 6, 0.1f, out_g, lse_g),
                          "mla_prefill: no kernel for cuda:0");
#else  // the CUDA backend rejects these head sizes before touching the (host) pointers
  MLAKIT_EXPECT_THROW_MSG(prefill(q_g, kn_g, kp_g, v_g, cq_gpu, ck_g, 5, 6, 0.1f, out_g, lse_g),
                          "mla_prefill: the CUDA kernel takes k_nope.shape[2] = 128");
#endif

  // Nothing was written by the rejected calls.
  EXPECT_TRUE(std::isnan(test::element(in.out, {0, 0, 0})));
}

}  // namespace
}  // namespace mlakit
