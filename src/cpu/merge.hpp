// CPU kernel of ops::merge_attn_states (spec A.8, C.6): combines the attention results of two
// disjoint key sets through their log-sum-exps.
#pragma once

#include <optional>

#include "mlakit/types.hpp"

namespace mlakit::cpu {

// Arguments validated by ops::merge_attn_states (shapes, dtypes, devices, D contiguous).
// output, prefix_output, suffix_output:                      [T, H, D]  f32, f16 or bf16
// prefix_lse_heads_tokens, suffix_lse_heads_tokens, output_lse_heads_tokens: f32 [H, T]
// An LSE of +inf or NaN reads as -inf (empty key set). A side whose weight is exactly 0 is not
// read, so garbage in an empty side's output never reaches the result. Both sides empty gives
// out 0 and lse -inf. Outputs may be the same views as the inputs (each row is read before it
// is written).
void merge_attn_states(const TensorView& output,
                       const std::optional<TensorView>& output_lse_heads_tokens,
                       const TensorView& prefix_output, const TensorView& prefix_lse_heads_tokens,
                       const TensorView& suffix_output, const TensorView& suffix_lse_heads_tokens);

}  // namespace mlakit::cpu
