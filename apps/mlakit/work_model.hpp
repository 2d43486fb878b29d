// FLOPs and bytes of one forward step of one layer, as MLA computes it (DESIGN.md §6), so that
// `mlakit run` can report achieved GFLOP/s (prefill) and GB/s (decode) next to tokens/s.
//
// Prefill request (q new tokens, c context tokens, s = c + q): up-projection of all s latents
// 2·s·L·N(P+V); attention 2·N·(P+R+V)·Σ_i (c + i + 1) over the causal new tokens and the context.
// Decode request (q tokens, s keys): absorption 2·q·N·P·L, latent attention 2·q·N·s·(L+R+L),
// V up-projection 2·q·N·L·V. Decode bytes: every decode request's s cache entries, plus W_UK_T
// and W_UV once per step when there are decodes. Weights of the prefill path are not counted
// (compute-bound), nor activations (small next to the cache).
#pragma once

#include <cstdint>

#include "mlakit/config.hpp"
#include "step_batch.hpp"

namespace mlakit::sim {

struct StepWork {
  double prefill_flops = 0.0;
  double decode_flops = 0.0;
  double decode_bytes = 0.0;
};

// entry_bytes: bytes per cached token (KvCacheSpec::entry_bytes); act_bytes: activation dtype
// size (the absorbed weights are stored in it).
StepWork step_work(const StepBatch& batch, const MlaDims& dims, int64_t entry_bytes,
                   int64_t act_bytes);

}  // namespace mlakit::sim
