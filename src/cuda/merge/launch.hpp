// CUDA merge_attn_states (docs/kernels/merge_cuda.md). Arguments are validated by
// src/ops/merge.cpp; this enqueues on `stream` without synchronizing or allocating.
#pragma once

#include <optional>

#include "mlakit/types.hpp"

namespace mlakit::cuda {

// output, prefix_output, suffix_output: [T, H, D] (D contiguous; prefix and suffix share a dtype)
// *_lse_heads_tokens: f32 [H, T], any strides
void merge_attn_states(const TensorView& output,
                       const std::optional<TensorView>& output_lse_heads_tokens,
                       const TensorView& prefix_output, const TensorView& prefix_lse_heads_tokens,
                       const TensorView& suffix_output, const TensorView& suffix_lse_heads_tokens,
                       Stream stream);

}  // namespace mlakit::cuda
