// CPU prefill throughput against the machine's sgemm rate, measured in the same process.
//
// Ceiling: a 2048^3 cblas_sgemm (all BLAS threads). Kernel: ops::mla_prefill on one request of
// 4096 tokens, 16 heads, P 128, R 64, V 128 (DeepSeek-V2-Lite shapes), causal, k_nope and v as
// strided views of one [S, N, 256] kv_b_proj output. Useful FLOPs of causal attention:
// 2 * N * L(L+1)/2 * (P + R + V) (the masked half is not counted). Medians of interleaved runs.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cpu/parallel.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/types.hpp"

namespace {

using mlakit::DType;
using mlakit::Tensor;
using mlakit::TensorView;

// Rounds of measurement. Each round times the sgemm ceiling and every prefill config back to
// back, so a change in machine load (2 shared cores) hits both sides of each ratio; medians of
// 3 rounds drop one outlier.
constexpr int kRounds = 3;

double seconds_of(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void fill_random(const TensorView& t, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) mlakit::store_float(t.data, t.dtype, i, dist(rng));
}

// c = a b with 2048 x 2048 f32 matrices: large enough for BLAS to reach its steady rate.
struct SgemmCeiling {
  static constexpr int kDim = 2048;
  std::vector<float> a = std::vector<float>(kDim * kDim, 1.0f);
  std::vector<float> b = std::vector<float>(kDim * kDim, 0.5f);
  std::vector<float> c = std::vector<float>(kDim * kDim);

  void run() {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kDim, kDim, kDim, 1.0f, a.data(), kDim,
                b.data(), kDim, 0.0f, c.data(), kDim);
  }
  static double flops() { return 2.0 * kDim * kDim * static_cast<double>(kDim); }
};

struct PrefillConfig {
  int64_t tokens, heads, nope, rope, dv;
  bool causal;
  DType dtype;
};

// One request of `tokens` queries over the same tokens; k_nope and v are views of one
// [S, N, P + V] tensor, as kv_b_proj produces them.
class PrefillCase {
 public:
  PrefillCase(const PrefillConfig& c, std::mt19937_64& rng)
      : c_(c),
        q_(Tensor::empty({c.tokens, c.heads, c.nope + c.rope}, c.dtype)),
        kv_(Tensor::empty({c.tokens, c.heads, c.nope + c.dv}, c.dtype)),
        k_pe_(Tensor::empty({c.tokens, c.rope}, c.dtype)),
        out_(Tensor::empty({c.tokens, c.heads, c.dv}, c.dtype)),
        lse_(Tensor::empty({c.heads, c.tokens}, DType::kF32)),
        cu_(Tensor::empty({2}, DType::kI32)) {
    cu_.data<int32_t>()[0] = 0;
    cu_.data<int32_t>()[1] = static_cast<int32_t>(c.tokens);
    fill_random(q_, rng);
    fill_random(kv_, rng);
    fill_random(k_pe_, rng);
  }

  void run() const {
    const TensorView k_nope = kv_.view().narrow(2, 0, c_.nope);  // [S, N, P]
    const TensorView v = kv_.view().narrow(2, c_.nope, c_.dv);   // [S, N, V]
    const float scale = 1.0f / std::sqrt(static_cast<float>(c_.nope + c_.rope));
    mlakit::ops::mla_prefill(q_, k_nope, k_pe_, v, cu_, cu_, c_.tokens, c_.tokens, scale, c_.causal,
                             out_, lse_.view());
  }

  // Useful FLOPs: QK^T and PV over the visible (query, key) pairs.
  double flops() const {
    const double pairs =
        c_.causal ? c_.tokens * (c_.tokens + 1) / 2.0 : static_cast<double>(c_.tokens) * c_.tokens;
    return 2.0 * c_.heads * pairs * static_cast<double>(c_.nope + c_.rope + c_.dv);
  }

  std::string describe() const {
    char text[160];
    std::snprintf(text, sizeof(text), "tokens=%lld heads=%lld d_qk=%lld d_v=%lld causal=%d %s",
                  static_cast<long long>(c_.tokens), static_cast<long long>(c_.heads),
                  static_cast<long long>(c_.nope + c_.rope), static_cast<long long>(c_.dv),
                  c_.causal ? 1 : 0, mlakit::dtype_name(c_.dtype));
    return text;
  }

 private:
  PrefillConfig c_;
  Tensor q_, kv_, k_pe_, out_, lse_, cu_;
};

}  // namespace

int main() {
  std::printf("threads: %d OpenMP, %d OpenBLAS; OpenBLAS kernels: %s\n", mlakit::cpu::num_threads(),
              openblas_get_num_threads(), openblas_get_corename());
  std::mt19937_64 rng(20240611);  // fixed inputs: runs are comparable
  SgemmCeiling sgemm;
  std::vector<PrefillCase> cases;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    cases.emplace_back(PrefillConfig{4096, 16, 128, 64, 128, true, dtype}, rng);
  }

  sgemm.run();  // warm-up: page faults, thread pools
  for (const PrefillCase& c : cases) c.run();
  std::vector<double> sgemm_times;
  std::vector<std::vector<double>> case_times(cases.size());
  for (int round = 0; round < kRounds; ++round) {
    sgemm_times.push_back(seconds_of([&] { sgemm.run(); }));
    for (size_t i = 0; i < cases.size(); ++i) {
      case_times[i].push_back(seconds_of([&] { cases[i].run(); }));
    }
  }

  const double sgemm_rate = SgemmCeiling::flops() / median(sgemm_times) * 1e-9;
  std::printf("sgemm 2048^3 f32: %.1f GFLOP/s (median of %d)\n", sgemm_rate, kRounds);
  for (size_t i = 0; i < cases.size(); ++i) {
    const double seconds = median(case_times[i]);
    const double rate = cases[i].flops() / seconds * 1e-9;
    std::printf("prefill %s: %.1f ms, %.1f GFLOP/s, %.2f of sgemm (median of %d)\n",
                cases[i].describe().c_str(), seconds * 1e3, rate, rate / sgemm_rate, kRounds);
  }
  return 0;
}
