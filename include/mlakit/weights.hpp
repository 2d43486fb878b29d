// kv_b_proj weight loading and absorption (spec A.11, C.3).
#pragma once

#include <optional>

#include "mlakit/config.hpp"
#include "mlakit/types.hpp"

namespace mlakit {

inline constexpr int64_t kFp8WeightBlock = 128;  // DeepSeek-V3 checkpoints: 128x128 block scales

// All three live on `device` in the activation dtype.
struct AbsorbedWeights {
  Tensor kv_b_proj;  // [N * (P + V), L]  dequantized kv_b_proj.weight (out x in)
  Tensor w_uk_t;     // [N, P, L]        W_UK_T[n, p, l] = weight[n * (P + V) + p, l]
  Tensor w_uv;       // [N, L, V]        W_UV[n, l, v]   = weight[n * (P + V) + P + v, l]
};

// kv_b_proj_weight:    [N * (P + V), L]  f32, f16, bf16, or fp8 e4m3 (kFp8E4m3 / kU8) with
// kv_b_proj_scale_inv: f32 [ceil(N*(P+V) / 128), ceil(L / 128)] (required for fp8, else absent;
//                      every scale finite and > 0):
//                      value = fp8 * kv_b_proj_scale_inv[row / 128, col / 128].
// The names are those of MlaAttention's constructor (and of the C and Python APIs). The weight is
// read from host memory (CPU tensor) and the results are placed on `device`.
AbsorbedWeights absorb_kv_b_proj(const TensorView& kv_b_proj_weight,
                                 const std::optional<TensorView>& kv_b_proj_scale_inv,
                                 const MlaDims& dims, DType act_dtype, Device device = {});

}  // namespace mlakit
