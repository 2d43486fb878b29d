#include "reference/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

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
  for (int64_t s = 0; s < sk; ++s) {
    for (int64_t h = 0; h < n; ++h) {
      for (int64_t j = 0; j < p + vd; ++j) {
        const double* row = &w.kv_b_proj[(h * (p + vd) + j) * l];
        double acc = 0;
        for (int64_t c = 0; c < l; ++c) acc += row[c] * kv_c[s * l + c];
        if (j < p) {
          k[(s * n + h) * dqk + j] = acc;
        } else {
          v[(s * n + h) * vd + (j - p)] = acc;
        }
      }
      for (int64_t j = 0; j < r; ++j) k[(s * n + h) * dqk + p + j] = k_pe[s * r + j];
    }
  }
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
