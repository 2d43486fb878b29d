// ops::mla_decode on CUDA tensors (sm90 kernel) against the fp64 oracle (ref::attention with one
// KV head on the dequantized cache) and against the CPU op on the same data. Paged caches with
// shuffled blocks, NaN in every slot and page the kernel must not read, NaN-filled outputs. GPU
// tests skip without a GPU; the argument checks run anywhere (they throw before any device access).
// Tolerances: see decode_test_support.hpp.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "common/test_util.hpp"
#include "cuda/decode/schedule.hpp"
#include "cuda/decode_test_support.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/error.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/plan.hpp"
#include "reference/reference.hpp"

namespace mlakit {
namespace {

using namespace decode_test;

bool has_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define MLAKIT_SKIP_WITHOUT_GPU() \
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped"

void cuda_ok(cudaError_t status, const char* what) {
  ASSERT_EQ(status, cudaSuccess) << what << ": " << cudaGetErrorString(status);
}

// ---- device side
// ---------------------------------------------------------------------------------

Tensor to_device(const Tensor& host) {
  const TensorView& h = host.view();
  Tensor d = Tensor::empty(std::span<const int64_t>(h.shape, h.ndim), h.dtype, Device::cuda(0));
  const size_t bytes = static_cast<size_t>(h.numel() * h.element_size());
  if (bytes > 0) cuda_ok(cudaMemcpy(d.view().data, h.data, bytes, cudaMemcpyHostToDevice), "H2D");
  return d;
}

Tensor to_host(const Tensor& device) {
  const TensorView& d = device.view();
  Tensor h = Tensor::empty(std::span<const int64_t>(d.shape, d.ndim), d.dtype);
  const size_t bytes = static_cast<size_t>(d.numel() * d.element_size());
  if (bytes > 0) cuda_ok(cudaMemcpy(h.view().data, d.data, bytes, cudaMemcpyDeviceToHost), "D2H");
  return h;
}

// Every byte 0xff: NaN in f32, f16 and bf16.
Tensor device_nan(std::initializer_list<int64_t> shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, Device::cuda(0));
  cuda_ok(cudaMemset(t.view().data, 0xff, static_cast<size_t>(t.numel() * dtype_size(dtype))),
          "memset");
  return t;
}

struct DeviceInputs {
  Tensor q_storage, cache, block_table, seq_lens;
  TensorView q;
};

DeviceInputs upload(const HostInputs& in) {
  DeviceInputs d;
  d.q_storage = to_device(in.q_storage);
  d.q = d.q_storage.view().narrow(3, 0, kDim);
  d.cache = to_device(in.cache);
  d.block_table = to_device(in.block_table);
  d.seq_lens = to_device(in.seq_lens);
  return d;
}

// Results copied back to the host: whole storages (pads included) and the views of the results.
struct Results {
  Tensor out_storage, lse_storage;
  TensorView out, lse;
};

Results results_of(const Case& c, Tensor out_storage, Tensor lse_storage) {
  Results r;
  r.out_storage = std::move(out_storage);
  r.lse_storage = std::move(lse_storage);
  r.out = r.out_storage.view().narrow(3, 0, kRank);
  r.lse = r.lse_storage.view().narrow(2, 0, c.heads);
  return r;
}

DecodeSchedule schedule_for(const Case& c, const TensorView& block_table, int64_t splits) {
  const int64_t max_len = block_table.size(1) * c.block_size;
  return splits > 0
             ? cuda::uniform_decode_schedule(c.batch(), splits, max_len)
             : cuda::plan_decode_splits_cuda(c.batch(), c.s_q, c.heads, max_len, Device::cuda(0));
}

// Runs the CUDA op with `splits` uniform splits (0: plan_decode_splits_cuda) into NaN-filled
// outputs and NaN-filled workspace, on a non-default stream.
Results run_gpu(const Case& c, const DeviceInputs& d, int64_t splits) {
  const DecodeSchedule s = schedule_for(c, d.block_table.view(), splits);
  const Tensor out = device_nan({c.batch(), c.s_q, c.heads, kRank + c.out_pad}, c.out_dtype);
  const Tensor lse = device_nan({c.batch(), c.s_q, c.heads + c.out_pad}, DType::kF32);
  const Tensor ws =
      device_nan({std::max<int64_t>(1, ops::mla_decode_workspace_elems(s, c.s_q, c.heads, kRank))},
                 DType::kF32);
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate");
  ops::mla_decode(d.q, d.cache, d.block_table, d.seq_lens, out.view().narrow(3, 0, kRank),
                  lse.view().narrow(2, 0, c.heads), c.params(), s, ws, Stream{stream});
  cuda_ok(cudaStreamSynchronize(stream), "decode");
  cuda_ok(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return results_of(c, to_host(out), to_host(lse));
}

// The CPU op on the host copies of the same inputs.
Results run_cpu(const Case& c, const HostInputs& in) {
  Tensor out = test::nan_tensor({c.batch(), c.s_q, c.heads, kRank + c.out_pad}, c.out_dtype);
  Tensor lse = test::nan_tensor({c.batch(), c.s_q, c.heads + c.out_pad}, DType::kF32);
  ops::mla_decode(in.q, in.cache, in.block_table, in.seq_lens, out.view().narrow(3, 0, kRank),
                  lse.view().narrow(2, 0, c.heads), c.params());
  return results_of(c, std::move(out), std::move(lse));
}

// ---- comparisons -------------------------------------------------------------------------------

// Pads of the strided outputs must still hold their NaN.
void expect_pads_untouched(const Case& c, const Results& r) {
  if (c.out_pad == 0) return;
  const std::vector<double> out = test::to_doubles(r.out_storage.view());
  const std::vector<double> lse = test::to_doubles(r.lse_storage.view());
  for (size_t i = 0; i < out.size(); ++i) {
    if (static_cast<int64_t>(i) % (kRank + c.out_pad) >= kRank) {
      ASSERT_TRUE(std::isnan(out[i])) << "out pad element " << i << " was written";
    }
  }
  for (size_t i = 0; i < lse.size(); ++i) {
    if (static_cast<int64_t>(i) % (c.heads + c.out_pad) >= c.heads) {
      ASSERT_TRUE(std::isnan(lse[i])) << "lse pad element " << i << " was written";
    }
  }
}

struct References {
  Expected kernel;  // on the values E holds
  Expected exact;   // on the exact dequantized values
  Results cpu;
};

References references(const Case& c, const HostInputs& in) {
  References r;
  r.kernel = reference(c, in.q_kernel, in.k_kernel);
  r.exact = c.exact_inputs() ? r.kernel : reference(c, in.q_exact, in.k_exact);
  r.cpu = run_cpu(c, in);
  return r;
}

void expect_matches(const Case& c, const Results& gpu, const References& ref) {
  EXPECT_TRUE(test::all_close(gpu.out, ref.kernel.out, out_tolerance(c))) << "out vs oracle";
  EXPECT_TRUE(test::all_close(gpu.lse, ref.kernel.lse, kLseTolerance)) << "lse vs oracle";
  const std::vector<double> out = test::to_doubles(gpu.out);
  const std::vector<double> cpu_out = test::to_doubles(ref.cpu.out);
  EXPECT_LT(cos_diff(out, ref.exact.out), cos_bar(c)) << "cosine distance to the exact oracle";
  EXPECT_LT(cos_diff(out, cpu_out), cos_bar(c)) << "cosine distance to the CPU op";
  if (c.exact_inputs()) {
    EXPECT_TRUE(test::all_close(gpu.out, cpu_out, out_tolerance(c))) << "out vs CPU op";
    EXPECT_TRUE(test::all_close(gpu.lse, test::to_doubles(ref.cpu.lse), kLseTolerance))
        << "lse vs CPU op";
  } else {
    // E rounds q or the keys by up to 2^-9 relative: logits move by ~0.01, weights by ~1 %.
    EXPECT_TRUE(test::all_close(gpu.out, cpu_out, {5e-2, 5e-2})) << "out vs CPU op";
    EXPECT_TRUE(test::all_close(gpu.lse, test::to_doubles(ref.cpu.lse), {3e-2, 1e-3}))
        << "lse vs CPU op";
  }
  expect_pads_untouched(c, gpu);
}

// Planned splits and forced ones: 1 (no combine), 3, and 20 (more than a 1000-key request has
// tiles, so some splits are empty).
void check_case(const Case& c, uint64_t stream, std::vector<int64_t> splits = {0, 1, 3, 20}) {
  SCOPED_TRACE(c.name());
  auto rng = test::make_rng(stream);
  const HostInputs in = make_inputs(c, rng);
  const References ref = references(c, in);
  const DeviceInputs d = upload(in);
  for (int64_t s : splits) {
    SCOPED_TRACE(testing::Message() << "splits " << (s == 0 ? "planned" : std::to_string(s)));
    expect_matches(c, run_gpu(c, d, s), ref);
    EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0))) << "good indices were reported";
  }
}

// ---- correctness grids -------------------------------------------------------------------------

// Requests over the lengths the spec names: empty, the shortest valid one (s_q keys: seq_lens
// count the new tokens too), around one and two tiles, long.
std::vector<int32_t> grid_lens(int64_t batch, int64_t s_q) {
  const auto shortest = static_cast<int32_t>(s_q);
  const std::vector<int32_t> lens = {0, shortest, 63, 64, 65, 1000};
  if (batch == 1) return {1000};
  if (batch == 3) return {65, 1000, shortest};
  std::vector<int32_t> out;
  for (int64_t b = 0; b < batch; ++b) out.push_back(lens[b % lens.size()]);
  return out;
}

TEST(MlaDecodeCuda, LengthsBlockSizesAndSpeculativeQueries) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 100;
  for (int64_t bs : {16, 64, 128}) {
    for (int64_t s_q : {1, 2, 4, 8}) {
      Case c;
      c.seq_lens = grid_lens(17, s_q);
      c.block_size = bs;
      c.s_q = s_q;
      check_case(c, stream++);
    }
  }
  for (int64_t batch : {1, 3}) {
    for (int64_t s_q : {1, 2, 4, 8}) {
      Case c;
      c.seq_lens = grid_lens(batch, s_q);
      c.s_q = s_q;
      c.out_dtype = DType::kBF16;
      check_case(c, stream++);
    }
  }
}

TEST(MlaDecodeCuda, ManyHeads) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 200;
  for (int64_t s_q : {1, 2}) {
    Case c;
    c.seq_lens = {1000, 65, 0};
    c.heads = 128;
    c.s_q = s_q;
    c.out_dtype = DType::kBF16;
    check_case(c, stream++, {0, 1, 3});
    Case fp8 = c;  // fp8 cache with scales, fp8 q
    fp8.kv_dtype = KvCacheDType::kFp8E4m3;
    fp8.q_dtype = DType::kFp8E4m3;
    fp8.q_scale = 2.0f;
    fp8.k_scale = 3.0f;
    check_case(fp8, stream++, {0, 3});
  }
}

// 64-row CTAs over 16-bit caches (the wgmma kernel): both element types, row counts that leave
// the last row tile partly empty (40, 120 rows), several row tiles with s_q > 1 (causal), one tile
// spanning four pages, lengths around tile ends.
TEST(MlaDecodeCuda, SixtyFourRowTilesOverSixteenBitCaches) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 250;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (auto [heads, s_q] : {std::pair<int64_t, int64_t>{40, 1}, {40, 3}, {128, 2}}) {
      Case c;
      c.seq_lens = {1000, 130, 0, 64, static_cast<int32_t>(s_q), 127};
      c.heads = heads;
      c.s_q = s_q;
      c.block_size = heads == 128 ? 16 : 64;
      c.cache_dtype = c.q_dtype = dt;
      c.out_dtype = dt;
      check_case(c, stream++);
    }
  }
}

// Rows per request below and around the 16-row CTA: padding rows and s_q > 1 in one row tile.
TEST(MlaDecodeCuda, SmallHeadCounts) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 300;
  for (int64_t heads : {1, 4, 8}) {
    for (int64_t s_q : {1, 2, 3, 8}) {
      Case c;
      const auto sq = static_cast<int32_t>(s_q);
      c.seq_lens = {130, sq + 6, 0, 64, sq};  // two short requests: s_q + 6 and s_q keys
      c.heads = heads;
      c.s_q = s_q;
      c.block_size = 16;
      check_case(c, stream++, {0, 3});
    }
  }
}

TEST(MlaDecodeCuda, CacheFormatsScalesAndOutputDtypes) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 400;
  const DType outs[] = {DType::kF32, DType::kF16, DType::kBF16};
  int next_out = 0;
  auto run = [&](Case c) {
    for (int64_t s_q : {1, 2}) {
      c.seq_lens = grid_lens(3, s_q);
      c.s_q = s_q;
      c.out_dtype = outs[next_out++ % 3];
      check_case(c, stream++, {0, 3});
    }
  };
  for (DType dt : {DType::kBF16, DType::kF16}) {  // 16-bit caches
    Case c;
    c.cache_dtype = c.q_dtype = dt;
    run(c);
  }
  Case f32_q;  // q converted to the cache's type on the way in
  f32_q.q_dtype = DType::kF32;
  run(f32_q);
  for (auto [q_scale, k_scale] : {std::pair{1.0f, 1.0f}, {2.0f, 3.0f}}) {
    for (DType q : {DType::kBF16, DType::kF16, DType::kFp8E4m3, DType::kU8}) {
      Case c;
      c.kv_dtype = KvCacheDType::kFp8E4m3;
      c.q_dtype = q;
      c.q_scale = q_scale;  // applies to an fp8 q only
      c.k_scale = k_scale;
      run(c);
    }
    for (DType act : {DType::kBF16, DType::kF16}) {
      Case c;
      c.kv_dtype = KvCacheDType::kFp8DsMla;
      c.cache_dtype = c.q_dtype = act;
      c.q_scale = q_scale;
      c.k_scale = k_scale;  // the layout carries its own scales; k_scale must not apply
      run(c);
      Case fp8_q = c;  // fp8 q: the rope dtype comes from out
      fp8_q.q_dtype = DType::kFp8E4m3;
      fp8_q.out_dtype = act;
      fp8_q.seq_lens = grid_lens(3, fp8_q.s_q);
      check_case(fp8_q, stream++, {0, 3});
    }
  }
}

TEST(MlaDecodeCuda, StridedQueryOutputAndLse) {
  MLAKIT_SKIP_WITHOUT_GPU();
  Case c;
  c.seq_lens = {50, 0, 129};
  c.s_q = 2;
  c.q_pad = 8;  // rows stay 16-byte aligned: vector loads of q
  c.out_pad = 8;
  c.out_dtype = DType::kBF16;
  check_case(c, 500, {1, 3});
  c.q_pad = 1;  // 1154-byte q rows: the scalar load path
  c.heads = 128;
  check_case(c, 501, {1, 3});
}

TEST(MlaDecodeCuda, EmptyRequestsNeverTouchTheTable) {
  MLAKIT_SKIP_WITHOUT_GPU();
  Case c;
  c.seq_lens = {0, 0, 0};
  auto rng = test::make_rng(600);
  const HostInputs in = make_inputs(c, rng);  // block-table rows are all -1
  const DeviceInputs d = upload(in);
  for (int64_t s : {1, 4}) {
    const Results r = run_gpu(c, d, s);
    for (double v : test::to_doubles(r.out)) ASSERT_EQ(v, 0.0);
    for (double v : test::to_doubles(r.lse)) ASSERT_EQ(v, -std::numeric_limits<double>::infinity());
  }
}

// One case of BadDeviceIndicesGiveNanRows with 16 heads and s_q queries per request: request 0
// is good, 1 has a block id outside the cache, 2 a seq_len beyond the table and, for s_q > 1,
// 3 a seq_len in (0, s_q) (seq_lens count the new tokens too).
void check_bad_indices(int64_t s_q, uint64_t stream) {
  Case c;
  c.seq_lens = {100, 200, 50};
  if (s_q > 1) c.seq_lens.push_back(60);
  c.block_size = 16;
  c.s_q = s_q;
  auto rng = test::make_rng(stream);
  HostInputs in = make_inputs(c, rng);
  const References ref = references(c, in);
  const int64_t width = in.block_table.size(1);
  in.block_table.data<int32_t>()[1 * width + 3] = static_cast<int32_t>(in.cache.size(0));
  in.seq_lens.data<int32_t>()[2] = static_cast<int32_t>(width * c.block_size + 1);
  if (s_q > 1) in.seq_lens.data<int32_t>()[3] = static_cast<int32_t>(s_q - 1);
  const DeviceInputs d = upload(in);
  const int64_t row = c.s_q * c.heads;
  for (int64_t s : {1, 3}) {
    SCOPED_TRACE(testing::Message() << "splits " << s);
    const Results r = run_gpu(c, d, s);
    MLAKIT_EXPECT_THROW_MSG(ops::check_device_errors(Device::cuda(0)),
                            "mla_decode: a seq_lens value was outside");
    EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0))) << "the word was not cleared";
    const std::vector<double> out = test::to_doubles(r.out), lse = test::to_doubles(r.lse);
    const int64_t rows = c.batch() * row;  // requests 1 .. B-1 are bad
    for (int64_t i = row * kRank; i < rows * kRank; ++i) ASSERT_TRUE(std::isnan(out[i])) << i;
    for (int64_t i = row; i < rows; ++i) ASSERT_TRUE(std::isnan(lse[i])) << i;
    const std::vector<double> want_out(ref.kernel.out.begin(),
                                       ref.kernel.out.begin() + row * kRank);
    const std::vector<double> want_lse(ref.kernel.lse.begin(), ref.kernel.lse.begin() + row);
    EXPECT_TRUE(test::all_close(r.out.narrow(0, 0, 1), want_out, out_tolerance(c)));
    EXPECT_TRUE(test::all_close(r.lse.narrow(0, 0, 1), want_lse, kLseTolerance));
  }
}

// Index contents live on the device: a block id outside the cache or a seq_len beyond the table
// turns that request's rows into NaN and leaves the other requests exact.
TEST(MlaDecodeCuda, BadDeviceIndicesGiveNanRows) {
  MLAKIT_SKIP_WITHOUT_GPU();
  for (int64_t s_q : {1, 4}) {  // 16 rows (mma.sync kernel) and 64 rows (wgmma kernel)
    SCOPED_TRACE(testing::Message() << "s_q " << s_q);
    check_bad_indices(s_q, 700 + static_cast<uint64_t>(s_q));
  }
}

// One captured graph, replayed after the device seq_lens and block table change: the schedule
// depends on shapes only, so every replay must match a fresh reference and an eager run bit for
// bit.
TEST(MlaDecodeCuda, GraphReplayFollowsNewLengthsAndTables) {
  MLAKIT_SKIP_WITHOUT_GPU();
  Case c;
  c.s_q = 2;
  c.heads = 16;
  c.block_size = 16;
  c.out_dtype = DType::kBF16;
  const int64_t batch = 5, width = 64, max_len = width * c.block_size;  // up to 1024 keys
  const int64_t num_blocks = batch * width + 4;
  c.seq_lens.assign(batch, 0);
  auto rng = test::make_rng(800);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  // A pool of random entries (bf16, exact in E); q fixed over the rounds.
  Tensor cache = test::nan_tensor({num_blocks, c.block_size, kDim}, DType::kBF16);
  std::vector<double> pool(num_blocks * c.block_size * kDim);
  for (int64_t i = 0; i < num_blocks * c.block_size * kDim; ++i) {
    store_float(cache.view().data, DType::kBF16, i, normal(rng));
    pool[i] = load_float(cache.view().data, DType::kBF16, i);
  }
  Tensor q = test::random_tensor(rng, {batch, c.s_q, c.heads, kDim}, DType::kBF16);
  const std::vector<double> q_seen = test::to_doubles(q.view());

  const Tensor d_cache = to_device(cache), d_q = to_device(q);
  const Tensor d_table = Tensor::empty({batch, width}, DType::kI32, Device::cuda(0));
  const Tensor d_lens = Tensor::empty({batch}, DType::kI32, Device::cuda(0));
  const DecodeSchedule s =
      cuda::plan_decode_splits_cuda(batch, c.s_q, c.heads, max_len, Device::cuda(0));
  ASSERT_GT(s.max_splits, 1) << "5 requests of up to 1024 keys must be split to fill the GPU";
  const Tensor ws =
      device_nan({ops::mla_decode_workspace_elems(s, c.s_q, c.heads, kRank)}, DType::kF32);
  const Tensor out = device_nan({batch, c.s_q, c.heads, kRank}, c.out_dtype);
  const Tensor lse = device_nan({batch, c.s_q, c.heads}, DType::kF32);
  auto decode = [&](cudaStream_t st) {
    ops::mla_decode(d_q, d_cache, d_table, d_lens, out, lse, c.params(), s, ws, Stream{st});
  };

  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  decode(stream);
  cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");

  const std::vector<std::vector<int32_t>> rounds = {
      {1024, 0, 2, 300, 64}, {5, 1000, 0, 0, 777}, {0, 0, 0, 0, 0}, {1024, 1024, 2, 3, 1023}};
  for (const std::vector<int32_t>& lens : rounds) {
    SCOPED_TRACE(testing::PrintToString(lens));
    c.seq_lens = lens;
    std::vector<int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> table(batch * width, -1);
    std::vector<std::vector<double>> keys(batch);
    int64_t next = 0;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t col = 0; col < (lens[b] + c.block_size - 1) / c.block_size; ++col) {
        table[b * width + col] = ids[next++];
      }
      for (int64_t t = 0; t < lens[b]; ++t) {
        const int64_t slot = table[b * width + t / c.block_size] * c.block_size + t % c.block_size;
        keys[b].insert(keys[b].end(), pool.begin() + slot * kDim, pool.begin() + (slot + 1) * kDim);
      }
    }
    cuda_ok(cudaMemcpy(d_table.view().data, table.data(), table.size() * 4, cudaMemcpyHostToDevice),
            "table");
    cuda_ok(cudaMemcpy(d_lens.view().data, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice),
            "lens");
    cuda_ok(cudaGraphLaunch(exec, stream), "replay");
    cuda_ok(cudaStreamSynchronize(stream), "replay sync");
    const Tensor replay_out = to_host(out), replay_lse = to_host(lse);
    const Expected want = reference(c, q_seen, keys);
    EXPECT_TRUE(test::all_close(replay_out.view(), want.out, out_tolerance(c))) << "out";
    EXPECT_TRUE(test::all_close(replay_lse.view(), want.lse, kLseTolerance)) << "lse";

    decode(stream);  // eager, same inputs
    cuda_ok(cudaStreamSynchronize(stream), "eager sync");
    EXPECT_TRUE(test::all_close(to_host(out).view(), test::to_doubles(replay_out.view()), {0, 0}));
    EXPECT_TRUE(test::all_close(to_host(lse).view(), test::to_doubles(replay_lse.view()), {0, 0}));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// ---- argument checks (no GPU needed: every check throws before the device is touched) ----------

TensorView on_cuda(TensorView v) {
  v.device = Device::cuda(0);
  return v;
}

class MlaDecodeCudaErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.seq_lens = {20, 200};
    c_.heads = 4;
    c_.block_size = 16;
    auto rng = test::make_rng(900);
    in_ = make_inputs(c_, rng);
    out_ = Tensor::empty({2, 1, 4, kRank}, DType::kF32);
    lse_ = Tensor::empty({2, 1, 4}, DType::kF32);
    schedule_ = cuda::uniform_decode_schedule(2, 2, in_.block_table.size(1) * 16);
    ws_ = Tensor::empty({64 * 4 * 513}, DType::kF32);
  }
  void run(const TensorView& q, const TensorView& cache, const TensorView& out,
           const ops::DecodeParams& params, const DecodeSchedule& s, const TensorView& ws) {
    ops::mla_decode(on_cuda(q), on_cuda(cache), on_cuda(in_.block_table), on_cuda(in_.seq_lens),
                    on_cuda(out), on_cuda(lse_), params, s, on_cuda(ws));
  }
  void run_with(const ops::DecodeParams& params, const DecodeSchedule& s) {
    run(in_.q, in_.cache, out_, params, s, ws_);
  }

  Case c_;
  HostInputs in_;
  Tensor out_, lse_;
  DecodeSchedule schedule_;
  Tensor ws_;
};

TEST_F(MlaDecodeCudaErrors, ScheduleMustBeUniform) {
  const DecodeSchedule per_request = plan_decode_splits(std::vector<int32_t>{20, 200}, 16, 64);
  ASSERT_NE(per_request.num_splits(0), per_request.num_splits(1));
  MLAKIT_EXPECT_THROW_MSG(run_with(c_.params(), per_request),
                          "mla_decode: on CUDA the schedule must be uniform");
  DecodeSchedule none = schedule_;
  none.max_splits = 0;
  none.split_offsets = {0, 0, 0};
  none.total_splits = 0;
  MLAKIT_EXPECT_THROW_MSG(run_with(c_.params(), none), "must be in [1, 256], got 0");
}

TEST_F(MlaDecodeCudaErrors, UnsupportedShapesAndDtypes) {
  const Tensor f32_cache = Tensor::zeros({4, 16, kDim}, DType::kF32);
  try {
    run(in_.q, f32_cache, out_, c_.params(), schedule_, ws_);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("reads f16 or bf16 caches"), std::string::npos)
        << e.what();
  }
  const Tensor q80 = Tensor::zeros({2, 1, 4, 80}, DType::kBF16);
  const Tensor cache80 = Tensor::zeros({4, 16, 80}, DType::kBF16);
  const Tensor out64 = Tensor::zeros({2, 1, 4, 64}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(run(q80, cache80, out64, c_.params(), schedule_, ws_),
                          "supports kv_lora_rank 512 with qk_rope_head_dim 64");
}

TEST_F(MlaDecodeCudaErrors, MisalignedRows) {
  const Tensor out_storage = Tensor::zeros({2, 1, 4, kRank + 1}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(
      run(in_.q, in_.cache, out_storage.view().narrow(3, 0, kRank), c_.params(), schedule_, ws_),
      "rows of out must start on 16-byte boundaries");
  const Tensor cache_storage = Tensor::zeros({4, 16, kDim + 1}, DType::kBF16);
  MLAKIT_EXPECT_THROW_MSG(
      run(in_.q, cache_storage.view().narrow(2, 0, kDim), out_, c_.params(), schedule_, ws_),
      "kv_cache entries must start on 16-byte boundaries");
}

// The backend-independent checks give the CPU op's messages.
TEST_F(MlaDecodeCudaErrors, SameValidationAsCpu) {
  MLAKIT_EXPECT_THROW_MSG(
      run(in_.q.narrow(3, 0, 575), in_.cache, out_, c_.params(), schedule_, ws_),
      "mla_decode: q.shape[3] must equal 576, got 575");
  const Tensor q8 = Tensor::zeros({2, 1, 4, kDim}, DType::kFp8E4m3);
  MLAKIT_EXPECT_THROW_MSG(run(q8, in_.cache, out_, c_.params(), schedule_, ws_),
                          "fp8 q needs an fp8 kv_cache_dtype");
  const Tensor small = Tensor::empty({2 * 2 * 4 * 513 - 1}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(run(in_.q, in_.cache, out_, c_.params(), schedule_, small),
                          "mla_decode: split_workspace must hold at least");
  ops::DecodeParams p = c_.params();
  p.scale = -1.0f;
  MLAKIT_EXPECT_THROW_MSG(run_with(p, schedule_), "mla_decode: scale must be finite and > 0");
  const Tensor lse16 = Tensor::empty({2, 1, 4}, DType::kBF16);
  MLAKIT_EXPECT_THROW_MSG(
      ops::mla_decode(on_cuda(in_.q), on_cuda(in_.cache), on_cuda(in_.block_table),
                      on_cuda(in_.seq_lens), on_cuda(out_), on_cuda(lse16), c_.params(), schedule_,
                      on_cuda(ws_)),
      "lse_tokens_heads must have dtype f32");
  MLAKIT_EXPECT_THROW_MSG(
      ops::mla_decode(on_cuda(in_.q), in_.cache, on_cuda(in_.block_table), on_cuda(in_.seq_lens),
                      on_cuda(out_), on_cuda(lse_), c_.params(), schedule_, on_cuda(ws_)),
      "kv_cache is on cpu but q is on cuda:0");
  MLAKIT_EXPECT_THROW_MSG(
      ops::mla_decode(on_cuda(in_.q), on_cuda(in_.cache), on_cuda(in_.block_table),
                      on_cuda(in_.seq_lens), on_cuda(out_), on_cuda(lse_), c_.params()),
      "for CUDA tensors pass a schedule from plan_decode_splits_cuda");
}

}  // namespace
}  // namespace mlakit
