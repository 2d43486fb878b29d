// The weights of the LSE-corrected DCP combine (spec A.9, C.6), host side; the CUDA kernels
// compute the same formulas (cuda/dcp/combine.cu). For W partial results over disjoint key sets
// with natural-log LSEs l_k:
//   m = max_k l_k,  s = sum_k exp(l_k - m),  lse = m + ln s,  weight_k = exp(l_k - m) / s.
// NaN and +inf read as -inf (an empty set, spec F-3); all sets empty gives lse -inf and every
// weight 0, never NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace mlakit::detail {

inline float canonical_dcp_lse(float lse) {
  return (std::isnan(lse) || lse == std::numeric_limits<float>::infinity())
             ? -std::numeric_limits<float>::infinity()
             : lse;
}

struct DcpWeights {
  float max = -std::numeric_limits<float>::infinity();  // m
  float sum = 0.0f;                                     // s (0 when every set is empty)
  float lse = -std::numeric_limits<float>::infinity();  // combined LSE

  // Weight of a partial whose LSE is `lse_k`: exactly 0 for an empty set.
  float weight(float lse_k) const {
    const float l = canonical_dcp_lse(lse_k);
    if (l == -std::numeric_limits<float>::infinity()) return 0.0f;
    return std::exp(l - max) / sum;
  }
};

// lse_of(k) for k in [0, w): the partial LSEs.
template <class LseOf>
DcpWeights dcp_weights(int64_t w, const LseOf& lse_of) {
  DcpWeights r;
  for (int64_t k = 0; k < w; ++k) r.max = std::fmax(r.max, canonical_dcp_lse(lse_of(k)));
  if (r.max == -std::numeric_limits<float>::infinity()) return r;
  for (int64_t k = 0; k < w; ++k) {
    const float l = canonical_dcp_lse(lse_of(k));
    if (l != -std::numeric_limits<float>::infinity()) r.sum += std::exp(l - r.max);
  }
  r.lse = r.max + std::log(r.sum);
  return r;
}

}  // namespace mlakit::detail
