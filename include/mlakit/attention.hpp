// MlaAttention: one MLA layer's attention, as an inference engine calls it (spec A.5, A.6, A.12).
// An engine plans each step once (plan_step, step.hpp) and runs every layer against that plan; the
// single-call form below plans and sizes a private workspace itself.
//
// forward() follows the seed's order: write every actual token into the paged cache, run the
// prefill path (up-project, causal attention over the new tokens, context chunks gathered into
// the workspace, up-projected, attended non-causally and merged by LSE), run the decode path
// (absorb W_UK into q, latent MQA over the cache, V up-projection), and write the caller's
// output. Rows past num_actual_tokens are left untouched.
//
// Decode context parallelism (config.dcp.world_size W > 1, docs/dcp.md): the layer is one of the W
// ranks of a DCP group, each serving its own N query heads and holding its share of every
// request's tokens in its own cache (block_table and kv_cache are this rank's). forward() then
// writes only this rank's tokens, gathers the context chunks from all ranks (local gather,
// all-gather, global token order) and runs the decode of all W N heads over the local keys,
// combined across the ranks by LSE and reduce-scattered back to this rank's heads. Every rank must
// run the same steps with the same batch metadata (the collectives pair up).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "mlakit/config.hpp"
#include "mlakit/dist.hpp"
#include "mlakit/plan.hpp"
#include "mlakit/step.hpp"
#include "mlakit/types.hpp"
#include "mlakit/weights.hpp"

namespace mlakit {

class MlaAttention {
 public:
  // kv_b_proj_weight: [N * (P + V), L] host tensor (f32/f16/bf16, or fp8 with scale_inv, see
  // weights.hpp).
  // communicator: the DCP group's, required when config.dcp.world_size > 1 (its rank, world size
  // and device must equal config.dcp's and config.device), ignored otherwise. Not owned: it must
  // outlive the layer. Its collectives run on the stream forward() is given.
  MlaAttention(const MlaAttentionConfig& config, const TensorView& kv_b_proj_weight,
               const std::optional<TensorView>& kv_b_proj_scale_inv = std::nullopt,
               dist::Communicator* communicator = nullptr);
  ~MlaAttention();
  MlaAttention(const MlaAttention&) = delete;
  MlaAttention& operator=(const MlaAttention&) = delete;

  const MlaAttentionConfig& config() const;
  const AbsorbedWeights& weights() const;
  int64_t workspace_tokens() const;  // rows of one context chunk (context_chunk_rows)

  // Validates the batch as plan_step does and plans it (pure host work); for inspection.
  Plan plan(const ForwardBatch& batch) const;

  // q:           [T', N, P + R]  activation dtype (rope already applied)
  // kv_c_normed: [T', L]         activation dtype, row stride may exceed L
  // k_pe:        [T', R] or [T', 1, R]  activation dtype, any row stride
  // kv_cache:    [num_blocks, block_size, entry_width] (kv_cache.hpp); may be empty (numel 0),
  //              then nothing is written and the batch must have no context
  // output:      [T', N * V]     activation dtype; rows [T, T') untouched, T = num_actual_tokens
  // output and kv_cache are written: they must not overlap each other, themselves, q, kv_c_normed
  // or k_pe (kInvalidArgument, "MlaAttention::forward: output must not overlap q").
  // A block id the step reads (a decode request's keys, a context gather's positions) outside
  // [0, num_blocks): on the CPU kOutOfRange naming the request, the table entry, the positions
  // and the range, before anything is written (the ids plan_step read); on a GPU the kernels do
  // not read it and record it in the device error word, which check_device_errors reports after
  // the step has run (ops.hpp).
  // step:        plan_step(config, batch, workspace) of this step, for a configuration equal to the
  //              layer's in everything but the scale (and the weights)
  // Launches only: no host synchronization, no allocation, no planning, no host-to-device copy.
  void forward(const TensorView& q, const TensorView& kv_c_normed, const TensorView& k_pe,
               const TensorView& kv_cache, const StepPlan& step, const TensorView& output,
               const ForwardScales& scales = {}, Stream stream = {});

  // Dynamic fp8 scales from one batch's activations (spec A.2 calculate_kv_scales, with F-36
  // fixed): k_scale = max|[kv_c_normed | k_pe]| / 200 over the first num_tokens rows (the whole
  // latent entry the cache quantizes, k_pe included), q_scale = max|[q_nope W_UK | q_pe]| / 200
  // (the absorbed decode query that is quantized, not the raw q). 200 maps the calibration batch's
  // largest value to 200 of e4m3's 448, leaving 2.24x headroom. An all-zero input gives 1; a scale
  // below FLT_MIN (a maximum under 200 FLT_MIN, ~2.4e-36) is raised to FLT_MIN, the smallest
  // normal float, so that it and its reciprocal stay finite and forward accepts it.
  // q: [T', N, P + R]; kv_c_normed: [T', L]; k_pe: [T', R] or [T', 1, R]. Reads the maxima on
  // the host (synchronizes) and allocates a [T, N, L] scratch: a calibration call, not for graphs.
  // Throws kInvalidArgument when an input holds NaN or infinity.
  ForwardScales calculate_kv_scales(const TensorView& q, const TensorView& kv_c_normed,
                                    const TensorView& k_pe, int64_t num_tokens,
                                    Stream stream = {}) const;

  // Single call: plans the batch and runs it in a workspace the layer owns (allocated, or grown,
  // when a batch needs more than any before). batch == nullptr is the profile run: output is
  // zero-filled and nothing else happens.
  void forward(const TensorView& q, const TensorView& kv_c_normed, const TensorView& k_pe,
               const TensorView& kv_cache, const ForwardBatch* batch, const TensorView& output,
               const ForwardScales& scales = {}, Stream stream = {});

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace mlakit
