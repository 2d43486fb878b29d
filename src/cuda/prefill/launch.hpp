// CUDA ops::mla_prefill (docs/kernels/prefill_sm90.md). Arguments are validated by
// src/ops/prefill.cpp (shapes, dtypes, devices); this checks what the kernel itself needs, then
// enqueues on `stream` without synchronizing or allocating. The values of cu_seqlens stay on
// the device: the kernel checks them and reports bad ones through the device error word
// (cuda::check_device_errors), skipping the request.
#pragma once

#include <cstdint>
#include <optional>

#include "mlakit/types.hpp"

namespace mlakit::cuda {

// q: [T, N, 192]  f16 / bf16;  k_nope: [S, N, 128];  k_pe: [S, 64];  v: [S, N, 128]
// cu_seqlens_q, cu_seqlens_k: i32 [B + 1] (device);  out: [T, N, 128] f32 / f16 / bf16
// lse_heads_tokens: f32 [N, T] or absent
// heads_per_block: 0 lets the launcher choose how many heads a block of the warp-specialized kernel
// computes (launch_kernel.cuh, ws_heads_per_block); n >= 1 makes it min(n, N) (a tuning and test
// knob: the tests reach the multi-head path with shapes too small for the rule to pick it). The
// mma.sync kernel always computes one.
void mla_prefill(const TensorView& q, const TensorView& k_nope, const TensorView& k_pe,
                 const TensorView& v, const TensorView& cu_seqlens_q,
                 const TensorView& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                 float scale, bool causal, const TensorView& out,
                 const std::optional<TensorView>& lse_heads_tokens, Stream stream,
                 int heads_per_block = 0);

}  // namespace mlakit::cuda
