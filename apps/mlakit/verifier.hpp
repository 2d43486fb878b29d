// `mlakit run --verify`: compares sampled forward outputs with the fp64 oracle ref::mla_mha.
//
// Every `every`-th step, on one layer (rotating through the stack), one decode request and one
// prefill request of the step are recomputed by the oracle on a few heads (each head of MLA is
// independent, so a head subset is an exact check at a fraction of the cost) over the request's
// whole key history: keys come from a host mirror of the cache (values as the cache holds them,
// fp8 dequantized) for the decode path and for the context of prefills; a prefill's new tokens
// use its unquantized inputs (spec F-24). Only the last kMaxPrefillRows query rows of a prefill
// are checked: they attend to the most keys.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "kv_mirror.hpp"
#include "mlakit/config.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/types.hpp"
#include "step_batch.hpp"

namespace mlakit::cli {

struct VerifyConfig {
  bool enabled = false;
  int64_t every = 8;  // check every k-th decode-only step and every max(1, k/4)-th prefill step
  int64_t heads = 4;  // heads checked per request
};

struct PhaseError {
  int64_t checks = 0;        // requests compared
  int64_t rows = 0;          // query rows compared
  double max_abs_err = 0.0;  // NaN outputs count as +inf
  double max_abs_ref = 0.0;
  double tolerance = 0.0;  // for outputs of O(1); scaled up by max|ref| when that exceeds 1
  double rel_err() const { return max_abs_ref > 0.0 ? max_abs_err / max_abs_ref : max_abs_err; }
  double allowed() const { return tolerance * std::max(1.0, max_abs_ref); }
  bool passed() const { return max_abs_err <= allowed(); }
};

struct VerifyResult {
  PhaseError decode;   // requests on the decode path (absorbed, reads the cache only)
  PhaseError prefill;  // requests on the prefill path (new tokens unquantized)
  bool passed() const { return decode.passed() && prefill.passed(); }
};

// Absolute tolerances on outputs of O(1) (docs/cli.md explains the calibration). Only the decode
// path sees an fp8 query, which the oracle cannot reproduce in the MHA form; every other fp8
// effect is in the oracle's keys.
double verify_tolerance(DType act_dtype);
double verify_decode_tolerance(DType act_dtype, KvCacheDType kv_dtype);

class Verifier {
 public:
  Verifier(const VerifyConfig& config, const KvCacheSpec& spec, float scale, float k_scale,
           int64_t num_layers);
  ~Verifier();

  bool enabled() const { return config_.enabled; }
  // weight: host [N * (P + V), L], the layer's kv_b_proj as handed to MlaAttention.
  void set_layer_weight(int64_t layer, const TensorView& weight);
  // Mirrors the cache writes of one step of `layer` (call for every layer and step).
  void record_writes(int64_t layer, const TensorView& kv_c, const TensorView& k_pe,
                     const sim::StepBatch& batch);
  // Called once per step, before its forward: the layer to check in this step, or -1.
  int64_t plan_step(bool has_prefill);
  // After forward of `layer` at a planned step. q: host [>= T, N, P + R]; kv_c: host [>= T, L];
  // k_pe: host [>= T, R]; output: host [>= T, N * V].
  void check(int64_t layer, const sim::StepBatch& batch, const TensorView& q,
             const TensorView& kv_c, const TensorView& k_pe, const TensorView& output);

  const VerifyResult& result() const { return result_; }

 private:
  struct LayerState;
  void check_request(int64_t layer, const sim::StepBatch& batch, int64_t req, const TensorView& q,
                     const TensorView& kv_c, const TensorView& k_pe, const TensorView& output);

  VerifyConfig config_;
  KvCacheSpec spec_;
  float scale_;
  float k_scale_;
  std::vector<int64_t> heads_;  // the checked heads, spread over [0, N)
  std::vector<std::unique_ptr<LayerState>> layers_;
  int64_t prefill_steps_seen_ = 0;
  int64_t decode_steps_seen_ = 0;
  int64_t samples_ = 0;  // steps checked so far: rotates the layer and the requests checked
  VerifyResult result_;
};

}  // namespace mlakit::cli
