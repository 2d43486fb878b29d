#include "work_model.hpp"

namespace mlakit::sim {

StepWork step_work(const StepBatch& batch, const MlaDims& d, int64_t entry_bytes,
                   int64_t act_bytes) {
  const auto n = static_cast<double>(d.num_heads), l = static_cast<double>(d.kv_lora_rank);
  const auto r = static_cast<double>(d.qk_rope_head_dim);
  const auto p = static_cast<double>(d.qk_nope_head_dim), v = static_cast<double>(d.v_head_dim);
  StepWork w;
  for (int64_t i = 0; i < batch.num_reqs(); ++i) {
    const auto q = static_cast<double>(batch.query_start_loc[i + 1] - batch.query_start_loc[i]);
    const auto s = static_cast<double>(batch.seq_lens[i]);
    if (i < batch.num_decodes) {
      w.decode_flops += 2.0 * q * n * (p * l + s * (l + r + l) + l * v);
      w.decode_bytes += s * static_cast<double>(entry_bytes);
    } else {
      const double c = s - q;
      const double visible = q * c + q * (q + 1.0) / 2.0;  // sum over i of c + i + 1
      w.prefill_flops += 2.0 * s * l * n * (p + v) + 2.0 * n * (p + r + v) * visible;
    }
  }
  if (batch.num_decodes > 0) w.decode_bytes += n * (p * l + l * v) * static_cast<double>(act_bytes);
  return w;
}

}  // namespace mlakit::sim
