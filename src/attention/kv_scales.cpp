// MlaAttention::calculate_kv_scales (spec A.2, F-36): dynamic fp8 scales from one batch.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "attention/inputs.hpp"
#include "core/check.hpp"
#include "mlakit/attention.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {

namespace {

using detail::require;

constexpr const char* kOp = "MlaAttention::calculate_kv_scales";
// vLLM's K_SCALE_CONSTANT / Q_SCALE_CONSTANT: the calibration maximum becomes 200 in e4m3 units,
// 2.24x below e4m3's largest value (448), headroom for later batches.
constexpr float kScaleDivisor = 200.0f;

// abs_max / 200, at least FLT_MIN; 1 for an all-zero input. Below 200 FLT_MIN (~2.4e-36) the
// quotient would be subnormal (or 0): imprecise, and from ~2.9e-39 down its reciprocal, which the
// fp8 quantization of q multiplies by, is infinite and the next forward refuses it. FLT_MIN, the
// smallest normal float (the floor fp8_ds_mla's tile scales use), still maps the calibration
// maximum into e4m3's range (below 200) and has a finite reciprocal.
float scale_of(float abs_max, const char* what) {
  require(std::isfinite(abs_max), ErrorCode::kInvalidArgument, kOp, ": ", what,
          " holds NaN or infinity (max |x| = ", abs_max, ")");
  return abs_max > 0.0f ? std::max(abs_max / kScaleDivisor, FLT_MIN) : 1.0f;
}

// max(a, b), NaN when either is NaN (std::fmax would drop it).
float nan_max(float a, float b) { return std::isnan(a) || std::isnan(b) ? NAN : std::fmax(a, b); }

}  // namespace

ForwardScales MlaAttention::calculate_kv_scales(const TensorView& q, const TensorView& kv_c_normed,
                                                const TensorView& k_pe_in, int64_t num_tokens,
                                                Stream stream) const {
  const MlaAttentionConfig& c = config();
  const MlaDims& d = c.dims;
  const TensorView k_pe = detail::squeeze_k_pe(kOp, k_pe_in);
  for (auto [name, t] : {std::pair{"q", &q}, {"kv_c_normed", &kv_c_normed}, {"k_pe", &k_pe}}) {
    detail::check_storage(kOp, name, *t);
    detail::check_dtype(kOp, name, *t, {c.act_dtype});
    detail::check_device(kOp, name, *t, c.device);
    detail::check_min_size(kOp, name, *t, 0, num_tokens);
  }
  detail::check_ndim(kOp, "q", q, 3);
  detail::check_size(kOp, "q", q, 1, d.num_heads);
  detail::check_size(kOp, "q", q, 2, d.qk_head_dim());
  detail::check_inner_contiguous(kOp, "q", q);
  detail::check_ndim(kOp, "kv_c_normed", kv_c_normed, 2);
  detail::check_size(kOp, "kv_c_normed", kv_c_normed, 1, d.kv_lora_rank);
  detail::check_ndim(kOp, "k_pe", k_pe, 2);
  detail::check_size(kOp, "k_pe", k_pe, 1, d.qk_rope_head_dim);
  require(num_tokens > 0, ErrorCode::kInvalidArgument, kOp, ": num_tokens must be > 0, got ",
          num_tokens);

  ForwardScales scales;
  const float kv_max = nan_max(ops::abs_max(kv_c_normed.narrow(0, 0, num_tokens), stream),
                               ops::abs_max(k_pe.narrow(0, 0, num_tokens), stream));
  scales.k_scale = scale_of(kv_max, "[kv_c_normed | k_pe]");
  // The absorbed query [T, N, L]: q_nope[:, n] @ W_UK_T[n], as forward computes it.
  const Tensor ql = Tensor::empty({num_tokens, d.num_heads, d.kv_lora_rank}, c.act_dtype, c.device);
  const TensorView qt = q.narrow(0, 0, num_tokens);
  ops::batched_matmul(qt.narrow(2, 0, d.qk_nope_head_dim).transpose(0, 1), weights().w_uk_t,
                      ql.view().transpose(0, 1), stream);
  const float q_max =
      nan_max(ops::abs_max(ql, stream),
              ops::abs_max(qt.narrow(2, d.qk_nope_head_dim, d.qk_rope_head_dim), stream));
  scales.q_scale = scale_of(q_max, "the absorbed query [q_nope W_UK | q_pe]");
  return scales;
}

}  // namespace mlakit
