// gather_and_maybe_dequant_cache and cp_gather_cache (spec A.7, D.4, D.5) against a reference
// written here: random caches, permuted block tables, token-granular seq_starts, zero-length
// requests, NaN-poisoned padded destinations; the reference addresses and dequantizes every
// token itself and the whole destination buffer must match exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>
#include <vector>

#include "common/cache_reference.hpp"
#include "common/fp8_reference.hpp"
#include "common/paged_cache.hpp"
#include "common/test_util.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/error.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {
namespace {

// ---- a random paged batch (common/paged_cache.hpp) ---------------------------------------------

using Batch = test::PagedBatch;
using test::random_paged_batch;

using test::expected_dequant_value;

struct GatherCase {
  Batch batch;
  KvCacheDType kv = KvCacheDType::kAuto;
  DType cache_dtype = DType::kBF16;  // kAuto only; fp8 formats use u8
  DType dst_dtype = DType::kF32;
  int64_t width = 576;  // dst columns (L + R)
  float scale = 0.1f;
  uint64_t stream = 0;
};

std::string describe(const GatherCase& c) {
  std::ostringstream os;
  os << "kv=" << kv_cache_dtype_name(c.kv) << " cache=" << dtype_name(c.cache_dtype)
     << " dst=" << dtype_name(c.dst_dtype) << " W=" << c.width << " bs=" << c.batch.block_size
     << " nb=" << c.batch.num_blocks << " B=" << c.batch.lens.size()
     << " starts=" << (c.batch.starts.empty() ? "none" : "given");
  return os.str();
}

void run_gather_case(const GatherCase& c) {
  SCOPED_TRACE(describe(c));
  auto rng = test::make_rng(2000 + c.stream);
  const bool ds = c.kv == KvCacheDType::kFp8DsMla;
  const DType cache_dtype = c.kv == KvCacheDType::kAuto ? c.cache_dtype : DType::kU8;
  const int64_t entry_width = ds ? 656 : c.width;
  const Tensor cache =
      test::random_paged_cache(rng, c.batch, c.kv, cache_dtype, entry_width, c.dst_dtype);
  const test::PagedIndices ix = test::make_paged_indices(rng, c.batch);

  // dst: [num_tokens + 2, W] inside a NaN-poisoned [num_tokens + 2, W + 24] buffer.
  const int64_t rows = ix.num_tokens + 2, pad = 24;
  const Tensor buffer = test::nan_tensor({rows, c.width + pad}, c.dst_dtype);
  const TensorView dst = buffer.view().narrow(1, 0, c.width);
  const std::optional<Tensor> seq_starts = ix.seq_starts();

  ops::gather_and_maybe_dequant_cache(cache, dst, ix.block_table(), ix.cu_seq_lens(),
                                      ix.token_to_seq(), ix.num_tokens, c.kv, c.scale,
                                      test::optional_view(seq_starts));

  std::vector<double> expected(buffer.numel(), NAN);
  const int64_t entry_bytes = entry_width * dtype_size(cache_dtype);
  for (int64_t t = 0; t < ix.num_tokens; ++t) {
    const int64_t r = ix.seq_of_token[t];
    const int64_t pos = t - ix.cu[r] + ix.start_of(r);
    const auto [block, offset] = ix.locate(r, pos);
    const uint8_t* entry =
        cache.data<uint8_t>() + (block * c.batch.block_size + offset) * entry_bytes;
    for (int64_t i = 0; i < c.width; ++i) {
      expected[t * (c.width + pad) + i] =
          expected_dequant_value(c.kv, cache_dtype, c.dst_dtype, c.scale, entry, i);
    }
  }
  EXPECT_TRUE(test::all_close(buffer, expected, {0.0, 0.0}));
}

// ---- gather cases -------------------------------------------------------------------------------

// D.4 shape scaled down: 8 requests of 128 tokens (512 in vLLM), bs 16, 128 blocks (1024).
Batch d4_batch() {
  return {.lens = std::vector<int64_t>(8, 128), .block_size = 16, .num_blocks = 128};
}

TEST(GatherAndMaybeDequantCache, D4SizesAutoAndFp8) {
  run_gather_case(
      {.batch = d4_batch(), .kv = KvCacheDType::kAuto, .cache_dtype = DType::kF32, .stream = 0});
  run_gather_case({.batch = d4_batch(), .kv = KvCacheDType::kFp8E4m3, .stream = 1});
}

TEST(GatherAndMaybeDequantCache, AutoCastsToEveryDstDtype) {
  auto rng = test::make_rng(10);
  uint64_t stream = 10;
  for (DType cache : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType dst : {DType::kF32, DType::kBF16, DType::kF16}) {
      run_gather_case({.batch = random_paged_batch(rng, 5, 16, true),
                       .kv = KvCacheDType::kAuto,
                       .cache_dtype = cache,
                       .dst_dtype = dst,
                       .width = 40,
                       .stream = stream++});
    }
  }
}

TEST(GatherAndMaybeDequantCache, Fp8TimesScaleToEveryDstDtype) {
  auto rng = test::make_rng(20);
  uint64_t stream = 20;
  for (DType dst : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (float scale : {0.1f, 1.0f, 3.0f}) {
      run_gather_case({.batch = random_paged_batch(rng, 6, 7, stream % 2 == 0),
                       .kv = KvCacheDType::kFp8E4m3,
                       .dst_dtype = dst,
                       .scale = scale,
                       .stream = stream++});
    }
  }
}

TEST(GatherAndMaybeDequantCache, DsMlaTileScalesAndRopeBits) {
  auto rng = test::make_rng(30);
  uint64_t stream = 30;
  for (DType dst : {DType::kBF16, DType::kF16}) {
    run_gather_case({.batch = random_paged_batch(rng, 4, 16, true),
                     .kv = KvCacheDType::kFp8DsMla,
                     .dst_dtype = dst,
                     .stream = stream++});
  }
}

TEST(GatherAndMaybeDequantCache, BlockSizeOneAndNoTokens) {
  auto rng = test::make_rng(40);
  run_gather_case({.batch = random_paged_batch(rng, 3, 1, true),
                   .kv = KvCacheDType::kAuto,
                   .width = 9,
                   .stream = 40});
  // Only empty requests: nothing is gathered and dst stays poisoned.
  run_gather_case({.batch = {.lens = {0, 0}, .starts = {3, 0}, .block_size = 4, .num_blocks = 4},
                   .width = 8,
                   .stream = 41});
}

// ---- cp_gather_cache ----------------------------------------------------------------------------

struct CpCase {
  Batch batch;
  DType dtype = DType::kBF16;
  int64_t width = 576;
  int64_t first_row = 0;  // cu_seq_lens[0]: dst rows before it stay untouched
  uint64_t stream = 0;
};

void run_cp_gather_case(const CpCase& c) {
  SCOPED_TRACE(std::string("dtype=") + dtype_name(c.dtype) + " W=" + std::to_string(c.width));
  auto rng = test::make_rng(3000 + c.stream);
  const int64_t es = dtype_size(c.dtype);
  Tensor cache = Tensor::empty({c.batch.num_blocks, c.batch.block_size, c.width}, c.dtype);
  auto* cache_bytes = cache.data<uint8_t>();
  for (int64_t i = 0; i < cache.numel() * es; ++i) cache_bytes[i] = static_cast<uint8_t>(rng());
  test::PagedIndices ix = test::make_paged_indices(rng, c.batch);
  for (int64_t& v : ix.cu) v += c.first_row;

  const int64_t rows = ix.cu.back() + 2, pad = 8;
  const Tensor buffer = test::nan_tensor({rows, c.width + pad}, c.dtype);
  const TensorView dst = buffer.view().narrow(1, 0, c.width);
  std::vector<uint8_t> expected(buffer.data<uint8_t>(),
                                buffer.data<uint8_t>() + buffer.numel() * es);
  const std::optional<Tensor> seq_starts = ix.seq_starts();

  ops::cp_gather_cache(cache, dst, ix.block_table(), ix.cu_seq_lens(), ix.batch,
                       test::optional_view(seq_starts));

  for (int64_t r = 0; r < ix.batch; ++r) {
    for (int64_t p = 0; p < c.batch.lens[r]; ++p) {
      const auto [block, offset] = ix.locate(r, ix.start_of(r) + p);
      std::memcpy(&expected[(ix.cu[r] + p) * (c.width + pad) * es],
                  cache_bytes + (block * c.batch.block_size + offset) * c.width * es, c.width * es);
    }
  }
  const auto* actual = buffer.data<uint8_t>();
  const auto diff = std::mismatch(expected.begin(), expected.end(), actual);
  if (diff.first != expected.end()) {
    const int64_t at = diff.first - expected.begin();
    ADD_FAILURE() << "dst differs first at row " << at / ((c.width + pad) * es) << ", byte "
                  << at % ((c.width + pad) * es) << ": got " << int(*diff.second) << ", expected "
                  << int(*diff.first);
  }
}

TEST(CpGatherCache, RawCopyOfEveryEntryFormat) {
  auto rng = test::make_rng(50);
  uint64_t stream = 50;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kFp8E4m3}) {
    run_cp_gather_case(
        {.batch = random_paged_batch(rng, 6, 16, true), .dtype = dtype, .stream = stream++});
  }
  // fp8_ds_mla entries: 656 raw bytes.
  run_cp_gather_case({.batch = random_paged_batch(rng, 5, 16, true),
                      .dtype = DType::kU8,
                      .width = 656,
                      .stream = stream++});
}

TEST(CpGatherCache, D4SizesWithoutStartsAndOffsetRows) {
  auto rng = test::make_rng(60);
  Batch b = d4_batch();
  for (int64_t& len : b.lens) len = std::uniform_int_distribution<int64_t>(0, 128)(rng);
  run_cp_gather_case({.batch = b, .dtype = DType::kBF16, .stream = 60});
  run_cp_gather_case({.batch = random_paged_batch(rng, 7, 5, true),
                      .dtype = DType::kF32,
                      .width = 33,
                      .first_row = 5,
                      .stream = 61});
}

// ---- bad input ----------------------------------------------------------------------------------

// D.5: one request whose seq_starts pushes its positions past the end of its block-table row.
struct OobArgs {
  Tensor cache = Tensor::zeros({3, 64, 128}, DType::kBF16);  // [nb, bs, W]
  Tensor dst = test::nan_tensor({65, 128}, DType::kBF16);
  Tensor block_table = test::int_tensor({1, 2}, {1, 2}, DType::kI32);
  Tensor cu_seq_lens = test::int_tensor({0, 65}, {2}, DType::kI32);
  Tensor token_to_seq = test::int_tensor(std::vector<int64_t>(65, 0), {65}, DType::kI32);
  Tensor seq_starts = test::int_tensor({128}, {1}, DType::kI32);
};

bool all_nan(const Tensor& t) {
  const std::vector<double> v = test::to_doubles(t);
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isnan(x); });
}

TEST(CacheGatherErrors, D5SeqStartPastTableWidthIsOutOfRange) {
  OobArgs a;
  try {
    ops::gather_and_maybe_dequant_cache(a.cache, a.dst, a.block_table, a.cu_seq_lens,
                                        a.token_to_seq, 65, KvCacheDType::kAuto, 1.0f,
                                        a.seq_starts.view());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    const std::string msg = e.what();
    for (const char* part : {"gather_and_maybe_dequant_cache: token 0 of request 0", "position 128",
                             "block column 2", "only 2 columns"}) {
      EXPECT_NE(msg.find(part), std::string::npos) << part << " missing from: " << msg;
    }
  }
  EXPECT_TRUE(all_nan(a.dst)) << "dst was written before the error";

  try {
    ops::cp_gather_cache(a.cache, a.dst, a.block_table, a.cu_seq_lens, 1, a.seq_starts.view());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    const std::string msg = e.what();
    for (const char* part :
         {"cp_gather_cache: dst row 0 of request 0", "position 128", "only 2 columns"}) {
      EXPECT_NE(msg.find(part), std::string::npos) << part << " missing from: " << msg;
    }
  }
  EXPECT_TRUE(all_nan(a.dst)) << "dst was written before the error";

  // Starting at 64 instead, the last token (position 128) is the first one past the table.
  a.seq_starts = test::int_tensor({64}, {1}, DType::kI32);
  MLAKIT_EXPECT_THROW_MSG(ops::gather_and_maybe_dequant_cache(
                              a.cache, a.dst, a.block_table, a.cu_seq_lens, a.token_to_seq, 65,
                              KvCacheDType::kAuto, 1.0f, a.seq_starts.view()),
                          "token 64 of request 0 reads position 128");
  MLAKIT_EXPECT_THROW_MSG(
      ops::cp_gather_cache(a.cache, a.dst, a.block_table, a.cu_seq_lens, 1, a.seq_starts.view()),
      "dst row 64 of request 0 reads position 128");
  EXPECT_TRUE(all_nan(a.dst));
}

TEST(CacheGatherErrors, BadIndexValues) {
  auto gather = [](const OobArgs& a, int64_t num_tokens) {
    ops::gather_and_maybe_dequant_cache(a.cache, a.dst, a.block_table, a.cu_seq_lens,
                                        a.token_to_seq, num_tokens, KvCacheDType::kAuto, 1.0f,
                                        a.seq_starts.view());
  };
  auto cp = [](const OobArgs& a, int64_t batch) {
    ops::cp_gather_cache(a.cache, a.dst, a.block_table, a.cu_seq_lens, batch, a.seq_starts.view());
  };
  {
    OobArgs a;  // block id 3 of a 3-block cache
    a.seq_starts = test::int_tensor({0}, {1}, DType::kI32);
    a.block_table = test::int_tensor({1, 3}, {1, 2}, DType::kI32);
    MLAKIT_EXPECT_THROW_MSG(gather(a, 65), "block_table[0, 1] = 3 (needed by token 64");
    MLAKIT_EXPECT_THROW_MSG(cp(a, 1), "block_table[0, 1] = 3 (needed by dst row 64");
    a.block_table = test::int_tensor({-1, 0}, {1, 2}, DType::kI32);
    MLAKIT_EXPECT_THROW_MSG(gather(a, 65), "block_table[0, 0] = -1");
    MLAKIT_EXPECT_THROW_MSG(cp(a, 1), "is not a block id in [0, 3)");
    EXPECT_TRUE(all_nan(a.dst)) << "dst was written before the error";
  }
  {
    OobArgs a;
    a.seq_starts = test::int_tensor({-1}, {1}, DType::kI32);
    MLAKIT_EXPECT_THROW_MSG(gather(a, 65), "seq_starts[0] must be >= 0, got -1");
    MLAKIT_EXPECT_THROW_MSG(cp(a, 1), "seq_starts[0] must be >= 0, got -1");
  }
  {
    OobArgs a;
    a.seq_starts = test::int_tensor({0}, {1}, DType::kI32);
    std::vector<int64_t> seq(65, 0);
    seq[7] = 1;  // one request only
    a.token_to_seq = test::int_tensor(seq, {65}, DType::kI32);
    MLAKIT_EXPECT_THROW_MSG(gather(a, 65), "token_to_seq[7] = 1 is not a request index in [0, 1)");
  }
  {
    OobArgs a;  // token 64 claims request 0, which owns rows [0, 60)
    a.seq_starts = test::int_tensor({0}, {1}, DType::kI32);
    a.cu_seq_lens = test::int_tensor({0, 60}, {2}, DType::kI32);
    MLAKIT_EXPECT_THROW_MSG(gather(a, 65), "token 60 belongs to request 0");
  }
  {
    OobArgs a;
    a.seq_starts = test::int_tensor({0, 0}, {2}, DType::kI32);
    a.block_table = test::int_tensor({0, 1, 0, 1}, {2, 2}, DType::kI32);
    a.cu_seq_lens = test::int_tensor({0, 40, 30}, {3}, DType::kI32);
    MLAKIT_EXPECT_THROW_MSG(gather(a, 30), "cu_seq_lens must be non-decreasing");
    MLAKIT_EXPECT_THROW_MSG(cp(a, 2), "cu_seq_lens must be non-decreasing");
    a.cu_seq_lens = test::int_tensor({-2, 40, 60}, {3}, DType::kI32);
    MLAKIT_EXPECT_THROW_MSG(cp(a, 2), "cu_seq_lens[0] must be >= 0");
    a.cu_seq_lens = test::int_tensor({0, 40, 66}, {3}, DType::kI32);
    MLAKIT_EXPECT_THROW_MSG(cp(a, 2), "cu_seq_lens[2] = 66 exceeds the 65 rows of dst");
  }
}

TEST(CacheGatherErrors, BadShapesAndDtypes) {
  OobArgs a;
  a.seq_starts = test::int_tensor({0}, {1}, DType::kI32);
  const auto gather = [&](const TensorView& cache, const TensorView& dst, KvCacheDType kv,
                          float scale = 1.0f, int64_t num_tokens = 65) {
    ops::gather_and_maybe_dequant_cache(cache, dst, a.block_table, a.cu_seq_lens, a.token_to_seq,
                                        num_tokens, kv, scale, a.seq_starts.view());
  };
  const Tensor cache_576 = Tensor::zeros({3, 64, 576}, DType::kBF16);
  const Tensor cache_575 = Tensor::zeros({3, 64, 575}, DType::kBF16);
  const Tensor fp8_cache = Tensor::zeros({3, 64, 576}, DType::kU8);
  const Tensor ds_cache = Tensor::zeros({3, 64, 656}, DType::kU8);
  const Tensor dst_bf16 = test::nan_tensor({65, 576}, DType::kBF16);
  const Tensor dst_f32 = test::nan_tensor({65, 576}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(
      gather(cache_575, dst_bf16, KvCacheDType::kAuto),
      "src_cache.shape[2] must equal dst.shape[1] (the entry width L + R) = 576, got 575");
  MLAKIT_EXPECT_THROW_MSG(
      gather(cache_576, Tensor::zeros({65, 576}, DType::kI32), KvCacheDType::kAuto),
      "dst must have dtype f32 or f16 or bf16, got i32");
  MLAKIT_EXPECT_THROW_MSG(gather(cache_576, dst_bf16, KvCacheDType::kFp8E4m3),
                          "must have dtype u8 or fp8_e4m3, got bf16");
  MLAKIT_EXPECT_THROW_MSG(gather(fp8_cache, dst_bf16, KvCacheDType::kFp8E4m3, 0.0f),
                          "scale must be finite and > 0");
  MLAKIT_EXPECT_THROW_MSG(gather(ds_cache, dst_f32, KvCacheDType::kFp8DsMla),
                          "dst must have dtype f16 or bf16 for fp8_ds_mla");
  MLAKIT_EXPECT_THROW_MSG(gather(fp8_cache, dst_bf16, KvCacheDType::kFp8DsMla),
                          "src_cache.shape[2] must equal 656");
  MLAKIT_EXPECT_THROW_MSG(
      gather(ds_cache, test::nan_tensor({65, 512}, DType::kBF16), KvCacheDType::kFp8DsMla),
      "dst.shape[1] must equal 576");
  MLAKIT_EXPECT_THROW_MSG(
      gather(cache_576, dst_bf16, KvCacheDType::kAuto, 1.0f, 66),
      "num_tokens must be in [0, min(dst.shape[0] = 65, token_to_seq.shape[0] = 65)], got 66");
  MLAKIT_EXPECT_THROW_MSG(
      gather(cache_576, dst_bf16, KvCacheDType::kAuto, 1.0f, -1),
      "num_tokens must be in [0, min(dst.shape[0] = 65, token_to_seq.shape[0] = 65)], got -1");
  const TensorView overlapping =
      TensorView::strided(dst_bf16.data<void>(), DType::kBF16, {65, 576}, {100, 1});
  MLAKIT_EXPECT_THROW_MSG(gather(cache_576, overlapping, KvCacheDType::kAuto),
                          "dst rows must not overlap");

  const Tensor table_i64 = test::int_tensor({1, 2}, {1, 2}, DType::kI64);
  MLAKIT_EXPECT_THROW_MSG(ops::gather_and_maybe_dequant_cache(
                              cache_576, dst_bf16, table_i64, a.cu_seq_lens, a.token_to_seq, 65,
                              KvCacheDType::kAuto, 1.0f, std::nullopt),
                          "block_table must have dtype i32, got i64");
  MLAKIT_EXPECT_THROW_MSG(
      ops::gather_and_maybe_dequant_cache(cache_576, dst_bf16, a.block_table, a.cu_seq_lens,
                                          test::int_tensor({0}, {1}, DType::kI32), 65,
                                          KvCacheDType::kAuto, 1.0f, std::nullopt),
      "num_tokens must be in [0, min(dst.shape[0] = 65, token_to_seq.shape[0] = 1)], got 65");

  // cp_gather_cache
  MLAKIT_EXPECT_THROW_MSG(
      ops::cp_gather_cache(cache_576, dst_f32, a.block_table, a.cu_seq_lens, 1, std::nullopt),
      "src_cache and dst must have the same dtype, got src_cache bf16 and "
      "dst f32");
  MLAKIT_EXPECT_THROW_MSG(
      ops::cp_gather_cache(cache_575, dst_bf16, a.block_table, a.cu_seq_lens, 1, std::nullopt),
      "dst.shape[1] must equal 575, got 576");
  MLAKIT_EXPECT_THROW_MSG(
      ops::cp_gather_cache(Tensor::zeros({3, 64, 576}, DType::kI32),
                           Tensor::zeros({65, 576}, DType::kI32), a.block_table, a.cu_seq_lens, 1,
                           std::nullopt),
      "src_cache must have dtype f32 or f16 or bf16 or u8 or fp8_e4m3, got i32");
  MLAKIT_EXPECT_THROW_MSG(
      ops::cp_gather_cache(cache_576, dst_bf16, a.block_table, a.cu_seq_lens, 2, std::nullopt),
      "cp_gather_cache: batch_size must be in [0, cu_seq_lens.shape[0] - 1 = 1], got 2");
}

}  // namespace
}  // namespace mlakit
