// ops::mla_prefill on CUDA tensors against the fp64 attention of tests/reference (K built as
// [k_nope | k_pe broadcast over heads]) and against the CPU op on the same bytes: random varlen
// batches (empty requests, lengths that are not multiples of the 64-row / 64-key tiles, fewer
// keys than queries), causal and not, 1-5 / 16 / 128 heads, bf16 and f16, k_nope and v as strided
// views of one [S, N, 256] kv_b_proj output, out with head stride 192 (padding must stay
// untouched; column pairs stored at once) or 193 (one store per element), out f32 from bf16 inputs,
// lse present or absent, unaligned rows (the scalar load path), and every error: the CPU
// validation's messages, what only CUDA rejects, and bad cu_seqlens values reported by the device.
// Out and lse start NaN, so every row must be written. The warp-specialized kernel's blocks of
// several heads (the launcher's choice for many short requests, which these small shapes are not)
// are forced through cuda::mla_prefill's heads_per_block: 2-5 heads per block over 1-5, 16 and 128
// heads, the last block of heads short when they do not divide. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.hpp"
#include "cuda/gpu_test_util.hpp"
#include "cuda/prefill/launch.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"
#include "reference/reference.hpp"

namespace mlakit {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kNope = 128, kRope = 64, kDv = 128, kDqk = kNope + kRope;  // MLA head sizes
// Output head stride of the padded-V layout (spec F-25): columns [128, 192) must stay untouched.
constexpr int64_t kOutHeadStride = 192;
// LSEs are f32 log-sum-exps of O(1) scores over a few hundred keys (exp2 / log2 approximations
// of a few ulps on the GPU).
constexpr test::Tolerance kLseTolerance{1e-4, 1e-4};

std::vector<int64_t> offsets_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu{0};
  for (int64_t len : lengths) cu.push_back(cu.back() + len);
  return cu;
}

struct Case {
  DType dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;
  int64_t heads = 2;
  std::vector<int64_t> sq, sk;
  bool causal = true;
  bool with_lse = true;
  int64_t q_pad = 8;  // extra elements per q head row: 8 keeps rows 16-byte aligned, 3 does not
  // out's head stride: even (192) lets the epilogue store column pairs at once, odd does not
  int64_t out_head_stride = kOutHeadStride;
  int64_t extra_tokens = 0, extra_keys = 0;  // rows past the last request
  bool hashed_inputs = false;                // hashed_uniform_tensor instead of normal draws
  int heads_per_block = 0;  // > 0: forced on the warp-specialized kernel (cuda::mla_prefill)
};

// Host tensor of uniform values in [-2, 2) from a hash (splitmix64) of (seed, index): ~100x
// faster than test::random_tensor's normal draws, which the half a billion values of a
// 16384-token, 128-head batch need. Attention on it is as generic: scores of std ~1.3.
Tensor hashed_uniform_tensor(uint64_t seed, std::initializer_list<int64_t> shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint64_t x = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    // why: the top 24 bits scaled by 2^-22 are uniform in [0, 4)
    const double uniform = static_cast<double>(x >> 40) * 0x1.0p-22 - 2.0;
    store_float(t.view().data, dtype, i, static_cast<float>(uniform));
  }
  return t;
}

// Host inputs laid out as the MLA forward makes them, and their device mirrors.
struct Inputs {
  Case c;
  int64_t tokens = 0, keys = 0, max_q = 0, max_k = 0;
  float scale = 0.0f;
  Tensor q_buf, kv_buf, k_pe_buf, cu_q, cu_k;
  TensorView q, k_nope, k_pe, v;  // host views
};

Inputs make_inputs(std::mt19937_64& rng, const Case& c) {
  Inputs in;
  in.c = c;
  const std::vector<int64_t> cu_q = offsets_of(c.sq), cu_k = offsets_of(c.sk);
  in.tokens = cu_q.back() + c.extra_tokens;
  in.keys = cu_k.back() + c.extra_keys;
  const int64_t n = c.heads, rope_offset = 16;  // k_pe: the rope columns of a wider buffer
  auto random = [&](std::initializer_list<int64_t> shape) {
    return c.hashed_inputs ? hashed_uniform_tensor(rng(), shape, c.dtype)
                           : test::random_tensor(rng, shape, c.dtype);
  };
  in.q_buf = random({in.tokens, n, kDqk + c.q_pad});
  in.kv_buf = random({in.keys, n, kNope + kDv});  // [S, N, 256]
  in.k_pe_buf = random({in.keys, rope_offset + kRope});
  in.q = in.q_buf.view().narrow(2, 0, kDqk);
  in.k_nope = in.kv_buf.view().narrow(2, 0, kNope);
  in.v = in.kv_buf.view().narrow(2, kNope, kDv);
  in.k_pe = in.k_pe_buf.view().narrow(1, rope_offset, kRope);
  in.cu_q = test::int_tensor(cu_q, {static_cast<int64_t>(cu_q.size())}, DType::kI32);
  in.cu_k = test::int_tensor(cu_k, {static_cast<int64_t>(cu_k.size())}, DType::kI32);
  for (size_t b = 0; b < c.sq.size(); ++b) {
    in.max_q = std::max(in.max_q, c.sq[b]);
    in.max_k = std::max(in.max_k, c.sk[b]);
  }
  in.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kDqk)));
  return in;
}

// fp64 result: out [T, N, V], lse [N, T]; rows outside every request are 0 / -inf.
struct Expected {
  std::vector<double> out, lse;
};
Expected reference_prefill(const Inputs& in) {
  const int64_t n = in.c.heads;
  Expected e{std::vector<double>(in.tokens * n * kDv, 0.0),
             std::vector<double>(n * in.tokens, -kInf)};
  int64_t q0 = 0, k0 = 0;
  for (size_t b = 0; b < in.c.sq.size(); ++b) {
    const int64_t sq = in.c.sq[b], sk = in.c.sk[b];
    const std::vector<double> q = test::to_doubles(in.q.narrow(0, q0, sq));
    const std::vector<double> k_nope = test::to_doubles(in.k_nope.narrow(0, k0, sk));
    const std::vector<double> k_pe = test::to_doubles(in.k_pe.narrow(0, k0, sk));
    const std::vector<double> v = test::to_doubles(in.v.narrow(0, k0, sk));
    std::vector<double> k(sk * n * kDqk);  // [sk, N, P + R] = [k_nope | k_pe]
    for (int64_t s = 0; s < sk; ++s) {
      for (int64_t h = 0; h < n; ++h) {
        double* row = &k[(s * n + h) * kDqk];
        std::copy_n(&k_nope[(s * n + h) * kNope], kNope, row);
        std::copy_n(&k_pe[s * kRope], kRope, row + kNope);
      }
    }
    const ref::AttentionResult a =
        ref::attention(q, k, v, sq, sk, n, n, kDqk, kDv, in.scale, in.c.causal);
    std::copy(a.out.begin(), a.out.end(), e.out.begin() + q0 * n * kDv);
    for (int64_t i = 0; i < sq; ++i) {
      for (int64_t h = 0; h < n; ++h) e.lse[h * in.tokens + q0 + i] = a.lse[i * n + h];
    }
    q0 += sq;
    k0 += sk;
  }
  return e;
}

// Outputs of one backend: out_buf [T, N, 192] with out = [:, :, 0:128], lse [N, T]; NaN first.
struct Outputs {
  Tensor out_buf, lse;
  TensorView out() const { return out_buf.view().narrow(2, 0, kDv); }
};
Outputs nan_outputs(const Inputs& in) {
  return {test::nan_tensor({in.tokens, in.c.heads, in.c.out_head_stride}, in.c.out_dtype),
          test::nan_tensor({in.c.heads, in.tokens}, DType::kF32)};
}

Outputs run_cpu(const Inputs& in) {
  Outputs o = nan_outputs(in);
  ops::mla_prefill(in.q, in.k_nope, in.k_pe, in.v, in.cu_q, in.cu_k, in.max_q, in.max_k, in.scale,
                   in.c.causal, o.out(),
                   in.c.with_lse ? std::optional<TensorView>(o.lse.view()) : std::nullopt);
  return o;
}

// Runs the CUDA op on device copies of the input buffers (the same views) and copies back.
Outputs run_cuda(const Inputs& in) {
  const Tensor q = test::to_device(in.q_buf), kv = test::to_device(in.kv_buf);
  const Tensor pe = test::to_device(in.k_pe_buf);
  const Tensor cu_q = test::to_device(in.cu_q), cu_k = test::to_device(in.cu_k);
  const Outputs host = nan_outputs(in);
  const Tensor out = test::to_device(host.out_buf), lse = test::to_device(host.lse);
  const TensorView q_view = test::mirror(in.q, in.q_buf, q);
  const TensorView k_nope = test::mirror(in.k_nope, in.kv_buf, kv);
  const TensorView k_pe = test::mirror(in.k_pe, in.k_pe_buf, pe);
  const TensorView v = test::mirror(in.v, in.kv_buf, kv);
  const TensorView out_view = test::mirror(host.out(), host.out_buf, out);
  const std::optional<TensorView> lse_view =
      in.c.with_lse ? std::optional<TensorView>(lse.view()) : std::nullopt;
  if (in.c.heads_per_block > 0) {  // past the op's validation, which these inputs pass
    cuda::mla_prefill(q_view, k_nope, k_pe, v, cu_q, cu_k, in.max_q, in.max_k, in.scale,
                      in.c.causal, out_view, lse_view, Stream{}, in.c.heads_per_block);
  } else {
    ops::mla_prefill(q_view, k_nope, k_pe, v, cu_q, cu_k, in.max_q, in.max_k, in.scale, in.c.causal,
                     out_view, lse_view);
  }
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
  return {test::to_host(out), test::to_host(lse)};
}

// P is rounded to the input's 16-bit type before P V, so even an f32 out carries the input type's
// rounding; a 16-bit out adds its own final rounding (bf16 out of f16 inputs).
test::Tolerance case_tolerance(const Case& c) {
  const test::Tolerance in_tol = test::tolerance_for(c.dtype);
  const test::Tolerance out_tol = test::tolerance_for(c.out_dtype);
  return {std::max(in_tol.atol, out_tol.atol), std::max(in_tol.rtol, out_tol.rtol)};
}

// Checks a backend's outputs against the reference, and that the out padding stayed NaN.
void expect_matches(const char* backend, const Inputs& in, const Outputs& o, const Expected& e) {
  SCOPED_TRACE(backend);
  const test::Tolerance tol = case_tolerance(in.c);
  EXPECT_TRUE(test::all_close(o.out(), e.out, tol));
  if (in.c.with_lse) {
    EXPECT_TRUE(test::all_close(o.lse, e.lse, kLseTolerance));
  } else {
    EXPECT_TRUE(test::all_close(o.lse, std::vector<double>(o.lse.numel(), NAN), {0, 0}))
        << "lse written although omitted";
  }
  const TensorView padding = o.out_buf.view().narrow(2, kDv, in.c.out_head_stride - kDv);
  EXPECT_TRUE(test::all_close(padding, std::vector<double>(padding.numel(), NAN), {0, 0}))
      << "out was written past its head size";
}

// CUDA against the fp64 reference and against the CPU op (the same inputs, bytes and views).
void check_case(std::mt19937_64& rng, const Case& c) {
  const Inputs in = make_inputs(rng, c);
  const Expected e = reference_prefill(in);
  const Outputs gpu = run_cuda(in);
  expect_matches("cuda vs fp64 reference", in, gpu, e);
  const Outputs cpu = run_cpu(in);
  expect_matches("cpu vs fp64 reference", in, cpu, e);
  const std::vector<double> cpu_out = test::to_doubles(cpu.out());
  EXPECT_TRUE(test::all_close(gpu.out(), cpu_out, case_tolerance(c))) << "cuda vs cpu";
}

std::string describe(const Case& c) {
  std::ostringstream s;  // (string operator+ chains trip GCC 12's -Wrestrict false positive)
  s << dtype_name(c.dtype) << " -> " << dtype_name(c.out_dtype)
    << (c.causal ? " causal" : " non-causal") << " heads " << c.heads << " heads per block "
    << c.heads_per_block << " sq/sk";
  for (size_t b = 0; b < c.sq.size(); ++b) s << " " << c.sq[b] << "/" << c.sk[b];
  return s.str();
}

TEST(CudaPrefill, RandomVarlenBatchesMatchReferenceAndCpu) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(60);
  // heads 1-5 in blocks of 1-5 heads (0: the launcher's choice): the last block of heads is short
  // when the count does not divide
  std::uniform_int_distribution<int64_t> batch(1, 5), len(0, 300), coin(0, 3), heads(1, 5);
  std::uniform_int_distribution<int> heads_per_block(0, 5);
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (bool causal : {true, false}) {
      for (int trial = 0; trial < 2; ++trial) {
        Case c;
        c.dtype = c.out_dtype = dtype;
        c.causal = causal;
        c.heads = heads(rng);
        c.heads_per_block = heads_per_block(rng);
        const int64_t b = batch(rng);
        for (int64_t i = 0; i < b; ++i) {
          c.sq.push_back(coin(rng) == 0 ? 0 : len(rng));
          // Mostly keys = context + queries; sometimes fewer keys than queries.
          c.sk.push_back(coin(rng) == 0 ? len(rng) / 4 : c.sq.back() + len(rng) / 2);
        }
        SCOPED_TRACE(describe(c));
        check_case(rng, c);
      }
    }
  }
}

TEST(CudaPrefill, TileBoundaries) {
  // Lengths at and around the tiles of both kernels (64 rows / 64 keys for mma.sync, 128 / 128 for
  // the warp-specialized one): queries 1, 63, 64, 65, 127, 128, 129, 255, 257; keys equal, one
  // short, one past.
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(61);
  for (bool causal : {true, false}) {
    Case c;
    c.causal = causal;
    c.sq = {1, 63, 64, 65, 127, 128, 129, 255, 257};
    c.sk = {1, 62, 64, 66, 128, 129, 128, 254, 300};
    SCOPED_TRACE(describe(c));
    check_case(rng, c);
  }
}

// A NaN in one request's keys and values (key 5 of request 1, inside request 0's last key tile
// of 64 (mma.sync) or 128 (warp-specialized) keys, which the kernels read whole) leaves the other
// requests' rows exact: masked scores and zeroed value rows, not P = 0 times NaN.
TEST(CudaPrefill, NanValuesOfOneRequestStayInIt) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(62);
  for (bool causal : {true, false}) {
    Case c;
    c.causal = causal;
    c.sq = {70, 90, 50};
    c.sk = {100, 130, 60};
    c.heads_per_block = causal ? 2 : 0;  // the next head's tiles run on in the same ring
    SCOPED_TRACE(describe(c));
    Inputs in = make_inputs(rng, c);
    const int64_t poisoned = c.sk[0] + 5, row_width = kNope + kDv;  // kv_buf is [S, N, 256]
    for (int64_t i = 0; i < c.heads * row_width; ++i) {
      store_float(in.kv_buf.view().data, c.dtype, poisoned * c.heads * row_width + i, NAN);
    }
    const Expected e = reference_prefill(in);
    const std::vector<int64_t> cu_q = offsets_of(c.sq);
    for (const auto& [backend, o] : {std::pair{"cuda", run_cuda(in)}, {"cpu", run_cpu(in)}}) {
      for (size_t b : {size_t{0}, size_t{2}}) {
        const int64_t q0 = cu_q[b], sq = c.sq[b];
        const std::vector<double> want(e.out.begin() + q0 * c.heads * kDv,
                                       e.out.begin() + (q0 + sq) * c.heads * kDv);
        EXPECT_TRUE(test::all_close(o.out().narrow(0, q0, sq), want, case_tolerance(c)))
            << backend << ", request " << b;
        for (int64_t h = 0; h < c.heads; ++h) {
          const std::vector<double> want_lse(e.lse.begin() + h * in.tokens + q0,
                                             e.lse.begin() + h * in.tokens + q0 + sq);
          EXPECT_TRUE(test::all_close(o.lse.view().narrow(0, h, 1).narrow(1, q0, sq), want_lse,
                                      kLseTolerance))
              << backend << ", request " << b << " head " << h;
        }
      }
    }
  }
}

TEST(CudaPrefill, SixteenAndOneHundredTwentyEightHeads) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(62);
  for (bool causal : {true, false}) {
    Case c16;
    c16.heads = 16;
    c16.heads_per_block = 2;
    c16.causal = causal;
    c16.sq = {70, 3};
    c16.sk = {130, 3};
    SCOPED_TRACE(describe(c16));
    check_case(rng, c16);
    Case c128;
    c128.heads = 128;
    c128.heads_per_block = 4;
    c128.dtype = c128.out_dtype = DType::kF16;
    c128.causal = causal;
    c128.sq = {40, 20};
    c128.sk = {70, 20};
    SCOPED_TRACE(describe(c128));
    check_case(rng, c128);
  }
}

// ---- long requests (issue 10's lengths) against sampled reference rows --------------------------

// One query row of the reference: request b's query i (token t), keys from k0, every head.
struct SampledRow {
  int64_t t, b, i;
  std::vector<double> out, lse;  // [N, V], [N]
};

// The fp64 attention of each sampled row over the keys it sees (bottom-right causal: [0, sk - sq +
// i]), reading the 16-bit inputs where they lie; rows spread over the host's threads.
void reference_rows(const Inputs& in, const std::vector<int64_t>& k0,
                    std::vector<SampledRow>& rows) {
  const int64_t n = in.c.heads;
  auto at = [](const TensorView& v, int64_t i0, int64_t i1, int64_t i2) {
    return static_cast<double>(
        load_float(v.data, v.dtype, i0 * v.strides[0] + i1 * v.strides[1] + i2 * v.strides[2]));
  };
  auto compute = [&](SampledRow& r) {
    const int64_t sq = in.c.sq[r.b], sk = in.c.sk[r.b];
    const int64_t seen = in.c.causal ? std::clamp<int64_t>(sk - sq + r.i + 1, 0, sk) : sk;
    r.out.assign(n * kDv, 0.0);
    r.lse.assign(n, -kInf);
    std::vector<double> score(seen);
    for (int64_t h = 0; h < n; ++h) {
      double q[kDqk];
      for (int64_t d = 0; d < kDqk; ++d) q[d] = at(in.q, r.t, h, d);
      double m = -kInf;
      for (int64_t j = 0; j < seen; ++j) {
        const int64_t key = k0[r.b] + j;
        double dot = 0.0;
        for (int64_t d = 0; d < kNope; ++d) dot += q[d] * at(in.k_nope, key, h, d);
        for (int64_t d = 0; d < kRope; ++d) {
          dot += q[kNope + d] *
                 static_cast<double>(load_float(in.k_pe.data, in.k_pe.dtype,
                                                key * in.k_pe.strides[0] + d * in.k_pe.strides[1]));
        }
        score[j] = dot * in.scale;
        m = std::max(m, score[j]);
      }
      if (seen == 0) continue;  // out 0, lse -inf
      double sum = 0.0;
      for (int64_t j = 0; j < seen; ++j) sum += (score[j] = std::exp(score[j] - m));
      for (int64_t j = 0; j < seen; ++j) {
        const double p = score[j] / sum;
        for (int64_t d = 0; d < kDv; ++d) r.out[h * kDv + d] += p * at(in.v, k0[r.b] + j, h, d);
      }
      r.lse[h] = m + std::log(sum);
    }
  };
  const int64_t workers = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      for (size_t k = w; k < rows.size(); k += workers) compute(rows[k]);
    });
  }
  for (std::thread& thread : pool) thread.join();
}

// The CUDA op on a batch with requests too long for a full fp64 reference: every row of requests
// of at most `full_rows` queries and `sampled` random rows (plus the first and the last) of each
// longer one are checked against the reference, out and LSE, all heads; every row of every request
// must be written (no NaN) and the out padding must stay NaN.
void check_sampled_case(std::mt19937_64& rng, const Case& c, int64_t full_rows, int64_t sampled) {
  const Inputs in = make_inputs(rng, c);
  const Outputs gpu = run_cuda(in);
  std::vector<int64_t> q0{0}, k0{0};
  for (size_t b = 0; b < c.sq.size(); ++b) {
    q0.push_back(q0.back() + c.sq[b]);
    k0.push_back(k0.back() + c.sk[b]);
  }
  std::vector<SampledRow> rows;
  for (size_t b = 0; b < c.sq.size(); ++b) {
    const int64_t sq = c.sq[b];
    auto add = [&](int64_t i) { rows.push_back({q0[b] + i, static_cast<int64_t>(b), i, {}, {}}); };
    if (sq <= full_rows) {
      for (int64_t i = 0; i < sq; ++i) add(i);
      continue;
    }
    add(0);
    add(sq - 1);
    std::uniform_int_distribution<int64_t> pick(1, sq - 2);
    for (int64_t k = 0; k < sampled; ++k) add(pick(rng));
  }
  reference_rows(in, k0, rows);
  const test::Tolerance tol = case_tolerance(c);
  for (const SampledRow& r : rows) {
    SCOPED_TRACE(testing::Message()
                 << "request " << r.b << " query " << r.i << " (token " << r.t << ")");
    EXPECT_TRUE(test::all_close(gpu.out().narrow(0, r.t, 1), r.out, tol)) << "out";
    EXPECT_TRUE(test::all_close(gpu.lse.view().narrow(1, r.t, 1), r.lse, kLseTolerance)) << "lse";
  }
  const TensorView out = gpu.out_buf.view();  // [T, N, 192], contiguous
  int64_t unwritten = 0, padding_written = 0;
  for (int64_t t = 0; t < q0.back(); ++t) {
    for (int64_t h = 0; h < c.heads; ++h) {
      for (int64_t d = 0; d < kOutHeadStride; ++d) {
        const bool is_nan =
            std::isnan(load_float(out.data, out.dtype, (t * c.heads + h) * kOutHeadStride + d));
        if (d < kDv) unwritten += is_nan;
        if (d >= kDv) padding_written += !is_nan;
      }
    }
  }
  EXPECT_EQ(unwritten, 0) << "out values left NaN in rows of a request";
  EXPECT_EQ(padding_written, 0) << "out written past its head size";
}

TEST(CudaPrefill, LongVarlenRequestsAgainstSampledReferenceRows) {
  // Issue 10's lengths in one varlen batch, 16 and 128 heads, causal and not, keys != queries
  // (a context before the new tokens, and fewer keys than queries in one request); the
  // 16384-token request has no full fp64 reference on the host (~10^13 multiply-adds at 128
  // heads), so its rows and the other long ones are sampled.
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(67);
  for (int64_t heads : {16, 128}) {
    for (bool causal : {true, false}) {
      Case c;
      c.heads = heads;
      c.causal = causal;
      c.hashed_inputs = true;
      c.sq = {1, 63, 64, 65, 1000, 4096, 16384};
      c.sk = {1, 100, 64, 30, 1500, 4096, 16447};
      SCOPED_TRACE(describe(c));
      check_sampled_case(rng, c, 65, 6);
    }
  }
}

TEST(CudaPrefill, SingleHead) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(63);
  Case c;
  c.heads = 1;
  c.sq = {200};
  c.sk = {300};
  check_case(rng, c);
  Case all_heads = c;  // heads_per_block past the heads: one block takes all three
  all_heads.heads = 3;
  all_heads.heads_per_block = std::numeric_limits<int>::max();
  SCOPED_TRACE(describe(all_heads));
  check_case(rng, all_heads);
}

TEST(CudaPrefill, FewerKeysThanQueriesLeavesEarlyQueriesEmpty) {
  // Bottom-right causal: query i sees keys [0, sk - sq + i]; the first sq - sk see none (out 0,
  // lse -inf), including whole 64-row tiles.
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(64);
  Case c;
  c.sq = {200, 10};
  c.sk = {50, 1};
  check_case(rng, c);
}

TEST(CudaPrefill, EmptyRequestsAndRowsPastTheLastRequest) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(65);
  for (bool causal : {true, false}) {
    Case c;
    c.causal = causal;
    c.heads = 3;  // the rows past the last request are written for every head of a block's heads
    c.heads_per_block = 2;
    c.sq = {0, 5, 70, 0, 3};
    c.sk = {4, 0, 70, 0, 20};
    c.extra_tokens = 130;  // more than max_seqlen_q: the tail block strides over them
    c.extra_keys = 2;
    SCOPED_TRACE(describe(c));
    check_case(rng, c);
  }
  Case none;  // no request at all: every row is a tail row
  none.extra_tokens = 9;
  check_case(rng, none);
}

TEST(CudaPrefill, F32OutputFromBf16Inputs) {
  // The orchestrator keeps partial outputs in f32 for the merge.
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(66);
  for (bool causal : {true, false}) {
    Case c;
    c.out_dtype = DType::kF32;
    c.causal = causal;
    c.sq = {90, 33};
    c.sk = {150, 33};
    SCOPED_TRACE(describe(c));
    check_case(rng, c);
  }
  Case f16_to_bf16;
  f16_to_bf16.dtype = DType::kF16;
  f16_to_bf16.out_dtype = DType::kBF16;
  f16_to_bf16.sq = {65};
  f16_to_bf16.sk = {65};
  check_case(rng, f16_to_bf16);
}

TEST(CudaPrefill, LseMayBeOmitted) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(67);
  Case c;
  c.with_lse = false;
  c.sq = {17, 100};
  c.sk = {17, 160};
  check_case(rng, c);
}

TEST(CudaPrefill, UnalignedRowsTakeTheScalarLoadPath) {
  // q rows of 192 + 3 elements: not 16-byte aligned, so no cp.async of 16 bytes.
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(68);
  for (bool causal : {true, false}) {
    Case c;
    c.q_pad = 3;
    c.causal = causal;
    c.sq = {70, 9};
    c.sk = {100, 9};
    SCOPED_TRACE(describe(c));
    check_case(rng, c);
  }
}

TEST(CudaPrefill, OddOutHeadStrideTakesTheElementStorePath) {
  // out's head stride 193: no column pair of an odd head is aligned for one 4- or 8-byte store.
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(69);
  for (DType out_dtype : {DType::kBF16, DType::kF32}) {
    Case c;
    c.heads = 3;
    c.out_dtype = out_dtype;
    c.out_head_stride = kOutHeadStride + 1;
    c.sq = {70, 9};
    c.sk = {100, 9};
    SCOPED_TRACE(describe(c));
    check_case(rng, c);
  }
}

// ---- Errors ----------------------------------------------------------------------------------

struct DeviceInputs {
  Tensor q, k_nope, k_pe, v, out, lse, cu_q, cu_k;
};
DeviceInputs device_inputs(DType dtype, int64_t nope, int64_t rope, int64_t dv,
                           const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k) {
  const int64_t tokens = 8, keys = 10, heads = 2;
  const auto dev = [](std::initializer_list<int64_t> shape, DType t) {
    return Tensor::empty(shape, t, Device::cuda(0));
  };
  return {
      dev({tokens, heads, nope + rope}, dtype),
      dev({keys, heads, nope}, dtype),
      dev({keys, rope}, dtype),
      dev({keys, heads, dv}, dtype),
      dev({tokens, heads, dv}, dtype),
      dev({heads, tokens}, DType::kF32),
      test::to_device(test::int_tensor(cu_q, {static_cast<int64_t>(cu_q.size())}, DType::kI32)),
      test::to_device(test::int_tensor(cu_k, {static_cast<int64_t>(cu_k.size())}, DType::kI32))};
}

void prefill(const DeviceInputs& d, int64_t max_q, int64_t max_k) {
  ops::mla_prefill(d.q, d.k_nope, d.k_pe, d.v, d.cu_q, d.cu_k, max_q, max_k, 0.1f, true, d.out,
                   d.lse.view());
}

TEST(CudaPrefill, RejectsBadArgumentsWithTheCpuMessages) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const DeviceInputs d = device_inputs(DType::kBF16, kNope, kRope, kDv, {0, 5, 8}, {0, 6, 10});
  Tensor q2 = Tensor::empty({8, 2 * kDqk}, DType::kBF16, Device::cuda(0));
  MLAKIT_EXPECT_THROW_MSG(ops::mla_prefill(q2, d.k_nope, d.k_pe, d.v, d.cu_q, d.cu_k, 5, 6, 0.1f,
                                           true, d.out, d.lse.view()),
                          "mla_prefill: q must have 3 dimensions, got 2");
  Tensor v_heads = Tensor::empty({10, 3, kDv}, DType::kBF16, Device::cuda(0));
  MLAKIT_EXPECT_THROW_MSG(ops::mla_prefill(d.q, d.k_nope, d.k_pe, v_heads, d.cu_q, d.cu_k, 5, 6,
                                           0.1f, true, d.out, d.lse.view()),
                          "mla_prefill: v.shape[1] must equal q.shape[1] (heads N) = 2, got 3");
  MLAKIT_EXPECT_THROW_MSG(ops::mla_prefill(d.q, d.k_nope, d.k_pe, d.v, d.cu_q, d.cu_k, 5, 6, 0.0f,
                                           true, d.out, d.lse.view()),
                          "mla_prefill: scale must be finite and > 0, got 0");
  Tensor cu_host = test::int_tensor({0, 5, 8}, {3}, DType::kI32);
  MLAKIT_EXPECT_THROW_MSG(ops::mla_prefill(d.q, d.k_nope, d.k_pe, d.v, cu_host, d.cu_k, 5, 6, 0.1f,
                                           true, d.out, d.lse.view()),
                          "mla_prefill: cu_seqlens_q is on cpu but q is on cuda:0");
  MLAKIT_EXPECT_THROW_MSG(prefill(d, -1, 6),
                          "mla_prefill: max_seqlen_q and max_seqlen_k must be >= 0, got -1 and 6");
  MLAKIT_EXPECT_THROW_MSG(cuda::mla_prefill(d.q, d.k_nope, d.k_pe, d.v, d.cu_q, d.cu_k, 5, 6, 0.1f,
                                            true, d.out, d.lse.view(), Stream{}, -1),
                          "mla_prefill: heads_per_block must be >= 0 (0: the launcher's choice), "
                          "got -1");
}

TEST(CudaPrefill, RejectsWhatOnlyTheCpuKernelTakes) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const DeviceInputs f32 = device_inputs(DType::kF32, kNope, kRope, kDv, {0, 5, 8}, {0, 6, 10});
  MLAKIT_EXPECT_THROW_MSG(prefill(f32, 5, 6),
                          "mla_prefill: the CUDA kernel takes f16 or bf16 q, k_nope, k_pe and v "
                          "(tensor-core MMA), got f32");
  const DeviceInputs small = device_inputs(DType::kBF16, 24, 8, 20, {0, 5, 8}, {0, 6, 10});
  MLAKIT_EXPECT_THROW_MSG(prefill(small, 5, 6),
                          "mla_prefill: the CUDA kernel takes k_nope.shape[2] = 128, "
                          "k_pe.shape[1] = 64 and v.shape[2] = 128 (MLA head sizes), got 24, 8 "
                          "and 20");
}

TEST(CudaPrefill, BadSeqlensOnTheDeviceAreReportedNotFollowed) {
  // Values the CPU backend rejects on the host: on the GPU the kernel skips the request and sets
  // the device error word; nothing is read or written out of bounds.
  MLAKIT_SKIP_WITHOUT_GPU();
  const std::vector<std::vector<int64_t>> bad_q = {
      {1, 5, 8},   // does not start at 0
      {0, 6, 4},   // decreasing
      {0, 5, 9},   // past q.shape[0]
      {0, 5, 8}};  // fine, but max_seqlen_q below (4) is too small
  for (size_t i = 0; i < bad_q.size(); ++i) {
    SCOPED_TRACE(i);
    const DeviceInputs d = device_inputs(DType::kBF16, kNope, kRope, kDv, bad_q[i], {0, 6, 10});
    prefill(d, i == 3 ? 4 : 5, 6);
    MLAKIT_EXPECT_THROW_MSG(ops::check_device_errors(Device::cuda(0)),
                            "mla_prefill: cu_seqlens_q / cu_seqlens_k were not non-decreasing");
  }
  const DeviceInputs past_k = device_inputs(DType::kBF16, kNope, kRope, kDv, {0, 5, 8}, {0, 6, 11});
  prefill(past_k, 5, 6);
  MLAKIT_EXPECT_THROW_MSG(ops::check_device_errors(Device::cuda(0)),
                          "(that request's rows were not written)");
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0))) << "the word was not cleared";
}

}  // namespace
}  // namespace mlakit
