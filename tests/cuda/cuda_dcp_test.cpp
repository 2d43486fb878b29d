// The DCP ops on the GPU against the CPU backend (tests/cpu/dcp_*_test.cpp check that one against
// brute force and the fp64 oracle) on the same bytes: dcp_slot_mapping, dcp_lse_combine,
// dcp_lse_correct (with NaN partials behind -inf LSEs, spec F-5/F-10) and
// gather_rows_and_maybe_dequant; bad device indices reach check_device_errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "common/paged_cache.hpp"
#include "common/test_util.hpp"
#include "gpu_test_util.hpp"
#include "mlakit/dcp.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {
namespace {

using test::to_device;
using test::to_host;

TEST(DcpCuda, SlotMappingMatchesTheCpu) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(1900);
  const int64_t tokens = 300, requests = 3, width = 50;
  std::vector<int64_t> positions(tokens), reqs(tokens), table(requests * width);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  for (int64_t t = 0; t < tokens; ++t) {
    positions[t] = t == 5 ? -1 : std::uniform_int_distribution<int64_t>(0, width * 16 - 1)(rng);
    reqs[t] = t % requests;
  }
  const Tensor pos = test::int_tensor(positions, {tokens}, DType::kI64);
  const Tensor req = test::int_tensor(reqs, {tokens}, DType::kI32);
  const Tensor tab = test::int_tensor(table, {requests, width}, DType::kI32);
  for (int64_t interleave : {1, 2, 16, 64}) {
    for (int64_t w : {1, 2, 4, 8}) {
      const DcpConfig dcp{.world_size = w, .rank = w - 1, .interleave = interleave};
      Tensor cpu = test::nan_tensor({tokens}, DType::kI64);
      ops::dcp_slot_mapping(pos, req, tab, 16, dcp, cpu);
      Tensor gpu = to_device(test::nan_tensor({tokens}, DType::kI64));
      ops::dcp_slot_mapping(to_device(pos), to_device(req), to_device(tab), 16, dcp, gpu);
      EXPECT_TRUE(test::same_bits(cpu, to_host(gpu))) << "W " << w << " I " << interleave;
    }
  }
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
  // A negative block id: slot -1 and the error word.
  Tensor gpu = to_device(test::nan_tensor({1}, DType::kI64));
  ops::dcp_slot_mapping(to_device(test::int_tensor({0}, {1}, DType::kI64)),
                        to_device(test::int_tensor({0}, {1}, DType::kI32)),
                        to_device(test::int_tensor({-1}, {1, 1}, DType::kI32)), 16, DcpConfig{},
                        gpu);
  EXPECT_EQ(to_host(gpu).data<int64_t>()[0], -1);
  MLAKIT_EXPECT_THROW_MSG(ops::check_device_errors(Device::cuda(0)), "dcp_slot_mapping");
  // A block id whose slot wraps int64 (block 2^31 - 1 of 2^33-slot pages): slot -1 and the error
  // word, not a negative slot that would skip the token.
  const int64_t huge_block_size = int64_t{1} << 33;
  ops::dcp_slot_mapping(to_device(test::int_tensor({0}, {1}, DType::kI64)),
                        to_device(test::int_tensor({0}, {1}, DType::kI32)),
                        to_device(test::int_tensor({INT32_MAX}, {1, 1}, DType::kI32)),
                        huge_block_size, DcpConfig{}, gpu);
  EXPECT_EQ(to_host(gpu).data<int64_t>()[0], -1);
  MLAKIT_EXPECT_THROW_MSG(ops::check_device_errors(Device::cuda(0)), "overflows int64");
}

// Partials of W ranks with some (rank, token) pairs empty: NaN output behind lse -inf.
struct Partials {
  Tensor out;  // [W, T, H, D]
  Tensor lse;  // f32 [W, T, H]
};
Partials random_partials(std::mt19937_64& rng, int64_t w, int64_t t, int64_t h, int64_t d,
                         DType dtype) {
  Partials p{test::random_tensor(rng, {w, t, h, d}, dtype),
             test::random_tensor(rng, {w, t, h}, DType::kF32, 3.0)};
  for (int64_t k = 0; k < w; ++k) {
    for (int64_t i = 0; i < t; ++i) {
      if ((k + i) % 3 != 0 && i != t - 1) continue;  // the last token: every rank empty
      for (int64_t j = 0; j < h; ++j) {
        p.lse.data<float>()[(k * t + i) * h + j] = -INFINITY;
        for (int64_t x = 0; x < d; ++x)
          store_float(p.out.view().data, dtype, ((k * t + i) * h + j) * d + x, NAN);
      }
    }
  }
  return p;
}

TEST(DcpCuda, LseCombineAndCorrectMatchTheCpu) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(1901);
  for (int64_t w : {1, 2, 4, 8}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const int64_t t = 9, h = 16, d = 512;
      const Partials p = random_partials(rng, w, t, h, d, dtype);
      Tensor cpu_out = test::nan_tensor({t, h, d}, dtype);
      Tensor cpu_lse = test::nan_tensor({t, h}, DType::kF32);
      ops::dcp_lse_combine(p.out, p.lse, cpu_out, cpu_lse.view());
      Tensor gpu_out = to_device(test::nan_tensor({t, h, d}, dtype));
      Tensor gpu_lse = to_device(test::nan_tensor({t, h}, DType::kF32));
      ops::dcp_lse_combine(to_device(p.out), to_device(p.lse), gpu_out, gpu_lse.view());
      // Other summation order and exp: f32 rounding apart; bf16 outputs one rounding apart.
      const test::Tolerance tol =
          dtype == DType::kF32 ? test::Tolerance{1e-5, 1e-5} : test::tolerance_for(dtype);
      EXPECT_TRUE(test::all_close(to_host(gpu_out), test::to_doubles(cpu_out), tol)) << w;
      EXPECT_TRUE(test::all_close(to_host(gpu_lse), test::to_doubles(cpu_lse), {1e-5, 1e-5}));

      const Tensor partial0 = test::random_tensor(rng, {t, h, d}, dtype);
      Tensor cpu_corrected = test::nan_tensor({w, t, h / w, d}, DType::kF32);
      ops::dcp_lse_correct(partial0, p.lse, w - 1, cpu_corrected.view().transpose(0, 1));
      Tensor gpu_corrected = to_device(test::nan_tensor({w, t, h / w, d}, DType::kF32));
      ops::dcp_lse_correct(to_device(partial0), to_device(p.lse), w - 1,
                           gpu_corrected.view().transpose(0, 1));
      EXPECT_TRUE(
          test::all_close(to_host(gpu_corrected), test::to_doubles(cpu_corrected), {1e-5, 1e-5}));
    }
  }
}

TEST(DcpCuda, GatherRowsMatchesTheCpu) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(1902);
  struct Format {
    KvCacheDType kv;
    DType cache_dtype;
    DType dst_dtype;
    int64_t width;
  };
  for (const Format& f : {Format{KvCacheDType::kAuto, DType::kBF16, DType::kBF16, 576},
                          Format{KvCacheDType::kAuto, DType::kBF16, DType::kF32, 576},
                          Format{KvCacheDType::kFp8E4m3, DType::kU8, DType::kBF16, 576},
                          Format{KvCacheDType::kFp8DsMla, DType::kBF16, DType::kBF16, 656}}) {
    const int64_t rows = 77, tokens = 120;
    test::PagedBatch batch;
    batch.block_size = 1;
    batch.num_blocks = rows;
    const Tensor cache =
        test::random_paged_cache(rng, batch, f.kv, f.cache_dtype, f.width, f.cache_dtype);
    std::vector<int64_t> index(tokens);
    for (int64_t& i : index) i = std::uniform_int_distribution<int64_t>(0, rows - 1)(rng);
    const Tensor row_index = test::int_tensor(index, {tokens}, DType::kI32);
    Tensor cpu = test::nan_tensor({tokens + 1, 576}, f.dst_dtype);
    ops::gather_rows_and_maybe_dequant(cache.view().reshape({rows, f.width}), cpu, row_index, f.kv,
                                       0.37f);
    const Tensor src = to_device(cache);
    Tensor gpu = to_device(test::nan_tensor({tokens + 1, 576}, f.dst_dtype));
    ops::gather_rows_and_maybe_dequant(src.view().reshape({rows, f.width}), gpu,
                                       to_device(row_index), f.kv, 0.37f);
    EXPECT_TRUE(test::same_bits(cpu, to_host(gpu))) << kv_cache_dtype_name(f.kv);
  }
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
  const Tensor src = to_device(Tensor::zeros({4, 576}, DType::kBF16));
  Tensor dst = to_device(test::nan_tensor({1, 576}, DType::kBF16));
  ops::gather_rows_and_maybe_dequant(src, dst, to_device(test::int_tensor({4}, {1}, DType::kI32)),
                                     KvCacheDType::kAuto, 1.0f);
  MLAKIT_EXPECT_THROW_MSG(ops::check_device_errors(Device::cuda(0)),
                          "gather_rows_and_maybe_dequant");
  EXPECT_TRUE(std::isnan(load_float(to_host(dst).view().data, DType::kBF16, 0)));
}

}  // namespace
}  // namespace mlakit
