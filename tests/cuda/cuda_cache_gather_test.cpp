// gather_and_maybe_dequant_cache and cp_gather_cache on the GPU (spec A.7): the CUDA op and the
// CPU op (tests/cpu checks it against an independent reference) gather from one random paged
// cache (permuted block tables, token-granular seq_starts, empty requests) into copies of one
// NaN-poisoned padded destination, which must then be equal bit for bit. Bad index values must be
// skipped and reported through cuda::check_device_errors, never read or written out of bounds.
#include <gtest/gtest.h>

#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <vector>

#include "common/paged_cache.hpp"
#include "common/test_util.hpp"
#include "gpu_test_util.hpp"
#include "mlakit/error.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {
namespace {

using test::Mirrored;

// ---- a random paged batch (common/paged_cache.hpp) ---------------------------------------------

using Batch = test::PagedBatch;
using Indices = test::PagedIndices;
using test::make_paged_indices;
using test::random_paged_batch;

// The device copy of an optional host index tensor (seq_starts).
std::optional<Tensor> device_copy(const std::optional<Tensor>& host) {
  if (!host) return std::nullopt;
  return test::to_device(*host);
}

// ---- gather_and_maybe_dequant_cache -------------------------------------------------------------

struct GatherCase {
  Batch batch;
  KvCacheDType kv = KvCacheDType::kAuto;
  DType cache_dtype = DType::kBF16;  // kAuto only
  DType dst_dtype = DType::kF32;
  int64_t width = 576;  // dst columns
  int64_t pad = 24;     // extra dst columns (row stride width + pad); odd: unaligned rows
  float scale = 0.1f;
  uint64_t stream = 0;
};

std::string describe(const GatherCase& c) {
  std::ostringstream os;
  os << "kv=" << kv_cache_dtype_name(c.kv) << " cache=" << dtype_name(c.cache_dtype)
     << " dst=" << dtype_name(c.dst_dtype) << " W=" << c.width << "+" << c.pad
     << " bs=" << c.batch.block_size << " B=" << c.batch.lens.size()
     << " starts=" << (c.batch.starts.empty() ? "none" : "given");
  return os.str();
}

// Runs the gather on the CPU and on the GPU with the given (possibly corrupted) indices for the
// GPU; returns the host dst buffer (CPU result with `clean`) and the GPU one.
struct GatherRun {
  Tensor cpu, gpu;
};

GatherRun run_gather(const GatherCase& c, const Indices& clean, const Indices& gpu_indices,
                     const std::vector<int64_t>& skipped_tokens = {}) {
  auto rng = test::make_rng(8000 + c.stream);
  const bool ds = c.kv == KvCacheDType::kFp8DsMla;
  const DType cache_dtype = c.kv == KvCacheDType::kAuto ? c.cache_dtype : DType::kU8;
  const Tensor cache = test::random_paged_cache(rng, c.batch, c.kv, cache_dtype,
                                                ds ? kDsMlaEntryBytes : c.width, c.dst_dtype);
  const int64_t rows = clean.num_tokens + 2;
  Tensor cpu = test::nan_tensor({rows, c.width + c.pad}, c.dst_dtype);
  const TensorView dst = cpu.view().narrow(1, 0, c.width);
  const Mirrored d_cache(cache), d_dst(cpu);

  const Tensor d_table = test::to_device(gpu_indices.block_table()),
               d_cu = test::to_device(gpu_indices.cu_seq_lens()),
               d_tts = test::to_device(gpu_indices.token_to_seq());
  const std::optional<Tensor> d_starts = device_copy(gpu_indices.seq_starts());
  ops::gather_and_maybe_dequant_cache(d_cache.device, d_dst.on_device(dst), d_table, d_cu, d_tts,
                                      clean.num_tokens, c.kv, c.scale,
                                      test::optional_view(d_starts));

  const std::optional<Tensor> clean_starts = clean.seq_starts();
  ops::gather_and_maybe_dequant_cache(cache, dst, clean.block_table(), clean.cu_seq_lens(),
                                      clean.token_to_seq(), clean.num_tokens, c.kv, c.scale,
                                      test::optional_view(clean_starts));
  for (int64_t t : skipped_tokens) test::fill_nan(cpu.view().narrow(0, t, 1));
  return {std::move(cpu), test::to_host(d_dst.device)};
}

void run_gather_case(const GatherCase& c) {
  SCOPED_TRACE(describe(c));
  auto rng = test::make_rng(9000 + c.stream);
  const Indices ix = make_paged_indices(rng, c.batch);
  const GatherRun r = run_gather(c, ix, ix);
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
  EXPECT_TRUE(test::same_bits(r.cpu, r.gpu));
}

TEST(CudaGatherAndMaybeDequantCache, AutoSameAndCastDtypes) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(10);
  uint64_t stream = 10;
  for (DType cache : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType dst : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int64_t pad : {24, 1}) {  // aligned rows (vector packs) and odd strides (scalar)
        run_gather_case({.batch = random_paged_batch(rng, 5, 16, true),
                         .kv = KvCacheDType::kAuto,
                         .cache_dtype = cache,
                         .dst_dtype = dst,
                         .width = 40,
                         .pad = pad,
                         .stream = stream++});
      }
    }
  }
  run_gather_case({.batch = {.lens = std::vector<int64_t>(8, 128), .num_blocks = 128},
                   .kv = KvCacheDType::kAuto,
                   .cache_dtype = DType::kBF16,
                   .dst_dtype = DType::kBF16,
                   .stream = stream++});
}

TEST(CudaGatherAndMaybeDequantCache, Fp8TimesScale) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(20);
  uint64_t stream = 20;
  for (DType dst : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (float scale : {0.1f, 1.0f, 3.0f}) {
      run_gather_case({.batch = random_paged_batch(rng, 6, 7, stream % 2 == 0),
                       .kv = KvCacheDType::kFp8E4m3,
                       .dst_dtype = dst,
                       .pad = stream % 3 == 0 ? 1 : 24,
                       .scale = scale,
                       .stream = stream++});
    }
  }
}

TEST(CudaGatherAndMaybeDequantCache, DsMlaTileScalesAndRope) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(30);
  uint64_t stream = 30;
  for (DType dst : {DType::kBF16, DType::kF16}) {
    for (int64_t pad : {24, 1}) {
      run_gather_case({.batch = random_paged_batch(rng, 4, 16, true),
                       .kv = KvCacheDType::kFp8DsMla,
                       .dst_dtype = dst,
                       .pad = pad,
                       .stream = stream++});
    }
  }
}

TEST(CudaGatherAndMaybeDequantCache, BlockSizeOneAndNoTokens) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(40);
  run_gather_case({.batch = random_paged_batch(rng, 3, 1, true), .width = 9, .stream = 40});
  run_gather_case({.batch = {.lens = {0, 0}, .starts = {3, 0}, .block_size = 4, .num_blocks = 4},
                   .width = 8,
                   .stream = 41});
}

// Expects check_device_errors to throw kOutOfRange mentioning `substring`, then to be clear.
void expect_device_error(const std::string& substring) {
  try {
    ops::check_device_errors(Device::cuda(0));
    ADD_FAILURE() << "expected a device-side error containing '" << substring << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find(substring), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0))) << "the error word was not cleared";
}

// Tokens of request b whose position lies in block column `column`.
std::vector<int64_t> tokens_in_column(const Indices& ix, const Batch& b, int64_t request,
                                      int64_t column) {
  std::vector<int64_t> tokens;
  const int64_t start = ix.starts.empty() ? 0 : ix.starts[request];
  for (int64_t t = ix.cu[request]; t < ix.cu[request + 1]; ++t) {
    if ((t - ix.cu[request] + start) / b.block_size == column) tokens.push_back(t);
  }
  return tokens;
}

std::vector<int64_t> tokens_of(const Indices& ix, int64_t request) {
  std::vector<int64_t> tokens(ix.cu[request + 1] - ix.cu[request]);
  std::iota(tokens.begin(), tokens.end(), ix.cu[request]);
  return tokens;
}

TEST(CudaGatherAndMaybeDequantCacheErrors, BadIndicesSkipTheirTokensAndAreReported) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const Batch batch{.lens = {20, 0, 33, 7}, .starts = {5, 0, 40, 2}, .block_size = 16};
  const GatherCase c{.batch = batch, .dst_dtype = DType::kBF16, .width = 64, .stream = 50};
  auto rng = test::make_rng(9050);
  const Indices clean = make_paged_indices(rng, batch);
  {
    Indices bad = clean;
    bad.seq_of_token[3] = 4;  // not a request
    const GatherRun r = run_gather(c, clean, bad, {3});
    expect_device_error("token_to_seq value was not a request index");
    EXPECT_TRUE(test::same_bits(r.cpu, r.gpu));
  }
  {
    Indices bad = clean;
    bad.seq_of_token[25] = 0;  // token 25 belongs to request 2, not to request 0's rows
    const GatherRun r = run_gather(c, clean, bad, {25});
    expect_device_error("do not hold t");
    EXPECT_TRUE(test::same_bits(r.cpu, r.gpu));
  }
  {
    Indices bad = clean;
    bad.starts[2] = -1;
    const GatherRun r = run_gather(c, clean, bad, tokens_of(clean, 2));
    expect_device_error("seq_starts value was negative");
    EXPECT_TRUE(test::same_bits(r.cpu, r.gpu));
  }
  {
    Indices bad = clean;
    bad.starts[3] = static_cast<int64_t>(clean.width) * batch.block_size;  // past the table
    const GatherRun r = run_gather(c, clean, bad, tokens_of(clean, 3));
    expect_device_error("block column >= the block_table width");
    EXPECT_TRUE(test::same_bits(r.cpu, r.gpu));
  }
  {
    Indices bad = clean;
    bad.table[2 * clean.width + 3] = batch.num_blocks;  // request 2, column 3: not a block
    const GatherRun r = run_gather(c, clean, bad, tokens_in_column(clean, batch, 2, 3));
    expect_device_error("not a block id in [0, num_blocks)");
    EXPECT_TRUE(test::same_bits(r.cpu, r.gpu));
  }
  {
    Indices bad = clean;
    bad.table[0 * clean.width + 0] = -1;  // request 0, column 0 (positions 5 .. 15)
    const GatherRun r = run_gather(c, clean, bad, tokens_in_column(clean, batch, 0, 0));
    expect_device_error("not a block id in [0, num_blocks)");
    EXPECT_TRUE(test::same_bits(r.cpu, r.gpu));
  }
}

// ---- cp_gather_cache ----------------------------------------------------------------------------

struct CpCase {
  Batch batch;
  DType dtype = DType::kBF16;
  int64_t width = 576;
  int64_t pad = 8;
  int64_t first_row = 0;  // added to every cu_seq_lens value
  uint64_t stream = 0;
};

// cp_gather_cache on the CPU with `clean` and on the GPU with `gpu_indices` into two copies of a
// poisoned [rows + guard, W + pad] buffer; rows in `skipped` are re-poisoned in the CPU result.
GatherRun run_cp_gather(const CpCase& c, const Indices& clean, const Indices& gpu_indices,
                        const std::vector<int64_t>& skipped = {}) {
  auto rng = test::make_rng(8500 + c.stream);
  const int64_t es = dtype_size(c.dtype);
  Tensor cache = Tensor::empty({c.batch.num_blocks, c.batch.block_size, c.width}, c.dtype);
  auto* bytes = cache.data<uint8_t>();
  for (int64_t i = 0; i < cache.numel() * es; ++i) bytes[i] = static_cast<uint8_t>(rng());
  // dst has the rows cu_seq_lens needs; 3 guard rows follow it in the buffer.
  const int64_t rows = clean.cu.back() + c.first_row, guard = 3;
  Tensor cpu = test::nan_tensor({rows + guard, c.width + c.pad}, c.dtype);
  const TensorView dst = cpu.view().narrow(0, 0, rows).narrow(1, 0, c.width);
  const Mirrored d_cache(cache), d_dst(cpu);

  auto shifted = [&](const Indices& ix) {
    std::vector<int64_t> cu = ix.cu;
    for (int64_t& v : cu) v += c.first_row;
    return test::int_tensor(cu, {ix.batch + 1}, DType::kI32);
  };
  const Tensor d_table = test::to_device(gpu_indices.block_table()),
               d_cu = test::to_device(shifted(gpu_indices));
  const std::optional<Tensor> d_starts = device_copy(gpu_indices.seq_starts());
  ops::cp_gather_cache(d_cache.device, d_dst.on_device(dst), d_table, d_cu, clean.batch,
                       test::optional_view(d_starts));

  const std::optional<Tensor> clean_starts = clean.seq_starts();
  ops::cp_gather_cache(cache, dst, clean.block_table(), shifted(clean), clean.batch,
                       test::optional_view(clean_starts));
  for (int64_t row : skipped) test::fill_nan(cpu.view().narrow(0, row + c.first_row, 1));
  return {std::move(cpu), test::to_host(d_dst.device)};
}

void run_cp_gather_case(const CpCase& c) {
  SCOPED_TRACE(std::string("dtype=") + dtype_name(c.dtype) + " W=" + std::to_string(c.width) + "+" +
               std::to_string(c.pad));
  auto rng = test::make_rng(9500 + c.stream);
  const Indices ix = make_paged_indices(rng, c.batch);
  const GatherRun r = run_cp_gather(c, ix, ix);
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
  EXPECT_TRUE(test::same_bits(r.cpu, r.gpu, false));
}

TEST(CudaCpGatherCache, RawCopyOfEveryEntryFormat) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(60);
  uint64_t stream = 60;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kFp8E4m3}) {
    for (int64_t pad : {8, 1}) {
      run_cp_gather_case({.batch = random_paged_batch(rng, 6, 16, stream % 2 == 0),
                          .dtype = dtype,
                          .pad = pad,
                          .stream = stream++});
    }
  }
  run_cp_gather_case({.batch = random_paged_batch(rng, 5, 16, true),
                      .dtype = DType::kU8,
                      .width = 656,
                      .stream = 70});
  run_cp_gather_case({.batch = random_paged_batch(rng, 7, 5, true),
                      .dtype = DType::kF32,
                      .width = 33,
                      .first_row = 5,
                      .stream = 71});
  // One long request: every split of the grid works on it.
  run_cp_gather_case({.batch = {.lens = {3000}, .starts = {17}, .num_blocks = 200},
                      .dtype = DType::kBF16,
                      .stream = 72});
}

TEST(CudaCpGatherCacheErrors, BadIndicesSkipTheirRowsAndAreReported) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const Batch batch{.lens = {20, 0, 33, 7}, .starts = {5, 0, 40, 2}, .block_size = 16};
  const CpCase c{.batch = batch, .dtype = DType::kBF16, .width = 64, .stream = 80};
  auto rng = test::make_rng(9580);
  const Indices clean = make_paged_indices(rng, batch);
  {
    Indices bad = clean;
    bad.starts[0] = -3;
    const GatherRun r = run_cp_gather(c, clean, bad, tokens_of(clean, 0));
    expect_device_error("cp_gather_cache: a seq_starts value was negative");
    EXPECT_TRUE(test::same_bits(r.cpu, r.gpu, false));
  }
  {
    Indices bad = clean;
    bad.starts[2] = static_cast<int64_t>(clean.width) * batch.block_size - 10;  // runs past
    std::vector<int64_t> past;  // rows of request 2 at positions beyond the table
    for (int64_t p = 10; p < batch.lens[2]; ++p) past.push_back(clean.cu[2] + p);
    GatherRun r = run_cp_gather(c, clean, bad, past);
    expect_device_error("cp_gather_cache: a position needed a block column");
    // The first 10 rows of request 2 came from other positions than in the clean run: compare
    // the other requests' rows, and the guard rows, only.
    for (int64_t row = clean.cu[2]; row < clean.cu[2] + 10; ++row) {
      test::fill_nan(r.cpu.view().narrow(0, row, 1));
      test::fill_nan(r.gpu.view().narrow(0, row, 1));
    }
    EXPECT_TRUE(test::same_bits(r.cpu, r.gpu, false));
  }
  {
    Indices bad = clean;
    bad.table[3 * clean.width + 0] = batch.num_blocks + 5;
    const GatherRun r = run_cp_gather(c, clean, bad, tokens_in_column(clean, batch, 3, 0));
    expect_device_error("cp_gather_cache: a block_table entry was not a block id");
    EXPECT_TRUE(test::same_bits(r.cpu, r.gpu, false));
  }
  {
    // cu_seq_lens past dst's rows (request 3 ends 4 rows beyond): request 3 is skipped and the
    // guard rows after dst stay poisoned.
    Indices bad = clean;
    bad.cu[4] += 4;
    const GatherRun r = run_cp_gather(c, clean, bad, tokens_of(clean, 3));
    expect_device_error("cp_gather_cache: cu_seq_lens was negative, decreasing or beyond");
    EXPECT_TRUE(test::same_bits(r.cpu, r.gpu, false));
  }
  {
    Indices bad = clean;  // decreasing: request 2 ends before it starts
    bad.cu[3] = bad.cu[2] - 1;
    run_cp_gather(c, clean, bad);
    expect_device_error("cp_gather_cache: cu_seq_lens was negative, decreasing or beyond");
  }
}

}  // namespace
}  // namespace mlakit
