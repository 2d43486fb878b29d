// MlaAttention: one MLA layer's attention, as an inference engine calls it (spec A.5, A.6, A.12).
//
// forward() follows the seed's order: write every actual token into the paged cache, run the
// prefill path (up-project, causal attention over the new tokens, context chunks gathered into
// the workspace, up-projected, attended non-causally and merged by LSE), run the decode path
// (absorb W_UK into q, latent MQA over the cache, V up-projection), and write the caller's
// output. Rows past num_actual_tokens are left untouched.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "mlakit/config.hpp"
#include "mlakit/plan.hpp"
#include "mlakit/types.hpp"
#include "mlakit/weights.hpp"

namespace mlakit {

struct MlaAttentionConfig {
  MlaDims dims;
  float scale = 0.0f;  // softmax scale from the model config (not 1/sqrt(576)); must be > 0
  DType act_dtype = DType::kBF16;
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;
  int64_t block_size = 64;
  int64_t decode_threshold = 1;  // requests with q_len <= threshold and context > 0 decode
  QueryLenSupport query_len_support = QueryLenSupport::kVarlen;
  // Gather-workspace rows for context chunks; 0 means B.2 from max_model_len and max_num_seqs.
  int64_t workspace_tokens = 0;
  int64_t max_model_len = 4096;
  int64_t max_num_seqs = 256;
  ChunkPolicy chunk_policy = ChunkPolicy::kPacked;
  Device device{};
  // Decode attention cuts each request's keys by its own length only (DecodePlanShape::
  // batch_invariant), so a decode request's latent output and LSE are bitwise the same whatever
  // else is in the batch. The projections around it (batched_matmul) are not made invariant.
  bool batch_invariant = false;
};

// One forward step's batch. Host arrays drive planning; the views are read by the kernels and
// must live on the layer's device.
struct ForwardBatch {
  std::span<const int32_t> query_start_loc;  // host [R + 1], requests reordered decodes-first
  std::span<const int32_t> seq_lens;         // host [R]
  int64_t num_actual_tokens = 0;             // T: tokens to process (padding rows excluded)
  TensorView block_table;                    // i32 [R, max_blocks] (rows of padding: any value)
  TensorView slot_mapping;                   // i64 [>= T]; < 0 skips the cache write
};

// fp8 scales of the layer (spec A.2): k_scale quantizes the whole latent entry, q_scale the
// decode query. Both are used only with fp8 caches.
struct ForwardScales {
  float q_scale = 1.0f;
  float k_scale = 1.0f;
};

class MlaAttention {
 public:
  // kv_b_proj_weight: [N * (P + V), L] host tensor (f32/f16/bf16, or fp8 with scale_inv, see
  // weights.hpp).
  MlaAttention(const MlaAttentionConfig& config, const TensorView& kv_b_proj_weight,
               const std::optional<TensorView>& kv_b_proj_scale_inv = std::nullopt);
  ~MlaAttention();
  MlaAttention(const MlaAttention&) = delete;
  MlaAttention& operator=(const MlaAttention&) = delete;

  const MlaAttentionConfig& config() const;
  const AbsorbedWeights& weights() const;
  int64_t workspace_tokens() const;  // rows of the context-gather workspace

  // Plans one step (pure host work); forward() calls it, callers may inspect it.
  Plan plan(const ForwardBatch& batch) const;

  // q:           [T', N, P + R]  activation dtype (rope already applied)
  // kv_c_normed: [T', L]         activation dtype, row stride may exceed L
  // k_pe:        [T', R]         activation dtype, any row stride
  // kv_cache:    [num_blocks, block_size, entry_width] (kv_cache.hpp); may be empty (numel 0),
  //              then nothing is written and the batch must have no context
  // output:      [T', N * V]     activation dtype; rows [T, T') untouched
  // batch:       nullptr = profile run: output is zero-filled and nothing else happens
  void forward(const TensorView& q, const TensorView& kv_c_normed, const TensorView& k_pe,
               const TensorView& kv_cache, const ForwardBatch* batch, const TensorView& output,
               const ForwardScales& scales = {}, Stream stream = {});

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace mlakit
