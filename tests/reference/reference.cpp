#include "reference/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <thread>
#include <vector>

namespace mlakit::ref {

namespace {
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
}

AttentionResult attention(std::span<const double> q, std::span<const double> k,
                          std::span<const double> v, int64_t sq, int64_t sk, int64_t heads,
                          int64_t kv_heads, int64_t dqk, int64_t dv, double scale, bool causal) {
  if (kv_heads != 1 && kv_heads != heads) throw std::invalid_argument("ref: kv_heads");
  if (static_cast<int64_t>(q.size()) != sq * heads * dqk ||
      static_cast<int64_t>(k.size()) != sk * kv_heads * dqk ||
      static_cast<int64_t>(v.size()) != sk * kv_heads * dv) {
    throw std::invalid_argument("ref::attention: input sizes do not match the shape");
  }
  AttentionResult r;
  r.out.assign(sq * heads * dv, 0.0);
  r.lse.assign(sq * heads, kNegInf);
  std::vector<double> scores(sk);
  for (int64_t i = 0; i < sq; ++i) {
    const int64_t visible = causal ? std::clamp<int64_t>(sk - sq + i + 1, 0, sk) : sk;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kh = kv_heads == 1 ? 0 : h;
      const double* qi = &q[(i * heads + h) * dqk];
      double max_score = kNegInf;
      for (int64_t s = 0; s < visible; ++s) {
        const double* ks = &k[(s * kv_heads + kh) * dqk];
        double dot = 0;
        for (int64_t d = 0; d < dqk; ++d) dot += qi[d] * ks[d];
        scores[s] = dot * scale;
        max_score = std::max(max_score, scores[s]);
      }
      if (visible == 0) continue;
      double sum = 0;
      for (int64_t s = 0; s < visible; ++s) sum += std::exp(scores[s] - max_score);
      double* o = &r.out[(i * heads + h) * dv];
      for (int64_t s = 0; s < visible; ++s) {
        const double p = std::exp(scores[s] - max_score) / sum;
        const double* vs = &v[(s * kv_heads + kh) * dv];
        for (int64_t d = 0; d < dv; ++d) o[d] += p * vs[d];
      }
      r.lse[i * heads + h] = max_score + std::log(sum);
    }
  }
  return r;
}

AttentionResult mla_mha(const MlaWeights& w, std::span<const double> q,
                        std::span<const double> kv_c, std::span<const double> k_pe, int64_t sq,
                        int64_t sk, double scale) {
  const int64_t n = w.num_heads, l = w.kv_lora_rank, p = w.qk_nope_head_dim, r = w.qk_rope_head_dim,
                vd = w.v_head_dim;
  const int64_t dqk = p + r;
  if (static_cast<int64_t>(w.kv_b_proj.size()) != n * (p + vd) * l ||
      static_cast<int64_t>(kv_c.size()) != sk * l || static_cast<int64_t>(k_pe.size()) != sk * r) {
    throw std::invalid_argument("ref::mla_mha: input sizes do not match the shape");
  }
  std::vector<double> k(sk * n * dqk), v(sk * n * vd);
  // Keys [s0, s1) up-projected, kKeys keys at a time: they share each weight row while it is in
  // L1, and their independent sums keep the FPU busy (~3x a key at a time). Each element is still
  // one dot product summed in order over c, so neither this blocking nor the split of the keys
  // over threads below changes a bit of k or v.
  constexpr int64_t kKeys = 4;
  auto up_project = [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; s += kKeys) {
      const int64_t keys = std::min(kKeys, s1 - s);
      const double* x = kv_c.data() + s * l;  // [keys, L]
      for (int64_t h = 0; h < n; ++h) {
        for (int64_t j = 0; j < p + vd; ++j) {
          const double* row = &w.kv_b_proj[(h * (p + vd) + j) * l];
          double acc[kKeys] = {};
          if (keys == kKeys) {
            for (int64_t c = 0; c < l; ++c)
              for (int64_t i = 0; i < kKeys; ++i) acc[i] += row[c] * x[i * l + c];
          } else {
            for (int64_t i = 0; i < keys; ++i)
              for (int64_t c = 0; c < l; ++c) acc[i] += row[c] * x[i * l + c];
          }
          for (int64_t i = 0; i < keys; ++i) {
            if (j < p) {
              k[((s + i) * n + h) * dqk + j] = acc[i];
            } else {
              v[((s + i) * n + h) * vd + (j - p)] = acc[i];
            }
          }
        }
        for (int64_t i = 0; i < keys; ++i)
          for (int64_t j = 0; j < r; ++j)
            k[((s + i) * n + h) * dqk + p + j] = k_pe[(s + i) * r + j];
      }
    }
  };
  // The up-projection is the oracle's cost (sk N (P + V) L multiply-adds: ~7e9 for 3500 keys of
  // DeepSeek-V3's 16 heads at TP 8, seconds on one core), so keys are shared out over the
  // machine's threads once there are enough multiply-adds (2^24) to pay for starting a thread.
  const int64_t work = sk * n * (p + vd) * l;
  const int64_t threads =
      std::clamp<int64_t>(std::min<int64_t>(std::thread::hardware_concurrency(), work >> 24), 1,
                          std::max<int64_t>(sk, 1));
  std::vector<std::thread> helpers;
  for (int64_t t = 1; t < threads; ++t)
    helpers.emplace_back(up_project, sk * t / threads, sk * (t + 1) / threads);
  up_project(0, sk / threads);
  for (std::thread& t : helpers) t.join();
  return attention(q, k, v, sq, sk, n, n, dqk, vd, scale, /*causal=*/true);
}

MergeResult merge(std::span<const double> prefix_out, std::span<const double> prefix_lse,
                  std::span<const double> suffix_out, std::span<const double> suffix_lse,
                  int64_t tokens, int64_t heads, int64_t d) {
  MergeResult m;
  m.out.assign(tokens * heads * d, 0.0);
  m.lse.assign(heads * tokens, kNegInf);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      double pl = prefix_lse[h * tokens + t], sl = suffix_lse[h * tokens + t];
      if (pl == std::numeric_limits<double>::infinity()) pl = kNegInf;
      if (sl == std::numeric_limits<double>::infinity()) sl = kNegInf;
      const double mx = std::max(pl, sl);
      if (mx == kNegInf) continue;  // both empty: out 0, lse -inf
      const double pw = std::exp(pl - mx), sw = std::exp(sl - mx);
      for (int64_t j = 0; j < d; ++j) {
        const int64_t idx = (t * heads + h) * d + j;
        m.out[idx] = (prefix_out[idx] * pw + suffix_out[idx] * sw) / (pw + sw);
      }
      m.lse[h * tokens + t] = mx + std::log(pw + sw);
    }
  }
  return m;
}

}  // namespace mlakit::ref
