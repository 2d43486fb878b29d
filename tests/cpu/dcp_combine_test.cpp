// ops::dcp_lse_combine and ops::dcp_lse_correct on CPU (spec A.9, C.6, D.12 "dcp_lse_reduce"):
// W ranks simulated in one process. Each request's keys are split by the interleave rule, every
// rank's partial attention comes from the fp64 oracle over its own keys, and the combine must
// equal the oracle over all keys. Ranks without a key of a request hand over NaN outputs with
// lse -inf (spec F-5) and must not leak them (F-10, F-12). Also gather_rows_and_maybe_dequant,
// the reorganisation of an all-gathered context chunk.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "common/cache_reference.hpp"
#include "common/paged_cache.hpp"
#include "common/test_util.hpp"
#include "mlakit/dcp.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"
#include "reference/reference.hpp"

namespace mlakit {
namespace {

constexpr double kScale = 0.1352338;  // DeepSeek-V3's softmax scale (DESIGN.md §1)
constexpr double kInf = std::numeric_limits<double>::infinity();

struct CombineCase {
  int64_t w = 2;
  int64_t interleave = 1;
  std::vector<int64_t> seq_lens;  // one query token per request
  DType partial_dtype = DType::kF32;
  DType out_dtype = DType::kF32;
  int64_t heads = 4;
  int64_t dqk = 80;  // small widths keep the oracle fast; the op does not care
  int64_t dv = 64;
};

// Partial results of every rank (as the ops take them), and the oracle over all keys.
struct Partials {
  Tensor out_storage;                // [W, T, H, dv + 3]: a strided view's storage
  TensorView out;                    // [W, T, H, dv]; NaN for a rank without keys
  Tensor lse;                        // f32 [W, T, H]; -inf for a rank without keys
  std::vector<double> expected_out;  // [T, H, dv]
  std::vector<double> expected_lse;  // [T, H]
};

Partials make_partials(const CombineCase& c, std::mt19937_64& rng) {
  const int64_t t_count = static_cast<int64_t>(c.seq_lens.size());
  const int64_t h = c.heads;
  std::normal_distribution<double> normal(0.0, 1.0);
  Partials p;
  p.out_storage = test::nan_tensor({c.w, t_count, h, c.dv + 3}, c.partial_dtype);
  p.out = p.out_storage.view().narrow(3, 0, c.dv);
  p.lse = test::nan_tensor({c.w, t_count, h}, DType::kF32);
  for (int64_t t = 0; t < t_count; ++t) {
    const int64_t s = c.seq_lens[t];
    std::vector<double> q(h * c.dqk), k(s * c.dqk), v(s * c.dv);
    for (double& x : q) x = normal(rng);
    for (double& x : k) x = normal(rng);
    for (double& x : v) x = normal(rng);
    const ref::AttentionResult all =
        ref::attention(q, k, v, 1, s, h, 1, c.dqk, c.dv, kScale, /*causal=*/false);
    p.expected_out.insert(p.expected_out.end(), all.out.begin(), all.out.end());
    p.expected_lse.insert(p.expected_lse.end(), all.lse.begin(), all.lse.end());
    for (int64_t rank = 0; rank < c.w; ++rank) {
      std::vector<double> kr, vr;
      for (int64_t pos = 0; pos < s; ++pos) {
        if (dcp_owner_rank(pos, c.w, c.interleave) != rank) continue;
        kr.insert(kr.end(), k.begin() + pos * c.dqk, k.begin() + (pos + 1) * c.dqk);
        vr.insert(vr.end(), v.begin() + pos * c.dv, v.begin() + (pos + 1) * c.dv);
      }
      const int64_t sr = static_cast<int64_t>(kr.size()) / c.dqk;
      const ref::AttentionResult part =
          ref::attention(q, kr, vr, 1, sr, h, 1, c.dqk, c.dv, kScale, /*causal=*/false);
      for (int64_t head = 0; head < h; ++head) {
        p.lse.data<float>()[(rank * t_count + t) * h + head] =
            sr == 0 ? -INFINITY : static_cast<float>(part.lse[head]);
        if (sr == 0) continue;  // stays NaN: what a decode kernel without F-5's fix leaves
        for (int64_t i = 0; i < c.dv; ++i) {
          store_float(p.out.data, c.partial_dtype,
                      rank * p.out.strides[0] + t * p.out.strides[1] + head * p.out.strides[2] + i,
                      static_cast<float>(part.out[head * c.dv + i]));
        }
      }
    }
  }
  return p;
}

// Rank k's [T, H, dv] slice of a [W, T, H, dv] view (strides kept).
TensorView rank_view(const TensorView& partial, int64_t rank) {
  return TensorView::strided(partial.element_ptr(rank * partial.strides[0]), partial.dtype,
                             {partial.shape[1], partial.shape[2], partial.shape[3]},
                             {partial.strides[1], partial.strides[2], partial.strides[3]});
}

// Lengths with every kind of rank share: none, one token, fewer than a turn, many turns.
std::vector<int64_t> interesting_lengths(int64_t w, int64_t interleave) {
  return {0, 1, std::max<int64_t>(1, w * interleave - 1), w * interleave + 1, 300, 1000};
}

void check_combine(const CombineCase& c, uint64_t stream) {
  auto rng = test::make_rng(stream);
  const Partials p = make_partials(c, rng);
  const int64_t t_count = static_cast<int64_t>(c.seq_lens.size());
  Tensor out_storage = test::nan_tensor({t_count, c.heads, c.dv + 5}, c.out_dtype);
  const TensorView out = out_storage.view().narrow(2, 0, c.dv);
  Tensor out_lse = test::nan_tensor({t_count, c.heads}, DType::kF32);
  ops::dcp_lse_combine(p.out, p.lse, out, out_lse.view());
  // Inputs rounded to the partial dtype, outputs to out's: the looser of the two tolerances.
  const test::Tolerance tol = c.partial_dtype == DType::kF32 ? test::tolerance_for(c.out_dtype)
                                                             : test::tolerance_for(c.partial_dtype);
  EXPECT_TRUE(test::all_close(out, p.expected_out, tol)) << "out";
  EXPECT_TRUE(test::all_close(out_lse, p.expected_lse, {2e-5, 2e-5})) << "lse";

  // Each rank's correction, summed over the ranks in rank order, is the same combine.
  const int64_t hr = c.heads / c.w;
  std::vector<double> summed(t_count * c.heads * c.dv, 0.0);
  std::vector<float> summed_f32(summed.size(), 0.0f);
  for (int64_t rank = 0; rank < c.w; ++rank) {
    Tensor corrected = test::nan_tensor({c.w, t_count, hr, c.dv}, DType::kF32);
    ops::dcp_lse_correct(rank_view(p.out, rank), p.lse, rank, corrected.view().transpose(0, 1));
    for (int64_t k = 0; k < c.w; ++k) {
      for (int64_t t = 0; t < t_count; ++t) {
        for (int64_t n = 0; n < hr; ++n) {
          for (int64_t i = 0; i < c.dv; ++i) {
            const float x = corrected.data<float>()[((k * t_count + t) * hr + n) * c.dv + i];
            const int64_t at = (t * c.heads + k * hr + n) * c.dv + i;
            summed_f32[at] += x;
          }
        }
      }
    }
  }
  for (size_t i = 0; i < summed.size(); ++i) summed[i] = summed_f32[i];
  if (c.out_dtype == DType::kF32) {
    // Same weights, same order; only the compiler's contraction of products into FMAs differs.
    EXPECT_TRUE(test::all_close(out, summed, {1e-6, 1e-6})) << "corrected partials, summed";
  }
  const Tensor summed_tensor = test::tensor_from(summed, {t_count, c.heads, c.dv}, DType::kF32);
  const test::Tolerance f32_tol = c.partial_dtype == DType::kF32
                                      ? test::tolerance_for(DType::kF32)
                                      : test::tolerance_for(c.partial_dtype);
  EXPECT_TRUE(test::all_close(summed_tensor, p.expected_out, f32_tol)) << "summed vs oracle";
}

TEST(DcpLseCombine, MatchesTheOracleOverAllKeys) {
  uint64_t stream = 1600;
  for (int64_t w : {1, 2, 4, 8}) {
    for (int64_t interleave : {1, 16, 64}) {
      for (DType partial : {DType::kF32, DType::kBF16}) {
        CombineCase c;
        c.w = w;
        c.interleave = interleave;
        c.heads = 8;
        c.seq_lens = interesting_lengths(w, interleave);
        c.partial_dtype = partial;
        c.out_dtype = partial == DType::kF32 ? DType::kF32 : DType::kBF16;
        SCOPED_TRACE(testing::Message()
                     << "W " << w << " I " << interleave << " partial " << dtype_name(partial));
        check_combine(c, ++stream);
      }
    }
  }
}

TEST(DcpLseCombine, AllRanksEmptyGivesZeroAndMinusInfinity) {
  for (float lse : {-INFINITY, INFINITY, NAN}) {  // +inf and NaN read as -inf (spec F-3)
    Tensor partial = test::nan_tensor({3, 2, 2, 8}, DType::kF32);
    Tensor partial_lse = Tensor::empty({3, 2, 2}, DType::kF32);
    for (int64_t i = 0; i < partial_lse.numel(); ++i) partial_lse.data<float>()[i] = lse;
    Tensor out = test::nan_tensor({2, 2, 8}, DType::kF32);
    Tensor out_lse = test::nan_tensor({2, 2}, DType::kF32);
    ops::dcp_lse_combine(partial, partial_lse, out, out_lse.view());
    EXPECT_TRUE(test::all_close(out, std::vector<double>(32, 0.0), {0, 0}));
    EXPECT_TRUE(test::all_close(out_lse, std::vector<double>(4, -kInf), {0, 0}));
    Tensor corrected = test::nan_tensor({2, 3, 0, 8}, DType::kF32);  // 2 heads over 3 ranks: no
    MLAKIT_EXPECT_THROW_MSG(
        ops::dcp_lse_correct(rank_view(partial, 0), partial_lse, 0, corrected.view()),
        "must be a multiple of the ranks 3");
  }
}

TEST(DcpLseCombine, BadArgumentsThrow) {
  Tensor partial = Tensor::zeros({2, 3, 4, 8}, DType::kF32);
  Tensor lse = Tensor::zeros({2, 3, 4}, DType::kF32);
  Tensor out = Tensor::zeros({3, 4, 8}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(
      ops::dcp_lse_combine(partial, Tensor::zeros({2, 3, 5}, DType::kF32), out, std::nullopt),
      "partial_lse_tokens_heads.shape[2] must equal 4");
  MLAKIT_EXPECT_THROW_MSG(
      ops::dcp_lse_combine(partial, Tensor::zeros({2, 3, 4}, DType::kBF16), out, std::nullopt),
      "partial_lse_tokens_heads must have dtype f32");
  MLAKIT_EXPECT_THROW_MSG(ops::dcp_lse_combine(partial, lse, rank_view(partial, 1), std::nullopt),
                          "out must not overlap partial_out");
  // The LSEs inside out: the combine read LSEs it had already overwritten (status OK, wrong out).
  Tensor shared = Tensor::zeros({3 * 4 * 8}, DType::kF32);
  const TensorView lse_inside_out = shared.view().narrow(0, 64, 24).reshape({2, 3, 4});
  MLAKIT_EXPECT_THROW_MSG(
      ops::dcp_lse_combine(partial, lse_inside_out, shared.view().reshape({3, 4, 8}), std::nullopt),
      "out must not overlap partial_lse_tokens_heads");
  Tensor corrected = Tensor::zeros({3, 2, 2, 8}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(ops::dcp_lse_correct(out, lse, 2, corrected), "rank must be in [0, 2)");
  MLAKIT_EXPECT_THROW_MSG(
      ops::dcp_lse_correct(out, lse, 0, Tensor::zeros({3, 2, 3, 8}, DType::kF32)),
      "corrected.shape[2] must equal 2");
}

// ---- gather_rows_and_maybe_dequant -------------------------------------------------------------

TEST(GatherRows, DequantizesTheIndexedRowsOfEveryFormat) {
  auto rng = test::make_rng(1650);
  struct Format {
    KvCacheDType kv;
    DType cache_dtype;  // kAuto element type; the rope dtype of fp8_ds_mla
    DType dst_dtype;
    int64_t width;  // entry elements
  };
  const Format formats[] = {{KvCacheDType::kAuto, DType::kBF16, DType::kBF16, 576},
                            {KvCacheDType::kAuto, DType::kBF16, DType::kF32, 576},
                            {KvCacheDType::kFp8E4m3, DType::kU8, DType::kBF16, 576},
                            {KvCacheDType::kFp8DsMla, DType::kBF16, DType::kBF16, 656}};
  for (const Format& f : formats) {
    const int64_t rows = 37, tokens = 50;
    test::PagedBatch batch;
    batch.block_size = 1;
    batch.num_blocks = rows;
    const Tensor cache =
        test::random_paged_cache(rng, batch, f.kv, f.cache_dtype, f.width, f.cache_dtype);
    const TensorView src = cache.view().reshape({rows, f.width});
    std::vector<int64_t> index(tokens);
    for (int64_t& i : index) i = std::uniform_int_distribution<int64_t>(0, rows - 1)(rng);
    const Tensor row_index = test::int_tensor(index, {tokens}, DType::kI32);
    Tensor dst = test::nan_tensor({tokens + 2, 576}, f.dst_dtype);  // 2 rows never written
    const float scale = 0.37f;
    ops::gather_rows_and_maybe_dequant(src, dst, row_index, f.kv, scale);
    const DType entry_dtype = f.kv == KvCacheDType::kAuto ? f.cache_dtype : DType::kU8;
    std::vector<double> expected((tokens + 2) * 576, NAN);
    for (int64_t t = 0; t < tokens; ++t) {
      const auto* entry = static_cast<const uint8_t*>(cache.view().data) +
                          index[t] * f.width * dtype_size(entry_dtype);
      for (int64_t i = 0; i < 576; ++i) {
        expected[t * 576 + i] =
            test::expected_dequant_value(f.kv, f.cache_dtype, f.dst_dtype, scale, entry, i);
      }
    }
    EXPECT_TRUE(test::all_close(dst, expected, {0.0, 0.0})) << kv_cache_dtype_name(f.kv);
  }
}

TEST(GatherRows, BadIndexThrowsAndWritesNothing) {
  const Tensor src = Tensor::zeros({4, 576}, DType::kBF16);
  Tensor dst = test::nan_tensor({2, 576}, DType::kBF16);
  MLAKIT_EXPECT_THROW_MSG(
      ops::gather_rows_and_maybe_dequant(src, dst, test::int_tensor({1, 4}, {2}, DType::kI32),
                                         KvCacheDType::kAuto, 1.0f),
      "row_index[1] = 4 is not a row of src in [0, 4)");
  EXPECT_TRUE(std::isnan(load_float(dst.view().data, DType::kBF16, 0)));
  MLAKIT_EXPECT_THROW_MSG(
      ops::gather_rows_and_maybe_dequant(src, dst, test::int_tensor({0, 1, 2}, {3}, DType::kI32),
                                         KvCacheDType::kAuto, 1.0f),
      "dst.shape[0] must be at least 3");
}

}  // namespace
}  // namespace mlakit
