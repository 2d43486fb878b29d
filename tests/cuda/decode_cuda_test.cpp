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
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
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

// Captures what `enqueue` puts on `stream` into `graph` and returns its executable graph (the
// capture fails on any host read or allocation inside the op).
template <class Enqueue>
cudaGraphExec_t capture_graph(cudaStream_t stream, cudaGraph_t& graph, Enqueue&& enqueue) {
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  enqueue();
  cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture (no host read, no allocation)");
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  return exec;
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
  Tensor q_storage, cache_storage, block_table, seq_lens;
  TensorView q, cache;
};

DeviceInputs upload(const HostInputs& in) {
  DeviceInputs d;
  d.q_storage = to_device(in.q_storage);
  d.q = d.q_storage.view().narrow(3, 0, kDim);
  d.cache_storage = to_device(in.cache_storage);
  d.cache = d.cache_storage.view().narrow(2, 0, in.cache.size(2));
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

// `parts` parts per row tile (0: the library's plan, one CTA per SM).
DecodeSchedule schedule_for(const Case& c, const TensorView& block_table, int64_t parts,
                            bool invariant) {
  const int64_t max_len = block_table.size(1) * c.block_size;
  return parts > 0
             ? cuda::device_decode_schedule(c.batch(), c.s_q, c.heads, max_len, parts, invariant)
             : ops::plan_mla_decode(
                   {Device::cuda(0), c.batch(), c.s_q, c.heads, c.block_size, max_len, invariant},
                   {});
}

// Runs the CUDA op with `parts` parts (0: planned) into NaN-filled outputs and NaN-filled
// workspace, on a non-default stream.
Results run_gpu(const Case& c, const DeviceInputs& d, int64_t parts, bool invariant = false) {
  const DecodeSchedule s = schedule_for(c, d.block_table.view(), parts, invariant);
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

// The planned parts (balanced and batch-invariant) and forced ones: 1 (no request is split, no
// combine), 3, and 20 (parts cut inside requests; with few keys some parts stay empty).
void check_case(const Case& c, uint64_t stream, std::vector<int64_t> parts = {0, 1, 3, 20}) {
  SCOPED_TRACE(c.name());
  auto rng = test::make_rng(stream);
  const HostInputs in = make_inputs(c, rng);
  const References ref = references(c, in);
  const DeviceInputs d = upload(in);
  for (int64_t p : parts) {
    for (bool invariant : {false, true}) {
      if (invariant && p != 0) continue;  // one batch-invariant run per case
      SCOPED_TRACE(testing::Message() << "parts " << (p == 0 ? "planned" : std::to_string(p))
                                      << (invariant ? " batch-invariant" : ""));
      expect_matches(c, run_gpu(c, d, p, invariant), ref);
      EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0))) << "good indices were reported";
    }
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

// The wgmma kernel loads a segment's q tile by TMA when q is in the MMA element type with whole
// heads per 64 rows (N a multiple or a divisor of 64) and 16-byte strides: tiles of one query's
// heads, of several queries (N 16, 32), and past the last query (zero-filled rows: s_q N not a
// multiple of 64); otherwise its threads load q: N 48, a q row padding of 3 elements (unaligned
// strides), an f16 q over a bf16 cache (converted; with N 32 and s_q 3 also over a second, half
// empty row tile whose rows past the request the threads zero).
TEST(MlaDecodeCuda, QTilesByTmaAndByThreads) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 270;
  struct Shape {
    int64_t heads, s_q, q_pad;
    DType q_dtype;
  };
  for (const Shape& shape :
       {Shape{128, 1, 0, DType::kBF16}, Shape{64, 2, 0, DType::kBF16},
        Shape{32, 5, 0, DType::kBF16}, Shape{16, 3, 0, DType::kBF16}, Shape{16, 4, 8, DType::kBF16},
        Shape{48, 2, 0, DType::kBF16}, Shape{128, 2, 3, DType::kBF16}, Shape{64, 1, 0, DType::kF16},
        Shape{32, 3, 0, DType::kF16}}) {
    Case c;
    c.seq_lens = {700, 5, 0, 129, 64};
    c.heads = shape.heads;
    c.s_q = shape.s_q;
    c.q_pad = shape.q_pad;
    c.q_dtype = shape.q_dtype;
    c.out_dtype = DType::kBF16;
    SCOPED_TRACE(testing::Message() << "heads " << shape.heads << " s_q " << shape.s_q << " q_pad "
                                    << shape.q_pad << " q " << dtype_name(shape.q_dtype));
    check_case(c, stream++);
  }
}

// The wgmma kernel reads pages with TMA boxes: one box per page for block sizes 8, 16 and 32,
// a 64-slot box of the page for multiples of 64; a block size no box fits (24) takes the mma.sync
// 64-row kernel. Lengths end mid-tile and mid-page over NaN-poisoned slots.
TEST(MlaDecodeCuda, SixtyFourRowTilesOverEveryPageShape) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 280;
  for (int64_t bs : {8, 32, 128, 192, 24}) {
    Case c;
    c.seq_lens = {1000, 130, 0, 64, 2, 127, 200};
    c.heads = 128;
    c.s_q = 2;
    c.block_size = bs;
    c.out_dtype = DType::kBF16;
    check_case(c, stream++);
  }
}

// 64-row CTAs over fp8_e4m3 caches: the wgmma kernel's raw TMA boxes (one per page for block sizes
// 8 and 16, a 64-slot box otherwise) converted in place by its third warpgroup, for every q dtype
// (bf16 and f32 q take bf16 MMAs, f16 and fp8 q f16 ones) with both scales applied; block size 24
// takes the mma.sync kernel. Lengths end mid-tile and mid-page over NaN-poisoned slots.
// A 64-row-tile case over an fp8 cache: lengths ending mid-tile and mid-page, both scales set.
Case fp8_row_tile_case(KvCacheDType kv, int64_t heads, int64_t s_q, int64_t block_size,
                       DType q_dtype) {
  Case c;  // check_case traces every field
  c.seq_lens = {1000, 130, 0, 64, static_cast<int32_t>(s_q), 127, 200};
  c.kv_dtype = kv;
  c.heads = heads;
  c.s_q = s_q;
  c.block_size = block_size;
  c.q_dtype = q_dtype;
  c.q_scale = 2.0f;  // applies to an fp8 q only
  c.k_scale = 0.5f;  // fp8_e4m3's; fp8_ds_mla entries carry their own scales and must ignore it
  c.out_dtype = DType::kBF16;
  return c;
}

TEST(MlaDecodeCuda, SixtyFourRowTilesOverFp8E4m3Caches) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 290;
  auto fp8_case = [](int64_t heads, int64_t s_q, int64_t block_size, DType q_dtype) {
    return fp8_row_tile_case(KvCacheDType::kFp8E4m3, heads, s_q, block_size, q_dtype);
  };
  for (const Case& c : {fp8_case(128, 1, 64, DType::kBF16), fp8_case(128, 2, 16, DType::kFp8E4m3),
                        fp8_case(64, 1, 8, DType::kF16), fp8_case(64, 3, 128, DType::kF32),
                        fp8_case(32, 2, 32, DType::kFp8E4m3), fp8_case(128, 1, 24, DType::kBF16)}) {
    check_case(c, stream++, {0, 5});
  }
}

// 64-row CTAs over fp8_ds_mla caches: the wgmma kernel's three TMA maps (the NoPE bytes, converted
// in place with their tile scales by its third warpgroup; the scales, into a ring beside the
// stages; the rope, straight into the operand tile), one box per page for block sizes 8, 16 and 32,
// a 64-slot box otherwise, for both rope dtypes (the MMA element type) and every q dtype. The op
// takes the rope dtype from a 16-bit q, else from out (ds_mla_rope_dtype), so a 16-bit q is
// always in the rope dtype (q by TMA where aligned); f32 and fp8 q are converted by the threads.
// Block size 24 takes the mma.sync kernel. Lengths end mid-tile and mid-page over NaN-poisoned
// slots (NoPE bytes, scales and rope all NaN).
TEST(MlaDecodeCuda, SixtyFourRowTilesOverFp8DsMlaCaches) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 320;
  auto ds_mla_case = [](int64_t heads, int64_t s_q, int64_t block_size, DType rope, DType q_dtype) {
    Case c = fp8_row_tile_case(KvCacheDType::kFp8DsMla, heads, s_q, block_size, q_dtype);
    c.cache_dtype = rope;
    c.out_dtype = rope;  // an fp8 q: the rope dtype is out's
    return c;
  };
  const DType bf16 = DType::kBF16, f16 = DType::kF16, fp8 = DType::kFp8E4m3;
  for (const Case& c :
       {ds_mla_case(128, 1, 64, bf16, bf16), ds_mla_case(128, 2, 16, f16, f16),
        ds_mla_case(64, 1, 8, bf16, DType::kF32), ds_mla_case(64, 3, 128, f16, fp8),
        ds_mla_case(32, 2, 32, bf16, fp8), ds_mla_case(32, 3, 16, bf16, DType::kF32),
        ds_mla_case(128, 1, 24, bf16, bf16)}) {
    check_case(c, stream++, {0, 5});
  }
}

// 16-row CTAs over fp8 caches: raw fp8_ds_mla tiles (a 16-bit q), which land by bulk copies (one
// per run of a page's slots in a tile, one per key when the slots are not contiguous; the keys past
// a segment are zeroed, not copied), raw e4m3 tiles (an fp8 or a 16-bit q) and converted ones (an
// f32 q over fp8_e4m3), both by cp.async. Pages of 1, 16, 24, 64 and 128 slots, lengths ending
// mid-tile and mid-page over NaN-poisoned slots, and a strided cache whose slots are not
// contiguous.
TEST(MlaDecodeCuda, SixteenRowTilesOverFp8PageShapes) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 1300;
  for (int64_t bs : {1, 16, 24, 64, 128}) {
    for (int64_t cache_pad : {0, 16}) {
      for (Case c : fp8_page_shape_cases({1000, 130, 0, 64, 2, 127, 200}, bs, cache_pad)) {
        c.out_dtype = DType::kBF16;
        check_case(c, stream++, {0, 5});
      }
    }
  }
}

// A NaN tile scale of one fp8_ds_mla key makes every row that sees the key NaN (out and lse); the
// other requests stay exact. Scale 0 (blocks 0-1, converted in the first phase) and 3 (blocks 6-7,
// held in registers until the last), a key in the first 32 of its tile (the convert warpgroup's
// first pass) and one in the last 32, 64-row CTAs (wgmma, pages of 16 and 64 keys, and the
// mma.sync kernel's 24) and 16-row ones.
TEST(MlaDecodeCuda, NanDsMlaTileScalesPropagate) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 340;
  struct Poison {
    int64_t heads, block_size, key, tile;
    DType rope;
  };
  for (const Poison& poison :
       {Poison{128, 64, 517, 3, DType::kBF16}, Poison{64, 16, 490, 0, DType::kF16},
        Poison{32, 24, 517, 3, DType::kF16}, Poison{16, 64, 490, 3, DType::kBF16}}) {
    Case c;
    c.seq_lens = {300, 700, 5};
    c.kv_dtype = KvCacheDType::kFp8DsMla;
    c.cache_dtype = c.q_dtype = c.out_dtype = poison.rope;
    c.heads = poison.heads;
    c.block_size = poison.block_size;
    SCOPED_TRACE(testing::Message()
                 << c.name() << " key " << poison.key << " scale " << poison.tile);
    auto rng = test::make_rng(stream++);
    HostInputs in = make_inputs(c, rng);
    const Expected ref = reference(c, in.q_kernel, in.k_kernel);
    poison_ds_mla_scale(c, in, 1, poison.key, poison.tile);
    const DeviceInputs d = upload(in);
    for (int64_t parts : {1, 20}) {
      const Results r = run_gpu(c, d, parts);
      expect_nan_request_only(c, r.out, r.lse, ref, 1);
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

// A NaN cache value (e4m3 0xff) makes every row that sees it NaN (out and lse); the other requests
// stay exact. bf16 and f16 elements, 16- and 64-row CTAs, split and whole.
TEST(MlaDecodeCuda, NanCacheValuesPropagate) {
  MLAKIT_SKIP_WITHOUT_GPU();
  Case base;
  base.seq_lens = {300, 700, 5};
  for_each_nan_cache_case(base, {16, 128}, 517, 130, 1300,
                          [](const Case& c, const HostInputs& in, const Expected& ref) {
                            const DeviceInputs d = upload(in);
                            for (int64_t parts : {1, 20}) {
                              const Results r = run_gpu(c, d, parts);
                              expect_nan_request_only(c, r.out, r.lse, ref, 1);
                            }
                          });
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
  for (int64_t p : {1, 4}) {
    const Results r = run_gpu(c, d, p);
    for (double v : test::to_doubles(r.out)) ASSERT_EQ(v, 0.0);
    for (double v : test::to_doubles(r.lse)) ASSERT_EQ(v, -std::numeric_limits<double>::infinity());
  }
}

// One case of BadDeviceIndicesGiveNanRows with 16 heads and s_q queries per request over a cache
// of format `kv`: request 0 is good, 1 has a block id outside the cache, 2 a seq_len beyond the
// table and, for s_q > 1, 3 a seq_len in (0, s_q) (seq_lens count the new tokens too).
void check_bad_indices(int64_t s_q, KvCacheDType kv, uint64_t stream) {
  Case c;
  c.kv_dtype = kv;
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
  for (auto [p, invariant] : {std::pair<int64_t, bool>{1, false}, {3, false}, {0, true}}) {
    SCOPED_TRACE(testing::Message() << "parts " << p << (invariant ? " batch-invariant" : ""));
    const Results r = run_gpu(c, d, p, invariant);
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
    check_bad_indices(s_q, KvCacheDType::kAuto, 700 + static_cast<uint64_t>(s_q));
  }
  // 16 rows over raw fp8_ds_mla tiles: the bad page's keys are zeroed, not copied
  check_bad_indices(1, KvCacheDType::kFp8DsMla, 710);
}

// After a graph replay wrote replay_out / replay_lse: an eager run (`run_eager`, on `stream`) of
// the same decode on the same inputs gives the same bits into out / lse, and no bad index is
// reported.
void expect_eager_equals_replay(const std::function<void()>& run_eager, cudaStream_t stream,
                                const Tensor& out, const Tensor& lse, const Tensor& replay_out,
                                const Tensor& replay_lse) {
  run_eager();
  cuda_ok(cudaStreamSynchronize(stream), "eager sync");
  EXPECT_TRUE(test::all_close(to_host(out).view(), test::to_doubles(replay_out.view()), {0, 0}));
  EXPECT_TRUE(test::all_close(to_host(lse).view(), test::to_doubles(replay_lse.view()), {0, 0}));
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0), Stream{stream}));
}

// One captured graph, replayed after the device seq_lens and block table change: the schedule
// depends on shapes only and the plan kernel recomputes the work plan on every replay, so every
// replay must match a fresh reference and an eager run bit for bit.
void check_graph_replay(int64_t heads, int64_t s_q, bool invariant, uint64_t seed) {
  Case c;
  c.s_q = s_q;
  c.heads = heads;
  c.block_size = 16;
  c.out_dtype = DType::kBF16;
  const int64_t batch = 5, width = 160, max_len = width * c.block_size;  // up to 2560 keys
  const int64_t num_blocks = batch * width + 4;
  c.seq_lens.assign(batch, 0);
  SCOPED_TRACE(c.name() + (invariant ? " batch-invariant" : " balanced"));
  auto rng = test::make_rng(seed);
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
  const DecodeSchedule s = ops::plan_mla_decode(
      {Device::cuda(0), batch, c.s_q, c.heads, c.block_size, max_len, invariant}, {});
  ASSERT_GT(s.max_splits, 1) << "requests of up to 2560 keys can be split";
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
  const cudaGraphExec_t exec = capture_graph(stream, graph, [&] { decode(stream); });

  // Nonzero lengths are at least 2 = the largest s_q below (seq_lens count the new tokens too).
  const std::vector<std::vector<int32_t>> rounds = {
      {2560, 0, 2, 300, 64},    {5, 2000, 0, 0, 2559}, {0, 0, 0, 0, 0},
      {1024, 1025, 2, 3, 1023}, {2, 2, 2560, 2, 2},    {700, 700, 700, 700, 700}};
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

    expect_eager_equals_replay([&] { decode(stream); }, stream, out, lse, replay_out, replay_lse);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(MlaDecodeCuda, GraphReplayFollowsNewLengthsAndTables) {
  MLAKIT_SKIP_WITHOUT_GPU();
  check_graph_replay(16, 2, false, 800);   // 32 rows: the wgmma kernel, 132 parts
  check_graph_replay(16, 1, false, 801);   // 16 rows: the mma.sync kernel
  check_graph_replay(128, 1, false, 802);  // two 64-row tiles, 66 parts
  check_graph_replay(16, 1, true, 803);    // batch-invariant pieces of 16 tiles
  check_graph_replay(128, 1, true, 804);
}

// ---- q_scale / k_scale as device tensors -------------------------------------------------------

// run_gpu with q_scale / k_scale device tensors (absent: the Case's floats), on the default stream
// and with `parts` parts.
Results run_gpu_scales(const Case& c, const DeviceInputs& d, int64_t parts,
                       const std::optional<TensorView>& q_scales,
                       const std::optional<TensorView>& k_scales) {
  const DecodeSchedule s = schedule_for(c, d.block_table.view(), parts, false);
  const Tensor out = device_nan({c.batch(), c.s_q, c.heads, kRank}, c.out_dtype);
  const Tensor lse = device_nan({c.batch(), c.s_q, c.heads}, DType::kF32);
  const Tensor ws =
      device_nan({std::max<int64_t>(1, ops::mla_decode_workspace_elems(s, c.s_q, c.heads, kRank))},
                 DType::kF32);
  ops::DecodeParams params = c.params();
  params.q_scale_tensor = q_scales;
  params.k_scale_tensor = k_scales;
  ops::mla_decode(d.q, d.cache, d.block_table, d.seq_lens, out, lse, params, s, ws);
  cuda_ok(cudaDeviceSynchronize(), "decode");
  return results_of(c, to_host(out), to_host(lse));
}

// Request b's out and lse bits of `got` equal those of `want`.
void expect_request_bits(const Case& c, const Results& got, const Results& want, int64_t b) {
  const int64_t rows = c.s_q * c.heads;
  const auto bytes = [&](const TensorView& v, int64_t per_request) {
    return std::vector<uint8_t>(
        static_cast<const uint8_t*>(v.data) + b * per_request * v.element_size(),
        static_cast<const uint8_t*>(v.data) + (b + 1) * per_request * v.element_size());
  };
  EXPECT_TRUE(bytes(got.out, rows * kRank) == bytes(want.out, rows * kRank)) << "out of " << b;
  EXPECT_TRUE(bytes(got.lse, rows) == bytes(want.lse, rows)) << "lse of " << b;
}

// Scale tensors read by the kernels: one-element device tensors give the float form's bits, and
// with one value per request request b's rows are bitwise those of a host-float launch with
// (q_scales[b], k_scales[b]) (which the tests above check against the oracle). Raw e4m3 tiles
// (fp8 q), the converting path (bf16 q, its q_scale read but not applied), 16- and 64-row CTAs,
// the wgmma kernel (a bf16 cache), planned and forced schedules.
TEST(MlaDecodeCuda, ScaleTensorsEqualHostFloatScales) {
  MLAKIT_SKIP_WITHOUT_GPU();
  Case fp8;
  fp8.kv_dtype = KvCacheDType::kFp8E4m3;
  fp8.q_dtype = DType::kFp8E4m3;
  fp8.seq_lens = {700, 0, 65, 3000};
  fp8.block_size = 64;
  fp8.q_scale = 0.5f;
  fp8.k_scale = 1.5f;
  Case fp8_64 = fp8;
  fp8_64.heads = 128;
  Case bf16_q = fp8;
  bf16_q.q_dtype = DType::kBF16;
  bf16_q.out_dtype = DType::kBF16;
  Case wgmma;  // 16-bit cache, 64-row tiles: the scales are read and checked, not applied
  wgmma.seq_lens = {300, 2049};
  wgmma.heads = 64;
  const std::vector<float> q_values = {0.25f, 2.0f, 0.75f, 1.25f};
  const std::vector<float> k_values = {3.0f, 0.5f, 1.0f, 0.125f};
  uint64_t stream = 30000;
  for (const Case& c : {fp8, fp8_64, bf16_q, wgmma}) {
    SCOPED_TRACE(c.name());
    auto rng = test::make_rng(stream++);
    const HostInputs in = make_inputs(c, rng);
    const DeviceInputs d = upload(in);
    const int64_t batch = c.batch();
    const Tensor one_q = to_device(test::tensor_from({c.q_scale}, {1}, DType::kF32));
    const Tensor one_k = to_device(test::tensor_from({c.k_scale}, {1}, DType::kF32));
    const Tensor per_q = to_device(test::tensor_from(
        std::vector<double>(q_values.begin(), q_values.begin() + batch), {batch}, DType::kF32));
    const Tensor per_k = to_device(test::tensor_from(
        std::vector<double>(k_values.begin(), k_values.begin() + batch), {batch}, DType::kF32));
    for (int64_t parts : {0, 1, 3}) {
      SCOPED_TRACE(testing::Message() << "parts " << parts);
      const Results floats = run_gpu_scales(c, d, parts, std::nullopt, std::nullopt);
      const Results ones = run_gpu_scales(c, d, parts, one_q.view(), one_k.view());
      EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
      for (int64_t b = 0; b < batch; ++b) expect_request_bits(c, ones, floats, b);
      const Results per = run_gpu_scales(c, d, parts, per_q.view(), per_k.view());
      EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
      for (int64_t b = 0; b < batch; ++b) {
        Case host = c;
        host.q_scale = q_values[b];
        host.k_scale = k_values[b];
        expect_request_bits(c, per, run_gpu_scales(host, d, parts, std::nullopt, std::nullopt), b);
      }
    }
  }
}

// A device scale value that is not finite and > 0: the rows of its request are NaN, the others
// keep the float form's bits, check_device_errors names the scale tensors.
TEST(MlaDecodeCuda, BadScaleTensorValueGivesNanRowsAndIsReported) {
  MLAKIT_SKIP_WITHOUT_GPU();
  Case c;
  c.kv_dtype = KvCacheDType::kFp8E4m3;
  c.q_dtype = DType::kFp8E4m3;
  c.seq_lens = {500, 90, 2000};
  auto rng = test::make_rng(30100);
  const HostInputs in = make_inputs(c, rng);
  const DeviceInputs d = upload(in);
  const Results floats = run_gpu_scales(c, d, 0, std::nullopt, std::nullopt);
  const int64_t rows = c.s_q * c.heads;
  for (float bad : {std::nanf(""), 0.0f, -2.0f, std::numeric_limits<float>::infinity()}) {
    for (int which = 0; which < 2; ++which) {  // request 1's q_scale, then its k_scale
      SCOPED_TRACE(testing::Message() << bad << (which == 0 ? " q_scale" : " k_scale"));
      const Tensor scales = to_device(test::tensor_from({1.0, bad, 1.0}, {3}, DType::kF32));
      const Results r = which == 0 ? run_gpu_scales(c, d, 0, scales.view(), std::nullopt)
                                   : run_gpu_scales(c, d, 0, std::nullopt, scales.view());
      const std::vector<double> out = test::to_doubles(r.out), lse = test::to_doubles(r.lse);
      for (int64_t i = rows * kRank; i < 2 * rows * kRank; ++i) ASSERT_TRUE(std::isnan(out[i]));
      for (int64_t i = rows; i < 2 * rows; ++i) ASSERT_TRUE(std::isnan(lse[i]));
      expect_request_bits(c, r, floats, 0);
      expect_request_bits(c, r, floats, 2);
      try {
        ops::check_device_errors(Device::cuda(0));
        ADD_FAILURE() << "the bad scale was not reported";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("mla_decode: a q_scale or k_scale tensor held"),
                  std::string::npos)
            << e.what();
      }
    }
  }
}

// One captured graph with per-request device scale tensors and device seq_lens: every replay after
// new scale values and shorter or longer lengths are written matches the fp64 oracle on the values
// scaled per request, and an eager run bit for bit.
TEST(MlaDecodeCuda, GraphReplayFollowsNewScaleValuesAndLengths) {
  MLAKIT_SKIP_WITHOUT_GPU();
  Case c;
  c.kv_dtype = KvCacheDType::kFp8E4m3;
  c.q_dtype = DType::kFp8E4m3;
  c.seq_lens = {2048, 1500, 64, 900};  // the table's extent; replays use prefixes of these
  c.out_dtype = DType::kF32;
  auto rng = test::make_rng(30200);
  const HostInputs in = make_inputs(c, rng);  // scales 1: q_kernel / k_kernel are the codes
  const DeviceInputs d = upload(in);
  const int64_t batch = c.batch();
  const DecodeSchedule s = schedule_for(c, d.block_table.view(), 0, false);
  const Tensor ws =
      device_nan({ops::mla_decode_workspace_elems(s, c.s_q, c.heads, kRank)}, DType::kF32);
  const Tensor out = device_nan({batch, c.s_q, c.heads, kRank}, c.out_dtype);
  const Tensor lse = device_nan({batch, c.s_q, c.heads}, DType::kF32);
  const Tensor q_scales = Tensor::empty({batch}, DType::kF32, Device::cuda(0));
  const Tensor k_scales = Tensor::empty({batch}, DType::kF32, Device::cuda(0));
  ops::DecodeParams params = c.params();
  params.q_scale_tensor = q_scales.view();
  params.k_scale_tensor = k_scales.view();
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate");
  auto decode = [&] {
    ops::mla_decode(d.q, d.cache, d.block_table, d.seq_lens, out, lse, params, s, ws,
                    Stream{stream});
  };
  cudaGraph_t graph = nullptr;
  const cudaGraphExec_t exec = capture_graph(stream, graph, decode);

  const std::vector<std::vector<float>> q_rounds = {
      {1.0f, 0.5f, 2.0f, 0.25f}, {3.0f, 3.0f, 0.125f, 1.5f}, {0.75f, 1.0f, 1.0f, 4.0f}};
  const std::vector<std::vector<float>> k_rounds = {
      {0.5f, 1.0f, 2.0f, 0.375f}, {1.25f, 0.0625f, 6.0f, 1.0f}, {2.0f, 2.0f, 0.5f, 0.5f}};
  const std::vector<std::vector<int32_t>> len_rounds = {
      {2048, 1500, 64, 900}, {1, 0, 64, 777}, {2000, 1499, 1, 0}};
  const int64_t rows = c.s_q * c.heads;
  for (size_t round = 0; round < q_rounds.size(); ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round);
    const std::vector<float>& qs = q_rounds[round];
    const std::vector<float>& ks = k_rounds[round];
    Case now = c;
    now.seq_lens = len_rounds[round];
    cuda_ok(cudaMemcpy(q_scales.view().data, qs.data(), 4 * batch, cudaMemcpyHostToDevice), "qs");
    cuda_ok(cudaMemcpy(k_scales.view().data, ks.data(), 4 * batch, cudaMemcpyHostToDevice), "ks");
    cuda_ok(
        cudaMemcpy(d.seq_lens.view().data, now.seq_lens.data(), 4 * batch, cudaMemcpyHostToDevice),
        "lens");
    cuda_ok(cudaGraphLaunch(exec, stream), "replay");
    cuda_ok(cudaStreamSynchronize(stream), "replay sync");
    const Tensor replay_out = to_host(out), replay_lse = to_host(lse);
    std::vector<double> q = in.q_kernel;
    std::vector<std::vector<double>> keys(batch);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < rows * kDim; ++i) q[b * rows * kDim + i] *= qs[b];
      keys[b].assign(in.k_kernel[b].begin(), in.k_kernel[b].begin() + now.seq_lens[b] * kDim);
      for (double& v : keys[b]) v *= ks[b];
    }
    const Expected want = reference(now, q, keys);
    EXPECT_TRUE(test::all_close(replay_out.view(), want.out, out_tolerance(now))) << "out";
    EXPECT_TRUE(test::all_close(replay_lse.view(), want.lse, kLseTolerance)) << "lse";
    expect_eager_equals_replay(decode, stream, out, lse, replay_out, replay_lse);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// ---- varied lengths ----------------------------------------------------------------------------

// Batches of varied lengths under the planned schedule (one CTA per SM, cut across requests) and
// forced part counts: uniform lengths, lengths at tile edges, one long request among short ones.
TEST(MlaDecodeCuda, VariedLengthBatches) {
  MLAKIT_SKIP_WITHOUT_GPU();
  uint64_t stream = 1000;
  auto rng = test::make_rng(999);
  for (auto [heads, s_q] : {std::pair<int64_t, int64_t>{16, 1}, {16, 4}, {128, 1}, {64, 2}}) {
    Case c;
    c.heads = heads;
    c.s_q = s_q;
    c.out_dtype = DType::kBF16;
    // Fewer keys for more rows: the fp64 oracle's time grows with both.
    std::uniform_int_distribution<int32_t> len(0, heads * s_q >= 64 ? 1500 : 3000);
    for (int b = 0; b < 40; ++b) c.seq_lens.push_back(valid_seq_len(len(rng), s_q));
    check_case(c, stream++, {0, 7, 61});
    Case edges = c;  // s_q keys: the shortest valid request (seq_lens count the new tokens too)
    const auto shortest = static_cast<int32_t>(s_q);
    edges.seq_lens = {0,    shortest, 63,   64,           65, 127, 128, 129,
                      1023, 1024,     1025, shortest + 1, 0,  191, 193};
    check_case(edges, stream++, {0, 5});
    Case one_long = c;
    one_long.seq_lens.assign(30, std::max<int32_t>(3, shortest));
    one_long.seq_lens[7] = 4000;
    one_long.seq_lens[20] = 0;
    check_case(one_long, stream++, {0, 9});
  }
  for (KvCacheDType format : {KvCacheDType::kFp8E4m3, KvCacheDType::kFp8DsMla}) {
    for (int64_t heads : {16, 128}) {
      Case c;
      c.kv_dtype = format;
      c.heads = heads;
      c.k_scale = 2.0f;
      c.out_dtype = DType::kBF16;
      std::uniform_int_distribution<int32_t> len(0, 1200);
      for (int b = 0; b < 24; ++b) c.seq_lens.push_back(len(rng));
      check_case(c, stream++, {0, 5});
    }
  }
}

// ---- batch invariance --------------------------------------------------------------------------

// Request r's out and lse bits alone and inside 20 random batches of 1..128 companions (random
// lengths, positions and values) under the batch-invariant plan of each batch.
void check_batch_invariance(Case c, int32_t r_len, uint64_t stream) {
  SCOPED_TRACE(c.name());
  auto rng = test::make_rng(stream);
  const RequestValues r = random_request(c, r_len, rng);
  // Companions take their values from one random pool (cheap; they only have to differ).
  const RequestValues pool = random_request(c, 4096, rng);
  std::uniform_int_distribution<int32_t> other_len(0, 1000);
  std::uniform_int_distribution<int64_t> offset(0, 4096 - 1000);
  auto companion = [&] {
    RequestValues v;
    v.seq_len = valid_seq_len(other_len(rng), c.s_q);
    const int64_t at = offset(rng);
    v.keys.assign(pool.keys.begin() + at * kDim, pool.keys.begin() + (at + v.seq_len) * kDim);
    v.q.assign(pool.keys.begin() + at * kDim, pool.keys.begin() + at * kDim + r.q.size());
    return v;
  };

  auto run = [&](const std::vector<RequestValues>& batch, size_t at, bool oracle) {
    Case bc = c;
    bc.seq_lens.clear();
    for (const RequestValues& v : batch) bc.seq_lens.push_back(v.seq_len);
    const HostInputs in = batch_inputs(bc, batch, rng, oracle);
    const DeviceInputs d = upload(in);
    const Results res = run_gpu(bc, d, 0, /*invariant=*/true);
    EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
    if (oracle) {
      const Expected want = reference(bc, in.q_kernel, in.k_kernel);
      EXPECT_TRUE(test::all_close(res.out, want.out, out_tolerance(bc))) << "r alone vs oracle";
      EXPECT_TRUE(test::all_close(res.lse, want.lse, kLseTolerance)) << "r alone vs oracle";
    }
    return std::pair{test::to_doubles(res.out.narrow(0, static_cast<int64_t>(at), 1)),
                     test::to_doubles(res.lse.narrow(0, static_cast<int64_t>(at), 1))};
  };
  const auto [alone_out, alone_lse] = run({r}, 0, true);
  std::uniform_int_distribution<int> companions(1, 128);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<RequestValues> batch;
    const int n = companions(rng);
    for (int i = 0; i < n; ++i) batch.push_back(companion());
    const size_t at = std::uniform_int_distribution<size_t>(0, batch.size())(rng);
    batch.insert(batch.begin() + static_cast<std::ptrdiff_t>(at), r);
    SCOPED_TRACE(testing::Message()
                 << "trial " << trial << ": r at " << at << " of " << batch.size());
    const auto [out, lse] = run(batch, at, false);
    ASSERT_EQ(out.size(), alone_out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(std::memcmp(&out[i], &alone_out[i], sizeof(double)), 0)
          << "out element " << i << ": " << out[i] << " vs " << alone_out[i] << " alone";
    }
    for (size_t i = 0; i < lse.size(); ++i) {
      ASSERT_EQ(std::memcmp(&lse[i], &alone_lse[i], sizeof(double)), 0)
          << "lse " << i << ": " << lse[i] << " vs " << alone_lse[i] << " alone";
    }
  }
}

TEST(MlaDecodeCuda, BatchInvariantRequestIsBitwiseTheSameInAnyBatch) {
  MLAKIT_SKIP_WITHOUT_GPU();
  Case m16;  // 16 rows (mma.sync), 5 pieces
  m16.out_dtype = DType::kBF16;
  check_batch_invariance(m16, 5000, 1100);
  Case wgmma = m16;  // 128 heads: two 64-row tiles (wgmma)
  wgmma.heads = 128;
  check_batch_invariance(wgmma, 3000, 1101);
  Case causal = m16;  // s_q 2 over 16 heads: 32 rows, causal inside the last piece
  causal.s_q = 2;
  causal.out_dtype = DType::kF32;
  check_batch_invariance(causal, 1100, 1102);
  Case fp8 = m16;  // fp8 cache, 64-row mma.sync
  fp8.kv_dtype = KvCacheDType::kFp8E4m3;
  fp8.heads = 64;
  check_batch_invariance(fp8, 2500, 1103);
}

// A plan written ahead (mla_decode_plan_ahead, as plan_step does for the layers of a step) serves
// several decodes of the same lengths: each gives the bits of a decode that plans itself.
TEST(MlaDecodeCuda, PlannedAheadScheduleServesSeveralDecodes) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(1200);
  for (int64_t heads : {16, 128}) {
    Case c;
    c.heads = heads;
    c.out_dtype = DType::kBF16;
    std::uniform_int_distribution<int32_t> len(0, 3000);
    for (int b = 0; b < 24; ++b) c.seq_lens.push_back(len(rng));
    SCOPED_TRACE(c.name());
    const HostInputs in = make_inputs(c, rng);
    const DeviceInputs d = upload(in);
    const Results want = run_gpu(c, d, 0);
    const DecodeSchedule s = schedule_for(c, d.block_table.view(), 0, false);
    const Tensor ws = device_nan(
        {std::max<int64_t>(1, ops::mla_decode_workspace_elems(s, c.s_q, c.heads, kRank))},
        DType::kF32);
    const DecodeSchedule planned =
        ops::mla_decode_plan_ahead(s, d.block_table, d.seq_lens, c.block_size, kRank, ws);
    ASSERT_TRUE(planned.device.planned_ahead);
    for (int layer = 0; layer < 3; ++layer) {
      const Tensor out = device_nan({c.batch(), c.s_q, c.heads, kRank}, c.out_dtype);
      const Tensor lse = device_nan({c.batch(), c.s_q, c.heads}, DType::kF32);
      ops::mla_decode(d.q, d.cache, d.block_table, d.seq_lens, out, lse, c.params(), planned, ws);
      EXPECT_TRUE(test::all_close(want.out, test::to_doubles(to_host(out)), {0, 0}))
          << "layer " << layer;
      EXPECT_TRUE(test::all_close(want.lse, test::to_doubles(to_host(lse)), {0, 0}))
          << "layer " << layer;
    }
  }
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
}

// The self-planning overload on GPU tensors: plans from the shape, allocates its workspace.
TEST(MlaDecodeCuda, ConvenienceOverloadPlansItself) {
  MLAKIT_SKIP_WITHOUT_GPU();
  Case c;
  c.seq_lens = {700, 3, 0, 129, 4000};
  c.s_q = 2;
  c.heads = 128;
  c.out_dtype = DType::kBF16;
  auto rng = test::make_rng(1200);
  const HostInputs in = make_inputs(c, rng);
  const References ref = references(c, in);
  const DeviceInputs d = upload(in);
  const Tensor out = device_nan({c.batch(), c.s_q, c.heads, kRank}, c.out_dtype);
  const Tensor lse = device_nan({c.batch(), c.s_q, c.heads}, DType::kF32);
  ops::mla_decode(d.q, d.cache, d.block_table, d.seq_lens, out, lse, c.params());
  expect_matches(c, results_of(c, to_host(out), to_host(lse)), ref);
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
    schedule_ = cuda::device_decode_schedule(2, 1, 4, in_.block_table.size(1) * 16, 2, false);
    ws_ = Tensor::empty({ops::mla_decode_workspace_elems(schedule_, 1, 4, kRank)}, DType::kF32);
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

TEST_F(MlaDecodeCudaErrors, ScheduleMustBeDevicePlannedForThisShape) {
  const DecodeSchedule host = plan_decode_splits(std::vector<int32_t>{20, 200}, 16, 64);
  MLAKIT_EXPECT_THROW_MSG(
      run_with(c_.params(), host),
      "mla_decode: CUDA tensors need a device-planned schedule (plan_mla_decode "
      "with the CUDA device), got a host-split schedule");
  const DecodeSchedule other = cuda::device_decode_schedule(3, 1, 4, 1024, 2, false);
  MLAKIT_EXPECT_THROW_MSG(
      run_with(c_.params(), other),
      "mla_decode: the schedule was planned for batch 3, s_q 1, num_heads 4 but "
      "q has batch 2, s_q 1, num_heads 4");
  DecodeSchedule none = schedule_;
  none.device.num_parts = 0;
  MLAKIT_EXPECT_THROW_MSG(run_with(c_.params(), none),
                          "mla_decode: a CUDA decode schedule needs num_parts in [1, 256], got 0");
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
  ops::DecodeParams rank64 = c_.params();
  rank64.kv_lora_rank = 64;
  MLAKIT_EXPECT_THROW_MSG(run(q80, cache80, out64, rank64, schedule_, ws_),
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
      "mla_decode: kv_cache.shape[2] (the cache entry width) must equal q.shape[3] (L + R) = 575, "
      "got 576");
  const Tensor q8 = Tensor::zeros({2, 1, 4, kDim}, DType::kFp8E4m3);
  MLAKIT_EXPECT_THROW_MSG(run(q8, in_.cache, out_, c_.params(), schedule_, ws_),
                          "fp8 q needs an fp8 kv_cache_dtype");
  const Tensor small = Tensor::empty({ws_.numel() - 1}, DType::kF32);
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
      "mla_decode: lse must have dtype f32");
  MLAKIT_EXPECT_THROW_MSG(
      ops::mla_decode(on_cuda(in_.q), in_.cache, on_cuda(in_.block_table), on_cuda(in_.seq_lens),
                      on_cuda(out_), on_cuda(lse_), c_.params(), schedule_, on_cuda(ws_)),
      "kv_cache is on cpu but q is on cuda:0");
}

// A CPU schedule kind for CPU tensors and the reverse.
TEST_F(MlaDecodeCudaErrors, CpuTensorsNeedAHostSchedule) {
  MLAKIT_EXPECT_THROW_MSG(
      ops::mla_decode(in_.q, in_.cache, in_.block_table, in_.seq_lens, out_, lse_, c_.params(),
                      schedule_, ws_),
      "mla_decode: cpu tensors need a host-split schedule (plan_mla_decode with the CPU device and "
      "the seq_lens), got a device-planned schedule");
}

}  // namespace
}  // namespace mlakit
