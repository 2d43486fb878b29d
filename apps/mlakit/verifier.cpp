#include "verifier.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "reference/reference.hpp"

namespace mlakit::cli {

namespace {

// Rows of a prefill compared with the oracle: the last ones see the most keys; 64 keeps the
// oracle's attention cost below its up-projection cost.
constexpr int64_t kMaxPrefillRows = 64;

double view_at(const TensorView& t, int64_t offset) {
  return static_cast<double>(load_float(t.data, t.dtype, offset));
}

}  // namespace

double verify_tolerance(DType act_dtype) {
  switch (act_dtype) {
    case DType::kF32:
      return 2e-3;  // f32 accumulation over <= a few thousand terms
    case DType::kF16:
      return 1e-2;  // 10 mantissa bits on outputs and intermediates
    default:
      return 5e-2;  // bf16: 7 mantissa bits on outputs and intermediates (k/v, o_lat, ql_nope)
  }
}

double verify_decode_tolerance(DType act_dtype, KvCacheDType kv_dtype) {
  // fp8 query (3 mantissa bits): the stub calibration gave up to 0.05 on |out| <= 1.2.
  constexpr double kFp8QueryTolerance = 0.15;
  return is_fp8(kv_dtype) ? std::max(kFp8QueryTolerance, verify_tolerance(act_dtype))
                          : verify_tolerance(act_dtype);
}

struct Verifier::LayerState {
  KvMirror mirror;
  ref::MlaWeights weights;  // rows of the checked heads only
};

Verifier::Verifier(const VerifyConfig& config, const KvCacheSpec& spec, float scale, float k_scale,
                   int64_t num_layers)
    : config_(config), spec_(spec), scale_(scale), k_scale_(k_scale) {
  result_.decode.tolerance = verify_decode_tolerance(spec.act_dtype, spec.kv_dtype);
  result_.prefill.tolerance = verify_tolerance(spec.act_dtype);
  if (!config_.enabled) return;
  const int64_t n = spec.dims.num_heads;
  const int64_t count = std::clamp<int64_t>(config_.heads, 1, n);
  for (int64_t i = 0; i < count; ++i) {
    heads_.push_back(count == 1 ? 0 : i * (n - 1) / (count - 1));  // first and last included
  }
  heads_.erase(std::unique(heads_.begin(), heads_.end()), heads_.end());
  for (int64_t l = 0; l < num_layers; ++l) {
    layers_.push_back(std::make_unique<LayerState>(LayerState{KvMirror(spec, k_scale), {}}));
  }
}

Verifier::~Verifier() = default;

void Verifier::set_layer_weight(int64_t layer, const TensorView& weight) {
  if (!config_.enabled) return;
  const MlaDims& d = spec_.dims;
  const int64_t pv = d.kv_b_out_dim(), l = d.kv_lora_rank;
  ref::MlaWeights& w = layers_[layer]->weights;
  w = {static_cast<int64_t>(heads_.size()),
       l,
       d.qk_nope_head_dim,
       d.qk_rope_head_dim,
       d.v_head_dim,
       {}};
  w.kv_b_proj.reserve(heads_.size() * pv * l);
  for (int64_t h : heads_) {
    for (int64_t row = h * pv; row < (h + 1) * pv; ++row) {
      for (int64_t c = 0; c < l; ++c) {
        w.kv_b_proj.push_back(view_at(weight, row * weight.stride(0) + c * weight.stride(1)));
      }
    }
  }
}

void Verifier::record_writes(int64_t layer, const TensorView& kv_c, const TensorView& k_pe,
                             const sim::StepBatch& batch) {
  if (!config_.enabled) return;
  layers_[layer]->mirror.write(kv_c, k_pe, batch.slot_mapping);
}

int64_t Verifier::plan_step(bool has_prefill) {
  if (!config_.enabled) return -1;
  // Prefill steps are few and exercise the most code (chunked context, LSE merges), so they are
  // sampled 4x as often as decode-only steps.
  const int64_t prefill_every = std::max<int64_t>(1, config_.every / 4);
  const bool sampled = has_prefill ? prefill_steps_seen_++ % prefill_every == 0
                                   : decode_steps_seen_++ % config_.every == 0;
  if (!sampled) return -1;
  return samples_ % static_cast<int64_t>(layers_.size());
}

void Verifier::check(int64_t layer, const sim::StepBatch& batch, const TensorView& q,
                     const TensorView& kv_c, const TensorView& k_pe, const TensorView& output) {
  const int64_t sample = samples_++;
  const int64_t np = batch.num_reqs() - batch.num_decodes;
  // CUDA-graph padding requests (q_len 0) trail the decodes and have nothing to check.
  int64_t nd = 0;
  while (nd < batch.num_decodes && batch.query_start_loc[nd + 1] > batch.query_start_loc[nd]) ++nd;
  if (nd > 0) check_request(layer, batch, sample % nd, q, kv_c, k_pe, output);
  if (np > 0) check_request(layer, batch, nd + sample % np, q, kv_c, k_pe, output);
}

void Verifier::check_request(int64_t layer, const sim::StepBatch& batch, int64_t req,
                             const TensorView& q, const TensorView& kv_c, const TensorView& k_pe,
                             const TensorView& output) {
  const MlaDims& d = spec_.dims;
  const int64_t l = d.kv_lora_rank, r = d.qk_rope_head_dim, dqk = d.qk_head_dim();
  const int64_t vd = d.v_head_dim, hv = static_cast<int64_t>(heads_.size());
  const bool decode_path = req < batch.num_decodes;
  const int64_t q_begin = batch.query_start_loc[req], q_end = batch.query_start_loc[req + 1];
  const int64_t q_len = q_end - q_begin, seq_len = batch.seq_lens[req];
  const int64_t context = seq_len - q_len;
  const int64_t rows = decode_path ? q_len : std::min(q_len, kMaxPrefillRows);
  const int64_t first_row = q_end - rows;
  const LayerState& state = *layers_[layer];

  // Keys: cached values for the decode path and for context; raw inputs for new prefill tokens.
  std::vector<double> kv(seq_len * l), pe(seq_len * r);
  for (int64_t pos = 0; pos < seq_len; ++pos) {
    const int64_t t = q_begin + (pos - context);  // token row of a new position
    if (decode_path || pos < context) {
      const int64_t slot =
          int64_t{batch.block_table[req * batch.block_table_width + pos / spec_.block_size]} *
              spec_.block_size +
          pos % spec_.block_size;
      const std::span<const float> e = state.mirror.entry(slot);
      std::copy(e.begin(), e.begin() + l, kv.begin() + pos * l);
      std::copy(e.begin() + l, e.end(), pe.begin() + pos * r);
    } else {
      for (int64_t i = 0; i < l; ++i) {
        kv[pos * l + i] = view_at(kv_c, t * kv_c.stride(0) + i * kv_c.stride(1));
      }
      for (int64_t i = 0; i < r; ++i) {
        pe[pos * r + i] = view_at(k_pe, t * k_pe.stride(0) + i * k_pe.stride(1));
      }
    }
  }
  std::vector<double> qd(rows * hv * dqk);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t h = 0; h < hv; ++h) {
      for (int64_t j = 0; j < dqk; ++j) {
        qd[(i * hv + h) * dqk + j] =
            view_at(q, (first_row + i) * q.stride(0) + heads_[h] * q.stride(1) + j * q.stride(2));
      }
    }
  }
  const ref::AttentionResult ref =
      ref::mla_mha(state.weights, qd, kv, pe, rows, seq_len, static_cast<double>(scale_));

  PhaseError& e = decode_path ? result_.decode : result_.prefill;
  ++e.checks;
  e.rows += rows;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t h = 0; h < hv; ++h) {
      for (int64_t v = 0; v < vd; ++v) {
        const double expected = ref.out[(i * hv + h) * vd + v];
        const double actual = view_at(
            output, (first_row + i) * output.stride(0) + (heads_[h] * vd + v) * output.stride(1));
        double err = std::fabs(actual - expected);
        if (std::isnan(err)) err = std::numeric_limits<double>::infinity();
        e.max_abs_err = std::max(e.max_abs_err, err);
        e.max_abs_ref = std::max(e.max_abs_ref, std::fabs(expected));
      }
    }
  }
}

}  // namespace mlakit::cli
