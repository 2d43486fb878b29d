// ops::mla_decode on CPU against the fp64 oracle (ref::attention with one KV head, K = the cache
// entry, V = its first L values), on paged caches with shuffled blocks and NaN in every slot the
// kernel must not read. Spec D.6 / D.7 / D.10 ports.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "common/fp8_reference.hpp"
#include "common/test_util.hpp"
#include "mlakit/dtype.hpp"
#include "mlakit/error.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/plan.hpp"
#include "reference/reference.hpp"

namespace mlakit {
namespace {

constexpr float kDeepSeekScale = 0.1352338f;  // DeepSeek-V3's softmax scale (DESIGN.md §1)
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Case {
  std::vector<int32_t> seq_lens;
  int64_t s_q = 1;
  int64_t heads = 16;
  int64_t rank = 512;  // L
  int64_t rope = 64;   // R
  int64_t block_size = 16;
  KvCacheDType kv_dtype = KvCacheDType::kAuto;
  DType cache_dtype = DType::kBF16;  // kAuto: element dtype; fp8_ds_mla: the rope dtype
  DType q_dtype = DType::kBF16;
  DType out_dtype = DType::kF32;
  float q_scale = 1.0f;
  float k_scale = 1.0f;
  float scale = kDeepSeekScale;
  bool strided = false;  // q, out and lse as views into wider buffers

  int64_t dim() const { return rank + rope; }
  int64_t batch() const { return static_cast<int64_t>(seq_lens.size()); }
  ops::DecodeParams params() const { return {scale, kv_dtype, q_scale, k_scale, rank}; }
};

// Decode inputs plus the values the kernel sees, as doubles.
struct Inputs {
  Tensor q_storage, q_scratch;  // q (possibly strided into q_storage)
  TensorView q;
  Tensor cache;        // [num_blocks, block_size, entry_width], NaN wherever nothing was written
  Tensor block_table;  // i32 [B, W]; unused columns -1
  Tensor seq_lens;     // i32 [B]
  std::vector<double> q_seen;                  // [B, s_q, N, D]
  std::vector<std::vector<double>> keys_seen;  // per request [seq_len, D]
};

// Writes one token's entry (values x [D]) and returns the values the kernel reads back.
std::vector<double> write_entry(const Case& c, uint8_t* entry, const std::vector<float>& x) {
  const int64_t d = c.dim();
  std::vector<double> seen(d);
  switch (c.kv_dtype) {
    case KvCacheDType::kAuto:
      for (int64_t i = 0; i < d; ++i) {
        store_float(entry, c.cache_dtype, i, x[i]);
        seen[i] = load_float(entry, c.cache_dtype, i);
      }
      break;
    case KvCacheDType::kFp8E4m3:
      for (int64_t i = 0; i < d; ++i) {
        entry[i] = float_to_e4m3_bits(x[i] / c.k_scale);
        seen[i] = test::e4m3_value(entry[i]) * c.k_scale;
      }
      break;
    case KvCacheDType::kFp8DsMla: {
      for (int64_t t = 0; t < kDsMlaNumTiles; ++t) {
        float amax = 0;
        for (int64_t i = 0; i < kDsMlaTileSize; ++i)
          amax = std::max(amax, std::fabs(x[t * kDsMlaTileSize + i]));
        const float tile_scale = std::max(amax / 448.0f, FLT_MIN);
        std::memcpy(entry + kDsMlaScaleOffset + 4 * t, &tile_scale, 4);
        for (int64_t i = 0; i < kDsMlaTileSize; ++i) {
          const int64_t k = t * kDsMlaTileSize + i;
          entry[k] = float_to_e4m3_bits(x[k] / tile_scale);
          seen[k] = test::e4m3_value(entry[k]) * tile_scale;
        }
      }
      uint8_t* rope = entry + kDsMlaRopeOffset;
      for (int64_t i = 0; i < kDsMlaRopeDim; ++i) {
        store_float(rope, c.cache_dtype, i, x[kDsMlaKvLoraRank + i]);
        seen[kDsMlaKvLoraRank + i] = load_float(rope, c.cache_dtype, i);
      }
      break;
    }
  }
  return seen;
}

// One request's own values, fixed while the batch around it changes (batch invariance).
struct RequestValues {
  int32_t seq_len = 0;
  std::vector<float> q;     // [s_q, N, D], before rounding to q's dtype
  std::vector<float> keys;  // [seq_len, D], before quantization into the cache
};

RequestValues random_request(const Case& c, int32_t seq_len, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  RequestValues r;
  r.seq_len = seq_len;
  r.keys.resize(static_cast<size_t>(seq_len * c.dim()));
  for (float& v : r.keys) v = normal(rng);
  r.q.resize(static_cast<size_t>(c.s_q * c.heads * c.dim()));
  for (float& v : r.q) v = normal(rng);
  return r;
}

// The inputs of a batch of `requests` (c.seq_lens must be their lengths); rng draws the shuffle of
// the blocks only.
Inputs batch_inputs(const Case& c, const std::vector<RequestValues>& requests,
                    std::mt19937_64& rng) {
  Inputs in;
  const int64_t batch = c.batch(), d = c.dim(), bs = c.block_size;

  // Paged cache: blocks of all requests shuffled over a pool with spare (never written) blocks.
  int64_t width = 1, used_blocks = 0;
  for (int32_t len : c.seq_lens) {
    width = std::max<int64_t>(width, (len + bs - 1) / bs + 1);  // +1: an unused column
    used_blocks += (len + bs - 1) / bs;
  }
  const int64_t num_blocks = used_blocks + 3;
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const DType storage = c.kv_dtype == KvCacheDType::kAuto ? c.cache_dtype : DType::kU8;
  const int64_t width_elems = c.kv_dtype == KvCacheDType::kFp8DsMla ? kDsMlaEntryBytes : d;
  in.cache = test::nan_tensor({num_blocks, bs, width_elems}, storage);
  std::vector<int64_t> table(batch * width, -1);
  in.keys_seen.resize(batch);
  int64_t next = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = c.seq_lens[b];
    for (int64_t col = 0; col < (len + bs - 1) / bs; ++col) table[b * width + col] = ids[next++];
    in.keys_seen[b].resize(len * d);
    for (int64_t s = 0; s < len; ++s) {
      const std::vector<float> x(requests[b].keys.begin() + s * d,
                                 requests[b].keys.begin() + (s + 1) * d);
      const int64_t slot = table[b * width + s / bs] * bs + s % bs;
      uint8_t* entry =
          static_cast<uint8_t*>(in.cache.view().data) + slot * width_elems * dtype_size(storage);
      const std::vector<double> seen = write_entry(c, entry, x);
      std::copy(seen.begin(), seen.end(), in.keys_seen[b].begin() + s * d);
    }
  }
  in.block_table = test::int_tensor(table, {batch, width}, DType::kI32);
  in.seq_lens = test::int_tensor(std::vector<int64_t>(c.seq_lens.begin(), c.seq_lens.end()),
                                 {batch}, DType::kI32);

  // Queries: fp8 q is quantized as scaled_fp8_quant would (x * (1 / q_scale)).
  const int64_t pad = c.strided ? 8 : 0;  // extra elements per row of the strided views
  const int64_t rows = c.s_q * c.heads;
  in.q_storage = test::nan_tensor({batch, c.s_q, c.heads, d + pad}, c.q_dtype);
  in.q = in.q_storage.view().narrow(3, 0, d);
  in.q_seen.resize(batch * rows * d);
  const bool fp8_q = c.q_dtype == DType::kFp8E4m3 || c.q_dtype == DType::kU8;
  for (int64_t row = 0; row < batch * rows; ++row) {
    for (int64_t i = 0; i < d; ++i) {
      const int64_t at = row * (d + pad) + i;
      const float x = requests[row / rows].q[(row % rows) * d + i];
      if (fp8_q) {
        const uint8_t byte = float_to_e4m3_bits(x * (1.0f / c.q_scale));
        static_cast<uint8_t*>(in.q_storage.view().data)[at] = byte;
        in.q_seen[row * d + i] = test::e4m3_value(byte) * c.q_scale;
      } else {
        store_float(in.q_storage.view().data, c.q_dtype, at, x);
        in.q_seen[row * d + i] = load_float(in.q_storage.view().data, c.q_dtype, at);
      }
    }
  }
  return in;
}

Inputs make_inputs(const Case& c, std::mt19937_64& rng) {
  std::vector<RequestValues> requests;
  for (int32_t len : c.seq_lens) requests.push_back(random_request(c, len, rng));
  return batch_inputs(c, requests, rng);
}

struct Expected {
  std::vector<double> out;  // [B, s_q, N, L]
  std::vector<double> lse;  // [B, s_q, N]
};

Expected reference(const Case& c, const Inputs& in) {
  Expected e;
  const int64_t d = c.dim(), l = c.rank, rows = c.s_q * c.heads;
  for (int64_t b = 0; b < c.batch(); ++b) {
    const int64_t len = c.seq_lens[b];
    std::vector<double> v(len * l);
    for (int64_t s = 0; s < len; ++s) {
      std::copy_n(in.keys_seen[b].begin() + s * d, l, v.begin() + s * l);
    }
    const std::span<const double> q(in.q_seen.data() + b * rows * d, rows * d);
    const ref::AttentionResult r = ref::attention(q, in.keys_seen[b], v, c.s_q, len, c.heads, 1, d,
                                                  l, c.scale, /*causal=*/true);
    e.out.insert(e.out.end(), r.out.begin(), r.out.end());
    e.lse.insert(e.lse.end(), r.lse.begin(), r.lse.end());
  }
  return e;
}

struct Outputs {
  Tensor out_storage, lse_storage;
  TensorView out, lse;
};

// NaN-filled outputs; strided cases view into wider buffers.
Outputs make_outputs(const Case& c) {
  Outputs o;
  const int64_t pad = c.strided ? 8 : 0;
  o.out_storage = test::nan_tensor({c.batch(), c.s_q, c.heads, c.rank + pad}, c.out_dtype);
  o.out = o.out_storage.view().narrow(3, 0, c.rank);
  o.lse_storage = test::nan_tensor({c.batch(), c.s_q, c.heads + pad}, DType::kF32);
  o.lse = o.lse_storage.view().narrow(2, 0, c.heads);
  return o;
}

Outputs run_decode(const Case& c, const Inputs& in, const DecodeSchedule& schedule,
                   const ops::DecodeParams& params) {
  Outputs o = make_outputs(c);
  const Tensor ws = test::nan_tensor(
      {std::max<int64_t>(1, ops::mla_decode_workspace_elems(schedule, c.s_q, c.heads, c.rank))},
      DType::kF32);
  ops::mla_decode(in.q, in.cache, in.block_table, in.seq_lens, o.out, o.lse, params, schedule, ws);
  return o;
}
Outputs run_decode(const Case& c, const Inputs& in, const DecodeSchedule& schedule) {
  return run_decode(c, in, schedule, c.params());
}

DecodeSchedule plan(const Case& c, int64_t workers) {
  return plan_decode_splits(c.seq_lens, c.block_size, workers);
}

// One split per non-empty request, all of one whole-block length.
DecodeSchedule single_split_schedule(const Case& c) {
  const int32_t longest = *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
  const auto bs = static_cast<int32_t>(c.block_size);
  DecodeSchedule s;
  s.split_len.assign(c.seq_lens.size(), std::max(bs, (longest + bs - 1) / bs * bs));
  s.split_offsets = {0};
  for (int32_t len : c.seq_lens) s.split_offsets.push_back(s.split_offsets.back() + (len > 0));
  s.total_splits = s.split_offsets.back();
  s.max_splits = 1;
  return s;
}

void expect_close(const Case& c, const Outputs& o, const Expected& e) {
  EXPECT_TRUE(test::all_close(o.out, e.out, test::tolerance_for(c.out_dtype))) << "out";
  // LSE is f32 of O(10) magnitude: f32 rounding of the scores and the log.
  EXPECT_TRUE(test::all_close(o.lse, e.lse, {2e-5, 2e-5})) << "lse";
}

void check_case(const Case& c, uint64_t stream, int64_t workers = 2) {
  auto rng = test::make_rng(stream);
  const Inputs in = make_inputs(c, rng);
  const Expected e = reference(c, in);
  expect_close(c, run_decode(c, in, plan(c, workers)), e);
}

// Lengths around block boundaries plus the empty and one-token requests.
// Lengths around page boundaries for s_q queries per request: empty, the shortest valid (s_q; a
// seq_len counts the new tokens too), one page +- 1, two and three pages.
std::vector<int32_t> boundary_lens(int64_t bs, int64_t s_q = 1) {
  const auto b = static_cast<int32_t>(bs);
  const auto q = static_cast<int32_t>(s_q);
  return {0, q, b - 1 > q ? b - 1 : q + 1, b, b + 1, 2 * b + 1, 3 * b - 1, 70};
}

TEST(MlaDecode, AutoCacheDtypes) {
  uint64_t stream = 100;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    Case c;
    c.seq_lens = boundary_lens(16);
    c.cache_dtype = dt;
    c.q_dtype = dt;
    SCOPED_TRACE(dtype_name(dt));
    check_case(c, stream++);
  }
  Case mixed;  // q and cache dtypes may differ
  mixed.seq_lens = {33, 5};
  mixed.cache_dtype = DType::kBF16;
  mixed.q_dtype = DType::kF32;
  SCOPED_TRACE("f32 q, bf16 cache");
  check_case(mixed, stream++);
}

TEST(MlaDecode, Fp8CacheWithScales) {
  uint64_t stream = 200;
  for (float k_scale : {1.0f, 3.0f}) {
    for (DType q_dtype : {DType::kBF16, DType::kFp8E4m3, DType::kU8}) {
      for (float q_scale : {1.0f, 2.0f}) {
        Case c;
        c.seq_lens = boundary_lens(16);
        c.kv_dtype = KvCacheDType::kFp8E4m3;
        c.k_scale = k_scale;
        c.q_dtype = q_dtype;
        c.q_scale = q_scale;  // ignored for a bf16 q
        c.out_dtype = DType::kBF16;
        SCOPED_TRACE(testing::Message() << "k_scale " << k_scale << " q " << dtype_name(q_dtype)
                                        << " q_scale " << q_scale);
        check_case(c, stream++);
      }
    }
  }
}

// ---- q_scale / k_scale as tensors (DecodeParams::q_scale_tensor / k_scale_tensor) -------------

// An f32 [n] tensor of `values` whose elements lie `step` floats apart (a strided view for
// step > 1; the gaps hold NaN).
struct ScaleTensor {
  Tensor storage;
  TensorView view;
};
ScaleTensor scale_tensor(const std::vector<float>& values, int64_t step = 1) {
  const auto n = static_cast<int64_t>(values.size());
  ScaleTensor t{test::nan_tensor({std::max<int64_t>(1, n * step)}, DType::kF32), {}};
  for (int64_t i = 0; i < n; ++i) t.storage.data<float>()[i * step] = values[i];
  t.view = t.storage.view().narrow(0, 0, (n - 1) * step + 1);
  t.view.shape[0] = n;
  t.view.strides[0] = step;
  return t;
}

// fp8 q over an fp8_e4m3 cache with one (q_scale, k_scale) per request: the codes were written
// with scales 1, so request b's kernel sees q = code * q_scales[b], K = V = code * k_scales[b];
// the fp64 oracle gets exactly those values.
TEST(MlaDecode, PerRequestScaleTensorsMatchTheOracle) {
  Case c;
  c.seq_lens = boundary_lens(16);
  c.kv_dtype = KvCacheDType::kFp8E4m3;
  c.q_dtype = DType::kFp8E4m3;
  c.out_dtype = DType::kF32;  // f32's tolerance: a scale off by 1e-4 shows
  auto rng = test::make_rng(250);
  Inputs in = make_inputs(c, rng);
  std::vector<float> q_scales, k_scales;
  for (int64_t b = 0; b < c.batch(); ++b) {
    q_scales.push_back(0.25f + 0.375f * static_cast<float>(b));
    k_scales.push_back(2.5f - 0.25f * static_cast<float>(b));
  }
  const int64_t rows = c.s_q * c.heads, d = c.dim();
  for (int64_t b = 0; b < c.batch(); ++b) {
    for (int64_t i = 0; i < rows * d; ++i) in.q_seen[b * rows * d + i] *= q_scales[b];
    for (double& v : in.keys_seen[b]) v *= k_scales[b];
  }
  const Expected e = reference(c, in);
  for (int64_t step : {1, 3}) {
    SCOPED_TRACE(testing::Message() << "scale tensors with element stride " << step);
    const ScaleTensor qs = scale_tensor(q_scales, step), ks = scale_tensor(k_scales, step);
    ops::DecodeParams params = c.params();
    params.q_scale = params.k_scale = std::nanf("");  // replaced by the tensors: never read
    params.q_scale_tensor = qs.view;
    params.k_scale_tensor = ks.view;
    for (int64_t workers : {1, 3}) expect_close(c, run_decode(c, in, plan(c, workers), params), e);
  }
}

// One-element tensors give the float form's bits, for every cache format (a scale that does not
// apply is read and checked but changes nothing), and may mix with a float of the other scale.
TEST(MlaDecode, OneElementScaleTensorsEqualTheFloatFormBitwise) {
  uint64_t stream = 260;
  for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3}) {
    for (DType q_dtype : {DType::kBF16, DType::kFp8E4m3}) {
      if (kv == KvCacheDType::kAuto && q_dtype == DType::kFp8E4m3) continue;
      Case c;
      c.seq_lens = {0, 1, 17, 40};
      c.kv_dtype = kv;
      c.q_dtype = q_dtype;
      c.q_scale = 1.75f;
      c.k_scale = 0.625f;
      c.out_dtype = DType::kF32;
      SCOPED_TRACE(testing::Message()
                   << "kv " << static_cast<int>(kv) << " q " << dtype_name(q_dtype));
      auto rng = test::make_rng(stream++);
      const Inputs in = make_inputs(c, rng);
      const DecodeSchedule schedule = plan(c, 2);
      const Outputs floats = run_decode(c, in, schedule);
      const ScaleTensor qs = scale_tensor({c.q_scale}), ks = scale_tensor({c.k_scale});
      for (int which = 0; which < 3; ++which) {  // both tensors, q_scale only, k_scale only
        ops::DecodeParams params = c.params();
        if (which != 2) params.q_scale_tensor = qs.view;
        if (which != 1) params.k_scale_tensor = ks.view;
        const Outputs o = run_decode(c, in, schedule, params);
        EXPECT_EQ(std::memcmp(o.out.data, floats.out.data, o.out.numel() * o.out.element_size()), 0)
            << which;
        EXPECT_EQ(std::memcmp(o.lse.data, floats.lse.data, o.lse.numel() * o.lse.element_size()), 0)
            << which;
      }
    }
  }
}

TEST(MlaDecode, DsMlaCache) {
  uint64_t stream = 300;
  for (DType act : {DType::kBF16, DType::kF16}) {
    Case c;
    c.seq_lens = boundary_lens(16);
    c.kv_dtype = KvCacheDType::kFp8DsMla;
    c.cache_dtype = act;
    c.q_dtype = act;
    c.k_scale = 5.0f;  // the layout carries its own scales; k_scale must not apply
    SCOPED_TRACE(dtype_name(act));
    check_case(c, stream++);
  }
  Case fp8_q;  // fp8 q: the rope dtype comes from out
  fp8_q.seq_lens = {40, 17};
  fp8_q.kv_dtype = KvCacheDType::kFp8DsMla;
  fp8_q.cache_dtype = DType::kF16;
  fp8_q.q_dtype = DType::kFp8E4m3;
  fp8_q.q_scale = 2.0f;
  fp8_q.out_dtype = DType::kF16;
  SCOPED_TRACE("fp8 q");
  check_case(fp8_q, stream++);
}

TEST(MlaDecode, SpeculativeQueriesBottomRightCausal) {
  uint64_t stream = 400;
  for (int64_t s_q = 1; s_q <= 8; ++s_q) {
    Case c;
    const auto sq = static_cast<int32_t>(s_q);
    // seq_len == s_q: query 0 sees one key; empty requests; lengths past s_q.
    c.seq_lens = {sq, sq + 1, 77, 0, sq + 2};
    c.s_q = s_q;
    c.heads = 8;
    SCOPED_TRACE(testing::Message() << "s_q " << s_q);
    check_case(c, stream++);
  }
}

TEST(MlaDecode, HeadCounts) {
  uint64_t stream = 500;
  for (int64_t heads : {1, 16, 128}) {
    Case c;
    c.seq_lens = heads == 128 ? std::vector<int32_t>{5, 40} : boundary_lens(16);
    c.heads = heads;
    c.s_q = heads == 128 ? 2 : 1;
    SCOPED_TRACE(testing::Message() << "heads " << heads);
    check_case(c, stream++);
  }
}

TEST(MlaDecode, BlockSizes) {
  uint64_t stream = 600;
  for (int64_t bs : {1, 16, 64, 128}) {
    Case c;
    c.block_size = bs;
    c.seq_lens = boundary_lens(bs);
    c.heads = 4;
    SCOPED_TRACE(testing::Message() << "block_size " << bs);
    check_case(c, stream++);
  }
}

TEST(MlaDecode, SmallAndOddLatentDims) {
  // L + R not 576; L = 100 is not a multiple of the kernel's 32-column value block.
  uint64_t stream = 700;
  for (auto [rank, rope] : {std::pair<int64_t, int64_t>{64, 16}, {100, 12}, {7, 3}}) {
    Case c;
    c.rank = rank;
    c.rope = rope;
    c.seq_lens = boundary_lens(16, 3);
    c.s_q = 3;
    SCOPED_TRACE(testing::Message() << "L " << rank << " R " << rope);
    check_case(c, stream++);
  }
}

TEST(MlaDecode, StridedQueryOutputAndLse) {
  Case c;
  c.seq_lens = {50, 0, 129};
  c.s_q = 2;
  c.strided = true;
  c.out_dtype = DType::kBF16;
  check_case(c, 800);
}

TEST(MlaDecode, MultiSplitEqualsSingleSplit) {
  Case c;
  c.seq_lens = {300, 513, 0, 64, 1000, 2};
  c.s_q = 2;
  c.heads = 8;
  auto rng = test::make_rng(900);
  const Inputs in = make_inputs(c, rng);
  const Expected e = reference(c, in);
  const DecodeSchedule single = single_split_schedule(c);
  const DecodeSchedule many = plan(c, 1024);
  ASSERT_GT(many.max_splits, 4);  // the 1000-token request is cut into 64-token pieces
  const Outputs a = run_decode(c, in, single);
  const Outputs b = run_decode(c, in, many);
  expect_close(c, a, e);
  expect_close(c, b, e);
  EXPECT_TRUE(test::all_close(b.out, test::to_doubles(a.out), {1e-5, 1e-5}));
  EXPECT_TRUE(test::all_close(b.lse, test::to_doubles(a.lse), {1e-5, 1e-5}));
}

// A hand-made schedule finer than the planner makes: early queries see only the first keys, so
// whole splits see no key for their rows and the combine meets -inf partial LSEs (query 0 of
// request 0 sees key 0 only: 3 of its 4 splits are empty for it).
TEST(MlaDecode, SplitsWithoutVisibleKeys) {
  Case c;
  c.seq_lens = {8, 11};
  c.s_q = 8;
  c.heads = 2;
  c.block_size = 1;
  DecodeSchedule s;
  s.split_len = {2, 3};
  s.split_offsets = {0, 4, 8};  // ceil(8 / 2) = 4, ceil(11 / 3) = 4
  s.total_splits = 8;
  s.max_splits = 4;
  auto rng = test::make_rng(1000);
  const Inputs in = make_inputs(c, rng);
  expect_close(c, run_decode(c, in, s), reference(c, in));
}

// Spec D.6: the same keys paged with block size 1 and 16 give bit-identical results (the schedule
// is the same: its split lengths are multiples of both block sizes).
TEST(MlaDecode, PagingInvariance) {
  Case c16;
  c16.seq_lens = {1027, 1025, 3, 0};
  c16.heads = 16;
  c16.block_size = 16;
  auto rng = test::make_rng(1100);
  const Inputs in16 = make_inputs(c16, rng);

  // Repage the same entries with block size 1, in shuffled order.
  Case c1 = c16;
  c1.block_size = 1;
  Inputs in1;
  int64_t tokens = 0;
  for (int32_t len : c1.seq_lens) tokens += len;
  const int64_t d = c16.dim();
  in1.cache = test::nan_tensor({tokens + 2, 1, d}, c16.cache_dtype);
  std::vector<int64_t> slots(tokens + 2);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  const int64_t width = *std::max_element(c1.seq_lens.begin(), c1.seq_lens.end()) + 1;
  std::vector<int64_t> table(c1.batch() * width, -1);
  const TensorView bt16 = in16.block_table.view();
  int64_t next = 0;
  const int64_t bytes = d * dtype_size(c16.cache_dtype);
  for (int64_t b = 0; b < c1.batch(); ++b) {
    for (int64_t s = 0; s < c1.seq_lens[b]; ++s) {
      const int64_t src_slot = static_cast<int64_t>(test::element(bt16, {b, s / 16})) * 16 + s % 16;
      table[b * width + s] = slots[next++];
      std::memcpy(static_cast<uint8_t*>(in1.cache.view().data) + table[b * width + s] * bytes,
                  static_cast<const uint8_t*>(in16.cache.view().data) + src_slot * bytes, bytes);
    }
  }
  in1.block_table = test::int_tensor(table, {c1.batch(), width}, DType::kI32);
  in1.seq_lens = in16.seq_lens;
  in1.q = in16.q;

  for (int64_t workers : {1, 64}) {
    const DecodeSchedule s = plan(c16, workers);  // multiples of 16, hence of 1
    const Outputs o16 = run_decode(c16, in16, s);
    const Outputs o1 = run_decode(c1, in1, s);
    SCOPED_TRACE(testing::Message() << "workers " << workers);
    EXPECT_TRUE(test::all_close(o1.out, test::to_doubles(o16.out), {0, 0}));
    EXPECT_TRUE(test::all_close(o1.lse, test::to_doubles(o16.lse), {0, 0}));
    expect_close(c16, o16, reference(c16, in16));
  }
}

// Spec F-5 / F-42: padding requests (seq_len 0, block-table row -1) give out 0, lse -inf.
TEST(MlaDecode, EmptyRequestsNeverTouchTheTable) {
  Case c;
  c.seq_lens = {0, 0, 0};
  auto rng = test::make_rng(1200);
  const Inputs in = make_inputs(c, rng);
  const Outputs o = run_decode(c, in, plan(c, 2));
  for (double v : test::to_doubles(o.out)) ASSERT_EQ(v, 0.0);
  for (double v : test::to_doubles(o.lse)) ASSERT_EQ(v, kNegInf);
}

TEST(MlaDecode, ConvenienceOverloadPlansItself) {
  Case c;
  c.seq_lens = {700, 3, 0, 129};
  c.s_q = 2;
  auto rng = test::make_rng(1300);
  const Inputs in = make_inputs(c, rng);
  Outputs o = make_outputs(c);
  ops::mla_decode(in.q, in.cache, in.block_table, in.seq_lens, o.out, o.lse, c.params());
  expect_close(c, o, reference(c, in));
}

// Batch-invariant schedules (plan_mla_decode with batch_invariant): request r's out and lse bits
// alone and inside 20 random batches of 1..128 companions (random lengths, values, positions).
// The pieces of r depend on its own length only, each piece is computed alone, and the combine
// merges r's pieces in order.
void check_batch_invariance(Case c, int32_t r_len, uint64_t stream) {
  auto rng = test::make_rng(stream);
  const RequestValues r = random_request(c, r_len, rng);
  const RequestValues pool = random_request(c, 4096, rng);  // the companions' values
  auto run = [&](const std::vector<RequestValues>& batch, size_t at, bool oracle) {
    Case bc = c;
    bc.seq_lens.clear();
    for (const RequestValues& v : batch) bc.seq_lens.push_back(v.seq_len);
    const Inputs in = batch_inputs(bc, batch, rng);
    const int64_t max_len = in.block_table.size(1) * bc.block_size;
    const DecodeSchedule s = ops::plan_mla_decode(
        {Device::cpu(), bc.batch(), bc.s_q, bc.heads, bc.block_size, max_len, true}, bc.seq_lens);
    const Outputs o = run_decode(bc, in, s);
    if (oracle) expect_close(bc, o, reference(bc, in));
    return std::pair{test::to_doubles(o.out.narrow(0, static_cast<int64_t>(at), 1)),
                     test::to_doubles(o.lse.narrow(0, static_cast<int64_t>(at), 1))};
  };
  const auto [alone_out, alone_lse] = run({r}, 0, true);
  std::uniform_int_distribution<int> companions(1, 128);
  std::uniform_int_distribution<int32_t> other_len(0, 300);
  std::uniform_int_distribution<int64_t> offset(0, 4096 - 300);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<RequestValues> batch;
    const int n = companions(rng);
    for (int i = 0; i < n; ++i) {
      RequestValues v;
      v.seq_len = other_len(rng);
      // seq_lens count the s_q new tokens too: a length in (0, s_q) becomes s_q.
      if (v.seq_len > 0 && v.seq_len < c.s_q) v.seq_len = static_cast<int32_t>(c.s_q);
      const int64_t at = offset(rng) * c.dim();
      v.keys.assign(pool.keys.begin() + at, pool.keys.begin() + at + v.seq_len * c.dim());
      v.q.assign(pool.keys.begin() + at, pool.keys.begin() + at + static_cast<int64_t>(r.q.size()));
      batch.push_back(std::move(v));
    }
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

TEST(MlaDecode, BatchInvariantRequestIsBitwiseTheSameInAnyBatch) {
  Case c;  // three pieces of 1024 keys (block 16)
  check_batch_invariance(c, 2500, 1250);
  Case spec = c;  // s_q 2, bf16 out, fp8 cache
  spec.s_q = 2;
  spec.out_dtype = DType::kBF16;
  spec.kv_dtype = KvCacheDType::kFp8E4m3;
  spec.k_scale = 2.0f;
  check_batch_invariance(spec, 1500, 1251);
}

// ---- errors -----------------------------------------------------------------------------------

class MlaDecodeErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.seq_lens = {20, 200};
    c_.heads = 4;
    auto rng = test::make_rng(1400);
    in_ = make_inputs(c_, rng);
    out_ = make_outputs(c_);
    schedule_ = plan(c_, 2);
    // Room for 64 splits, so that schedule errors are not masked by the workspace check.
    ws_ = Tensor::empty({64 * 4 * 513}, DType::kF32);
  }
  void run(const TensorView& q, const TensorView& cache, const TensorView& table,
           const TensorView& lens, const ops::DecodeParams& params, const DecodeSchedule& s,
           const TensorView& ws) {
    ops::mla_decode(q, cache, table, lens, out_.out, out_.lse, params, s, ws);
  }
  void run_with(const ops::DecodeParams& params) {
    run(in_.q, in_.cache, in_.block_table, in_.seq_lens, params, schedule_, ws_);
  }

  Case c_;
  Inputs in_;
  Outputs out_;
  DecodeSchedule schedule_;
  Tensor ws_;
};

TEST_F(MlaDecodeErrors, BadBlockIdNamesRequestColumnAndId) {
  in_.block_table.data<int32_t>()[1 * in_.block_table.size(1) + 2] = 999;
  try {
    run_with(c_.params());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("mla_decode: block_table[1, 2] = 999"), std::string::npos)
        << e.what();
  }
  in_.block_table.data<int32_t>()[1 * in_.block_table.size(1) + 2] = -1;
  MLAKIT_EXPECT_THROW_MSG(run_with(c_.params()), "block_table[1, 2] = -1");
}

TEST_F(MlaDecodeErrors, SeqLenBeyondTable) {
  in_.seq_lens.data<int32_t>()[1] = static_cast<int32_t>(in_.block_table.size(1) * 16 + 1);
  MLAKIT_EXPECT_THROW_MSG(run_with(c_.params()), "mla_decode: seq_lens[1] must be in [0, ");
  in_.seq_lens.data<int32_t>()[1] = -1;
  MLAKIT_EXPECT_THROW_MSG(run_with(c_.params()), "seq_lens[1] must be in");
}

TEST_F(MlaDecodeErrors, WrongQueryWidth) {
  const TensorView q575 = in_.q.narrow(3, 0, 575);
  MLAKIT_EXPECT_THROW_MSG(
      run(q575, in_.cache, in_.block_table, in_.seq_lens, c_.params(), schedule_, ws_),
      "mla_decode: kv_cache.shape[2] (the cache entry width) must equal q.shape[3] (L + R) = 575, "
      "got 576");
}

// A 577-wide cache entry is the cache's fault: the message names kv_cache, and q as the reference.
TEST_F(MlaDecodeErrors, WrongCacheEntryWidthNamesTheCache) {
  const Tensor cache577 = Tensor::zeros({in_.cache.size(0), 16, 577}, DType::kBF16);
  MLAKIT_EXPECT_THROW_MSG(
      run(in_.q, cache577, in_.block_table, in_.seq_lens, c_.params(), schedule_, ws_),
      "mla_decode: kv_cache.shape[2] (the cache entry width) must equal q.shape[3] (L + R) = 576, "
      "got 577");
}

// An out buffer narrower (or wider) than the latent width L is an error, not a decode that
// silently takes the first out.shape[3] latent dims as the values.
TEST_F(MlaDecodeErrors, OutMustHaveTheLatentWidth) {
  for (const int64_t width : {128, 511, 513}) {
    const Tensor out = Tensor::empty({2, 1, 4, width}, DType::kF32);
    MLAKIT_EXPECT_THROW_MSG(ops::mla_decode(in_.q, in_.cache, in_.block_table, in_.seq_lens, out,
                                            out_.lse, c_.params(), schedule_, ws_),
                            "mla_decode: out.shape[3] must equal kv_lora_rank (the latent width "
                            "L) = 512, got " +
                                std::to_string(width));
  }
  ops::DecodeParams p = c_.params();
  p.kv_lora_rank = 576;  // leaves no rope part
  MLAKIT_EXPECT_THROW_MSG(run_with(p),
                          "mla_decode: kv_lora_rank must be in [1, q.shape[3] - 1 = "
                          "575] (L of L + R = 576), got 576");
  p.kv_lora_rank = -1;
  MLAKIT_EXPECT_THROW_MSG(run_with(p), "mla_decode: kv_lora_rank must be > 0, got -1");
}

// A workspace size that overflows int64 is an error, not a wrapped number (fuzz finding).
TEST(MlaDecodeWorkspace, SizeOverflowIsAnError) {
  DecodeSchedule s;
  s.total_splits = 1;
  MLAKIT_EXPECT_THROW_MSG(
      ops::mla_decode_workspace_elems(s, 3, std::numeric_limits<int64_t>::max(), 10),
      "mla_decode_workspace_elems: total_splits x s_q x num_heads x (kv_lora_rank + 1) = 1 x 3 x "
      "9223372036854775807 x (10 + 1) overflows int64");
  EXPECT_EQ(ops::mla_decode_workspace_elems(s, 3, 16, 512), 3 * 16 * 513);
}

// seq_lens count the new tokens too: 0 < seq_len < s_q is inconsistent metadata (before, its
// early queries quietly returned 0 / -inf). Both decode forms reject it on host metadata.
TEST(MlaDecodeSeqLens, ShorterThanTheQueriesIsRejected) {
  Case c;
  c.seq_lens = {20, 3, 0};
  c.s_q = 4;
  c.heads = 2;
  auto rng = test::make_rng(1450);
  const Inputs in = make_inputs(c, rng);
  const Outputs o = make_outputs(c);
  const std::string message =
      "mla_decode: seq_lens[1] must be 0 or at least s_q = q.shape[1] = 4 (seq_lens count the new "
      "tokens too), got 3";
  MLAKIT_EXPECT_THROW_MSG(
      ops::mla_decode(in.q, in.cache, in.block_table, in.seq_lens, o.out, o.lse, c.params()),
      message);
  // The scheduled form, with a schedule that covers the lengths as given.
  const DecodeSchedule s = plan_decode_splits(c.seq_lens, c.block_size, 2);
  const Tensor ws =
      Tensor::empty({ops::mla_decode_workspace_elems(s, c.s_q, c.heads, c.rank)}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(
      ops::mla_decode(in.q, in.cache, in.block_table, in.seq_lens, o.out, o.lse, c.params(), s, ws),
      message);
}

TEST_F(MlaDecodeErrors, Fp8QueryNeedsFp8Cache) {
  const Tensor q8 = Tensor::zeros({2, 1, 4, 576}, DType::kFp8E4m3);
  MLAKIT_EXPECT_THROW_MSG(
      run(q8, in_.cache, in_.block_table, in_.seq_lens, c_.params(), schedule_, ws_),
      "fp8 q needs an fp8 kv_cache_dtype");
}

TEST_F(MlaDecodeErrors, WorkspaceTooSmall) {
  const DecodeSchedule many = plan(c_, 64);
  ASSERT_GT(many.total_splits, 2);
  const int64_t needed = ops::mla_decode_workspace_elems(many, 1, 4, 512);
  const Tensor small = Tensor::empty({needed - 1}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(
      run(in_.q, in_.cache, in_.block_table, in_.seq_lens, c_.params(), many, small),
      "mla_decode: split_workspace must hold at least");
}

TEST_F(MlaDecodeErrors, BadScales) {
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  for (float bad : {0.0f, -0.1f, nan, inf}) {
    ops::DecodeParams p = c_.params();
    p.scale = bad;
    MLAKIT_EXPECT_THROW_MSG(run_with(p), "mla_decode: scale must be finite and > 0");
    p = c_.params();
    p.q_scale = bad;
    MLAKIT_EXPECT_THROW_MSG(run_with(p), "mla_decode: q_scale must be finite and > 0");
    p = c_.params();
    p.k_scale = bad;
    MLAKIT_EXPECT_THROW_MSG(run_with(p), "mla_decode: k_scale must be finite and > 0");
  }
}

TEST_F(MlaDecodeErrors, BadScaleTensors) {
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  for (float bad : {0.0f, -0.1f, nan, inf}) {
    const ScaleTensor one = scale_tensor({bad}), per_request = scale_tensor({1.0f, bad});
    ops::DecodeParams p = c_.params();
    p.q_scale_tensor = one.view;  // checked like the float, also where it does not apply
    MLAKIT_EXPECT_THROW_MSG(run_with(p), "mla_decode: q_scale must be finite and > 0");
    p = c_.params();
    p.k_scale_tensor = per_request.view;
    MLAKIT_EXPECT_THROW_MSG(run_with(p), "mla_decode: k_scale[1] must be finite and > 0");
  }
  const ScaleTensor three = scale_tensor({1.0f, 1.0f, 1.0f});
  ops::DecodeParams p = c_.params();
  p.q_scale_tensor = three.view;
  MLAKIT_EXPECT_THROW_MSG(
      run_with(p), "mla_decode: q_scale must have exactly one element or the shape [B] = [2]");
  const Tensor f16 = Tensor::empty({1}, DType::kF16);
  p = c_.params();
  p.k_scale_tensor = f16.view();
  MLAKIT_EXPECT_THROW_MSG(run_with(p), "mla_decode: k_scale must have dtype f32");
  p = c_.params();
  p.k_scale_tensor = out_.lse.narrow(2, 0, 1).narrow(1, 0, 1).narrow(0, 0, 1);
  MLAKIT_EXPECT_THROW_MSG(run_with(p), "mla_decode: k_scale must not overlap lse");
  ws_.data<float>()[7] = 1.0f;  // a valid value, inside the workspace the decode writes
  p = c_.params();
  p.q_scale_tensor = ws_.view().narrow(0, 7, 1);
  MLAKIT_EXPECT_THROW_MSG(run_with(p), "mla_decode: q_scale must not overlap split_workspace");
}

TEST_F(MlaDecodeErrors, ScheduleMustMatchSeqLens) {
  DecodeSchedule s = plan_decode_splits(std::vector<int32_t>{20, 400}, 16, 64);
  MLAKIT_EXPECT_THROW_MSG(run(in_.q, in_.cache, in_.block_table, in_.seq_lens, c_.params(), s, ws_),
                          "schedule does not match seq_lens: request 1");
  DecodeSchedule short_one = plan_decode_splits(std::vector<int32_t>{20}, 16, 2);
  MLAKIT_EXPECT_THROW_MSG(
      run(in_.q, in_.cache, in_.block_table, in_.seq_lens, c_.params(), short_one, ws_),
      "schedule must describe the batch");
  DecodeSchedule unaligned = schedule_;
  unaligned.split_len[0] = 8;  // not a multiple of block_size 16
  MLAKIT_EXPECT_THROW_MSG(
      run(in_.q, in_.cache, in_.block_table, in_.seq_lens, c_.params(), unaligned, ws_),
      "schedule.split_len[0] must be a positive multiple of block_size 16");
}

TEST_F(MlaDecodeErrors, ShapesAndDtypes) {
  const Tensor lse16 = Tensor::empty({2, 1, 4}, DType::kBF16);
  MLAKIT_EXPECT_THROW_MSG(ops::mla_decode(in_.q, in_.cache, in_.block_table, in_.seq_lens, out_.out,
                                          lse16, c_.params(), schedule_, ws_),
                          "mla_decode: lse must have dtype f32");
  const Tensor out5 = Tensor::empty({2, 1, 5, 512}, DType::kF32);
  MLAKIT_EXPECT_THROW_MSG(ops::mla_decode(in_.q, in_.cache, in_.block_table, in_.seq_lens, out5,
                                          out_.lse, c_.params(), schedule_, ws_),
                          "mla_decode: out.shape[2] must equal q.shape[2] (num_heads) = 4, got 5");
  const Tensor table64 = Tensor::zeros({2, in_.block_table.size(1)}, DType::kI64);
  MLAKIT_EXPECT_THROW_MSG(run(in_.q, in_.cache, table64, in_.seq_lens, c_.params(), schedule_, ws_),
                          "block_table must have dtype i32");
  const Tensor lens3 = Tensor::zeros({3}, DType::kI32);
  MLAKIT_EXPECT_THROW_MSG(
      run(in_.q, in_.cache, in_.block_table, lens3, c_.params(), schedule_, ws_),
      "mla_decode: seq_lens.shape[0] must equal q.shape[0] (batch B) = 2, got 3");
  ops::DecodeParams fp8 = c_.params();
  fp8.kv_dtype = KvCacheDType::kFp8E4m3;  // bf16 cache tensor with an fp8 format
  MLAKIT_EXPECT_THROW_MSG(run_with(fp8), "kv_cache (kv_cache_dtype fp8_e4m3) must have dtype u8");
}

TEST_F(MlaDecodeErrors, DsMlaNeedsA16BitActivation) {
  const Tensor cache = Tensor::zeros({4, 16, kDsMlaEntryBytes}, DType::kU8);
  const Tensor q = Tensor::zeros({2, 1, 4, 576}, DType::kF32);
  ops::DecodeParams p = c_.params();
  p.kv_dtype = KvCacheDType::kFp8DsMla;
  MLAKIT_EXPECT_THROW_MSG(run(q, cache, in_.block_table, in_.seq_lens, p, schedule_, ws_),
                          "fp8_ds_mla stores rope values in the 16-bit activation dtype");
}

#ifndef MLAKIT_WITH_CUDA  // with the CUDA backend these host pointers would reach a real kernel
TEST_F(MlaDecodeErrors, CudaTensorsHaveNoKernelInThisBuild) {
  TensorView q = in_.q, cache = in_.cache.view(), table = in_.block_table.view(),
             lens = in_.seq_lens.view(), out = out_.out, lse = out_.lse, ws = ws_.view();
  for (TensorView* t : {&q, &cache, &table, &lens, &out, &lse, &ws}) t->device = Device::cuda(0);
  MLAKIT_EXPECT_THROW_MSG(
      ops::mla_decode(q, cache, table, lens, out, lse, c_.params(), schedule_, ws),
      "mla_decode: no kernel for cuda:0");
  MLAKIT_EXPECT_THROW_MSG(
      run(in_.q, cache, in_.block_table, in_.seq_lens, c_.params(), schedule_, ws_),
      "kv_cache is on cuda:0 but q is on cpu");
}
#endif

}  // namespace
}  // namespace mlakit
