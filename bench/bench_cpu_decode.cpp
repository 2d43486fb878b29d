// CPU absorbed-MQA decode (ops::mla_decode) against this machine's ceilings, measured in the same
// process: streaming-read and copy bandwidth over 1 GiB, and an f32 GEMM (OpenBLAS) for FLOP/s.
// Floor = max(bytes / read bandwidth, FLOPs / GEMM rate) as in PERF.md; bytes = KV + q + out,
// FLOPs = 2 * s_q * N * sum(s_kv) * (576 + 512). Each case rotates over enough cache copies that
// the bytes read per rotation exceed the last-level cache; medians of the timed runs.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "mlakit/dtype.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/plan.hpp"

namespace {

using mlakit::DType;
using mlakit::KvCacheDType;
using mlakit::Tensor;
using Clock = std::chrono::steady_clock;

constexpr int kReps = 7;                              // timed runs per measurement (median)
constexpr int64_t kStreamBytes = int64_t{1} << 30;    // 1 GiB: > 4x a 260 MiB LLC
constexpr int64_t kRotateBytes = int64_t{600} << 20;  // cache copies per case exceed the LLC

template <class Fn>
double median_seconds(int reps, const Fn& fn) {
  std::vector<double> t;
  fn();  // warm-up: page faults, thread start, scratch growth
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Ceilings {
  double read_gbs, copy_gbs, gemm_gflops;
};

Ceilings measure_ceilings() {
  const int64_t n = kStreamBytes / sizeof(float);
  std::vector<float> a(n), b(n);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) a[i] = static_cast<float>(i & 7);
  volatile float sink = 0;
  // Four independent 16-lane sums per thread: enough loads in flight to saturate the memory, and
  // no dependency on one accumulator.
  using Vec = float __attribute__((vector_size(64)));
  constexpr int64_t kChunk = 64;  // floats per iteration: 4 vectors of 16
  const double read_s = median_seconds(kReps, [&] {
    float total = 0;
#pragma omp parallel reduction(+ : total)
    {
      Vec s0 = {}, s1 = {}, s2 = {}, s3 = {};
#pragma omp for
      for (int64_t i = 0; i < n; i += kChunk) {
        Vec v[4];
        std::memcpy(v, &a[i], sizeof(v));
        s0 += v[0], s1 += v[1], s2 += v[2], s3 += v[3];
      }
      const Vec s = (s0 + s1) + (s2 + s3);
      for (int l = 0; l < 16; ++l) total += s[l];
    }
    sink = total;
  });
  const double copy_s = median_seconds(kReps, [&] {
#pragma omp parallel for simd
    for (int64_t i = 0; i < n; ++i) b[i] = a[i];
  });
  (void)sink;
  // 1536^3 f32 GEMM: large enough for OpenBLAS's peak kernels, ~7 GFLOP.
  const int g = 1536;
  std::vector<float> x(int64_t{g} * g, 1.0f), y(int64_t{g} * g, 0.5f), z(int64_t{g} * g);
  const double gemm_s = median_seconds(3, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g, g, g, 1.0f, x.data(), g, y.data(), g,
                0.0f, z.data(), g);
  });
  return {kStreamBytes / read_s / 1e9, 2.0 * kStreamBytes / copy_s / 1e9,
          2.0 * g * g * double(g) / gemm_s / 1e9};
}

struct DecodeCase {
  const char* name;
  int64_t batch, s_kv, heads, s_q;
  KvCacheDType kv_dtype;
  DType q_dtype;
};

// Pseudo-random values of magnitude < 2 (a 32-bit LCG per element index: fast on 600 MB).
void fill_random(const Tensor& t, DType dtype) {
  const int64_t n = t.numel();
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t h = static_cast<uint32_t>(i) * 2654435761u + 12345u;  // Knuth's multiplier
    mlakit::store_float(t.view().data, dtype, i, static_cast<float>(h >> 8) / 8388608.0f - 1.0f);
  }
}

void run_case(const DecodeCase& c, const Ceilings& ceil) {
  constexpr int64_t kBlockSize = 64;  // vLLM's usual page size for MLA
  constexpr int64_t kRank = 512, kDim = 576;
  mlakit::KvCacheSpec spec;
  spec.kv_dtype = c.kv_dtype;
  spec.act_dtype = DType::kBF16;
  spec.block_size = kBlockSize;
  const int64_t blocks_per_req = c.s_kv / kBlockSize;
  const int64_t bytes_kv = c.batch * c.s_kv * spec.entry_bytes();
  const int64_t copies = std::max<int64_t>(1, (kRotateBytes + bytes_kv - 1) / bytes_kv);
  spec.num_blocks = copies * c.batch * blocks_per_req;
  const auto shape = spec.cache_shape();
  const Tensor cache = Tensor::empty({shape[0], shape[1], shape[2]}, spec.storage_dtype());
  if (c.kv_dtype == KvCacheDType::kAuto) {
    fill_random(cache, DType::kBF16);
  } else {
    fill_random(cache, DType::kFp8E4m3);          // ds_mla: scales and rope are set below
    if (c.kv_dtype == KvCacheDType::kFp8DsMla) {  // give it sane scales and bf16 rope
      uint8_t* base = static_cast<uint8_t*>(cache.view().data);
      for (int64_t e = 0; e < shape[0] * shape[1]; ++e) {
        uint8_t* entry = base + e * mlakit::kDsMlaEntryBytes;
        const float s = 0.01f;
        for (int t = 0; t < 4; ++t) std::memcpy(entry + mlakit::kDsMlaScaleOffset + 4 * t, &s, 4);
        for (int i = 0; i < 64; ++i) {
          const uint16_t h = mlakit::float_to_bf16_bits(0.5f);
          std::memcpy(entry + mlakit::kDsMlaRopeOffset + 2 * i, &h, 2);
        }
      }
    }
  }
  // Shuffled block ids, one table per copy.
  std::vector<int32_t> ids(spec.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  std::vector<Tensor> tables;
  for (int64_t k = 0; k < copies; ++k) {
    Tensor t = Tensor::empty({c.batch, blocks_per_req}, DType::kI32);
    std::copy_n(ids.begin() + k * c.batch * blocks_per_req, c.batch * blocks_per_req,
                t.data<int32_t>());
    tables.push_back(t);
  }
  const Tensor seq_lens = Tensor::empty({c.batch}, DType::kI32);
  std::fill_n(seq_lens.data<int32_t>(), c.batch, static_cast<int32_t>(c.s_kv));
  const Tensor q = Tensor::empty({c.batch, c.s_q, c.heads, kDim}, c.q_dtype);
  fill_random(q, c.q_dtype);
  const Tensor out = Tensor::empty({c.batch, c.s_q, c.heads, kRank}, DType::kBF16);
  const Tensor lse = Tensor::empty({c.batch, c.s_q, c.heads}, DType::kF32);
  const std::vector<int32_t> lens(c.batch, static_cast<int32_t>(c.s_kv));
  const mlakit::DecodeSchedule schedule =
      mlakit::plan_decode_splits(lens, kBlockSize, omp_get_max_threads());
  const Tensor ws = Tensor::empty({std::max<int64_t>(1, mlakit::ops::mla_decode_workspace_elems(
                                                            schedule, c.s_q, c.heads, kRank))},
                                  DType::kF32);
  const mlakit::ops::DecodeParams params{0.1352338f, c.kv_dtype, 1.0f, 1.0f};

  int64_t next = 0;
  const double s = median_seconds(kReps, [&] {  // each run reads the next copy
    mlakit::ops::mla_decode(q, cache, tables[next++ % copies], seq_lens, out, lse, params, schedule,
                            ws);
  });
  const double bytes = double(bytes_kv) + double(q.numel()) * mlakit::dtype_size(c.q_dtype) +
                       double(out.numel()) * 2;
  const double flops = 2.0 * c.s_q * c.heads * double(c.batch * c.s_kv) * (kDim + kRank);
  const double gbs = bytes / s / 1e9, gflops = flops / s / 1e9;
  const double floor_s = std::max(bytes / (ceil.read_gbs * 1e9), flops / (ceil.gemm_gflops * 1e9));
  std::printf("%-34s %6lld %9.0f %8.1f %6.0f %%  %8.1f %6.0f %%  %6.0f %%  %lld\n", c.name,
              static_cast<long long>(schedule.total_splits), s * 1e6, gbs,
              100.0 * gbs / ceil.read_gbs, gflops, 100.0 * gflops / ceil.gemm_gflops,
              100.0 * floor_s / s, static_cast<long long>(copies));
}

}  // namespace

int main() {
  std::printf("mlakit CPU decode benchmark, %d OpenMP threads\n", omp_get_max_threads());
  const Ceilings ceil = measure_ceilings();
  std::printf(
      "ceilings: streaming read %.1f GB/s, copy (read+write) %.1f GB/s, sgemm %.1f GFLOP/s\n\n",
      ceil.read_gbs, ceil.copy_gbs, ceil.gemm_gflops);
  std::printf("%-34s %6s %9s %8s %8s  %8s %8s  %8s  %s\n", "case (N, s_q, page 64)", "splits", "us",
              "GB/s", "%read", "GFLOP/s", "%gemm", "%floor", "copies");
  const DecodeCase cases[] = {
      {"B=32 s_kv=4096 N=16 bf16 cache", 32, 4096, 16, 1, KvCacheDType::kAuto, DType::kBF16},
      {"B=32 s_kv=4096 N=16 fp8 cache+q", 32, 4096, 16, 1, KvCacheDType::kFp8E4m3, DType::kFp8E4m3},
      {"B=32 s_kv=4096 N=16 fp8_ds_mla", 32, 4096, 16, 1, KvCacheDType::kFp8DsMla, DType::kBF16},
      {"B=1 s_kv=32768 N=16 bf16 cache", 1, 32768, 16, 1, KvCacheDType::kAuto, DType::kBF16},
      {"B=32 s_kv=4096 N=16 s_q=2 bf16", 32, 4096, 16, 2, KvCacheDType::kAuto, DType::kBF16},
  };
  for (const DecodeCase& c : cases) run_case(c, ceil);
  return 0;
}
