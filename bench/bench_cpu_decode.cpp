// CPU absorbed-MQA decode (ops::mla_decode) against this machine's ceilings, measured in the same
// process: streaming-read and copy bandwidth over 1 GiB, the f32 FMA peak (register-only loop) and,
// for reference, an OpenBLAS sgemm. Floor = max(bytes / read bandwidth, FLOPs / FMA peak) as in
// PERF.md (the kernel computes in f32 FMAs, so their peak is its compute ceiling); bytes = KV + q +
// out, FLOPs = 2 * s_q * N * sum(s_kv) * (576 + 512). Each case rotates over enough cache copies
// that the bytes read per rotation exceed the last-level cache; medians of the timed runs.
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
  double read_gbs, copy_gbs, fma_gflops, sgemm_gflops;
};

using Vec = float __attribute__((vector_size(64)));  // 16 floats, one AVX-512 register

// f32 FMA peak: per thread 16 independent vector multiply-add chains (enough to cover the FMA
// latency on two ports) on registers only. Benchmarks are compiled without -march=native, so the
// loop is compiled per instruction set (target attributes) and picked at run time.
using Vec8 = float __attribute__((vector_size(32)));  // one AVX2 register
constexpr int kChains = 16;                           // independent accumulators in fma_chains

// Named accumulators: GCC keeps a 16-vector array in memory, which would measure store forwarding.
template <class V>
[[gnu::always_inline]] inline float fma_chains(int64_t iters) {
  V a0 = V{} + 0.f, a1 = V{} + 1.f, a2 = V{} + 2.f, a3 = V{} + 3.f, a4 = V{} + 4.f, a5 = V{} + 5.f;
  V a6 = V{} + 6.f, a7 = V{} + 7.f, a8 = V{} + 8.f, a9 = V{} + 9.f, a10 = V{} + 10.f;
  V a11 = V{} + 11.f, a12 = V{} + 12.f, a13 = V{} + 13.f, a14 = V{} + 14.f, a15 = V{} + 15.f;
  const V m = V{} + 0.999999f, c = V{} + 1e-6f;
  for (int64_t i = 0; i < iters; ++i) {
    a0 = a0 * m + c, a1 = a1 * m + c, a2 = a2 * m + c, a3 = a3 * m + c;
    a4 = a4 * m + c, a5 = a5 * m + c, a6 = a6 * m + c, a7 = a7 * m + c;
    a8 = a8 * m + c, a9 = a9 * m + c, a10 = a10 * m + c, a11 = a11 * m + c;
    a12 = a12 * m + c, a13 = a13 * m + c, a14 = a14 * m + c, a15 = a15 * m + c;
    __asm__ volatile("" : "+v"(a0));  // keep the loop from being folded
  }
  const V sum = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)) + ((a8 + a9) + (a10 + a11)) +
                ((a12 + a13) + (a14 + a15));
  return sum[0];
}
__attribute__((target("avx512f"))) float fma_chains_avx512(int64_t iters) {
  return fma_chains<Vec>(iters);
}
__attribute__((target("avx2,fma"))) float fma_chains_avx2(int64_t iters) {
  return fma_chains<Vec8>(iters);
}

double fma_peak_gflops() {
  constexpr int64_t kIters = 20'000'000;  // ~0.2 s per run at 2 cores
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const int lanes = avx512 ? 16 : 8;
  const double s = median_seconds(3, [&] {
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    sink += avx512 ? fma_chains_avx512(kIters) : fma_chains_avx2(kIters);
    volatile float keep = sink;
    (void)keep;
  });
  return 2.0 * lanes * kChains * double(kIters) * omp_get_max_threads() / s / 1e9;
}

// Streaming read of n floats (n a multiple of 4 vectors) with four independent vector sums: enough
// loads in flight to saturate the memory, no single accumulator dependency.
template <class V>
[[gnu::always_inline]] inline float read_sum(const float* p, int64_t n) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  V s0 = {}, s1 = {}, s2 = {}, s3 = {}, v0, v1, v2, v3;
  for (int64_t i = 0; i < n; i += 4 * kLanes) {
    std::memcpy(&v0, p + i, sizeof(V));
    std::memcpy(&v1, p + i + kLanes, sizeof(V));
    std::memcpy(&v2, p + i + 2 * kLanes, sizeof(V));
    std::memcpy(&v3, p + i + 3 * kLanes, sizeof(V));
    s0 += v0, s1 += v1, s2 += v2, s3 += v3;
  }
  return ((s0 + s1) + (s2 + s3))[0];
}
__attribute__((target("avx512f"))) float read_sum_avx512(const float* p, int64_t n) {
  return read_sum<Vec>(p, n);
}
__attribute__((target("avx2,fma"))) float read_sum_avx2(const float* p, int64_t n) {
  return read_sum<Vec8>(p, n);
}

Ceilings measure_ceilings() {
  const int64_t n = kStreamBytes / sizeof(float);
  std::vector<float> a(n), b(n);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) a[i] = static_cast<float>(i & 7);
  volatile float sink = 0;
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const double read_s = median_seconds(kReps, [&] {
    float total = 0;
#pragma omp parallel reduction(+ : total)
    {
      const int64_t per = n / omp_get_num_threads() / 64 * 64;  // whole 4-vector steps
      const float* p = a.data() + per * omp_get_thread_num();
      total += avx512 ? read_sum_avx512(p, per) : read_sum_avx2(p, per);
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
  return {kStreamBytes / read_s / 1e9, 2.0 * kStreamBytes / copy_s / 1e9, fma_peak_gflops(),
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
  const mlakit::ops::DecodeParams params{0.1352338f, c.kv_dtype, 1.0f, 1.0f, kRank};

  int64_t next = 0;
  const double s = median_seconds(kReps, [&] {  // each run reads the next copy
    mlakit::ops::mla_decode(q, cache, tables[next++ % copies], seq_lens, out, lse, params, schedule,
                            ws);
  });
  const double bytes = double(bytes_kv) + double(q.numel()) * mlakit::dtype_size(c.q_dtype) +
                       double(out.numel()) * 2;
  const double flops = 2.0 * c.s_q * c.heads * double(c.batch * c.s_kv) * (kDim + kRank);
  const double gbs = bytes / s / 1e9, gflops = flops / s / 1e9;
  const double floor_s = std::max(bytes / (ceil.read_gbs * 1e9), flops / (ceil.fma_gflops * 1e9));
  std::printf("%-34s %6lld %9.0f %8.1f %6.0f %%  %8.1f %6.0f %%  %6.0f %%  %lld\n", c.name,
              static_cast<long long>(schedule.total_splits), s * 1e6, gbs,
              100.0 * gbs / ceil.read_gbs, gflops, 100.0 * gflops / ceil.fma_gflops,
              100.0 * floor_s / s, static_cast<long long>(copies));
}

}  // namespace

int main() {
  std::printf("mlakit CPU decode benchmark, %d OpenMP threads\n", omp_get_max_threads());
  const Ceilings ceil = measure_ceilings();
  std::printf(
      "ceilings: streaming read %.1f GB/s, copy (read+write) %.1f GB/s, f32 FMA peak %.1f GFLOP/s, "
      "OpenBLAS sgemm %.1f GFLOP/s\n\n",
      ceil.read_gbs, ceil.copy_gbs, ceil.fma_gflops, ceil.sgemm_gflops);
  std::printf("%-34s %6s %9s %8s %8s  %8s %8s  %8s  %s\n", "case (N, s_q, page 64)", "splits", "us",
              "GB/s", "%read", "GFLOP/s", "%fma", "%floor", "copies");
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
