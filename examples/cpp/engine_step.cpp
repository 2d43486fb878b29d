// An engine's use of mlakit, in miniature: one MLA layer on the CPU, one shared Workspace, and per
// step one plan_step followed by the layer's forward. Step 0 prefills every request's prompt; the
// steps after it decode one token per request. Prints one line; exits 1 when an output is not
// finite. Built against the installed package (find_package) and the source tree
// (add_subdirectory); see CMakeLists.txt.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "mlakit/attention.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/step.hpp"

namespace {

constexpr int64_t kRequests = 2;
constexpr int64_t kPromptLen = 40;        // tokens prefilled by step 0 per request
constexpr int64_t kDecodeSteps = 4;       // one generated token per request each
constexpr int64_t kBlockSize = 16;        // tokens per KV block
constexpr int64_t kBlocksPerRequest = 3;  // 48 slots >= 40 prompt + 4 decoded tokens
// DeepSeek-V2-Lite's softmax scale (docs/cli.md presets); any positive value works here.
constexpr float kScale = 0.1147214f;

void fill_normal(const mlakit::Tensor& t, std::mt19937& rng, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  float* data = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) data[i] = normal(rng);
}

}  // namespace

int main() {
  mlakit::MlaAttentionConfig config;
  config.dims = {};  // DeepSeek dims: 16 heads, L 512, R 64, P 128, V 128
  config.scale = kScale;
  config.act_dtype = mlakit::DType::kF32;
  config.block_size = kBlockSize;
  config.max_model_len = kBlocksPerRequest * kBlockSize;
  config.max_num_seqs = kRequests;
  config.max_num_batched_tokens = kRequests * kPromptLen;
  const mlakit::MlaDims& d = config.dims;

  std::mt19937 rng(0);
  // kv_b_proj [N * (P + V), L]; N(0, 1/L) entries give unit-variance k_nope and v.
  mlakit::Tensor kv_b_proj =
      mlakit::Tensor::empty({d.num_heads * d.kv_b_out_dim(), d.kv_lora_rank}, mlakit::DType::kF32);
  fill_normal(kv_b_proj, rng, 1.0f / std::sqrt(static_cast<float>(d.kv_lora_rank)));
  mlakit::MlaAttention layer(config, kv_b_proj);

  mlakit::KvCacheSpec cache_spec{d, mlakit::KvCacheDType::kAuto, mlakit::DType::kF32, kBlockSize,
                                 kRequests * kBlocksPerRequest};
  const auto cache_shape = cache_spec.cache_shape();
  mlakit::Tensor kv_cache = mlakit::Tensor::empty(cache_shape, mlakit::DType::kF32);
  mlakit::Workspace workspace(config);
  workspace.touch();  // the profile run: commit the workspace before the "engine" sizes its cache

  // Request r owns blocks [r * kBlocksPerRequest, (r + 1) * kBlocksPerRequest).
  mlakit::Tensor block_table =
      mlakit::Tensor::empty({kRequests, kBlocksPerRequest}, mlakit::DType::kI32);
  for (int64_t i = 0; i < block_table.numel(); ++i) block_table.data<int32_t>()[i] = int32_t(i);

  std::vector<int32_t> seq_lens(kRequests, 0);
  int64_t finite_values = 0, nonfinite_values = 0;
  for (int64_t step = 0; step <= kDecodeSteps; ++step) {
    const int64_t new_tokens = step == 0 ? kPromptLen : 1;
    const int64_t tokens = kRequests * new_tokens;
    std::vector<int32_t> query_start_loc(kRequests + 1, 0);
    mlakit::Tensor slot_mapping = mlakit::Tensor::empty({tokens}, mlakit::DType::kI64);
    for (int64_t r = 0; r < kRequests; ++r) {
      query_start_loc[r + 1] = static_cast<int32_t>((r + 1) * new_tokens);
      for (int64_t t = 0; t < new_tokens; ++t) {
        const int64_t position = seq_lens[r] + t;
        slot_mapping.data<int64_t>()[r * new_tokens + t] =
            (r * kBlocksPerRequest + position / kBlockSize) * kBlockSize + position % kBlockSize;
      }
      seq_lens[r] += static_cast<int32_t>(new_tokens);
    }

    // The step's activations: q [T, N, P + R], kv_c_normed [T, L], k_pe [T, R]; output [T, N * V].
    mlakit::Tensor q =
        mlakit::Tensor::empty({tokens, d.num_heads, d.qk_head_dim()}, mlakit::DType::kF32);
    mlakit::Tensor kv_c = mlakit::Tensor::empty({tokens, d.kv_lora_rank}, mlakit::DType::kF32);
    mlakit::Tensor k_pe = mlakit::Tensor::empty({tokens, d.qk_rope_head_dim}, mlakit::DType::kF32);
    mlakit::Tensor output =
        mlakit::Tensor::empty({tokens, d.num_heads * d.v_head_dim}, mlakit::DType::kF32);
    fill_normal(q, rng, 1.0f);
    fill_normal(kv_c, rng, 1.0f);
    fill_normal(k_pe, rng, 1.0f);

    mlakit::ForwardBatch batch;
    batch.query_start_loc = query_start_loc;
    batch.seq_lens = seq_lens;
    batch.num_actual_tokens = tokens;
    batch.block_table = block_table;
    batch.slot_mapping = slot_mapping;
    const mlakit::StepPlan plan = mlakit::plan_step(config, batch, workspace);
    layer.forward(q, kv_c, k_pe, kv_cache, plan, output);

    for (int64_t i = 0; i < output.numel(); ++i) {
      (std::isfinite(output.data<float>()[i]) ? finite_values : nonfinite_values) += 1;
    }
  }
  std::printf(
      "engine_step: %lld requests, prompt %lld, %lld decode steps: %lld outputs finite, "
      "%lld not\n",
      static_cast<long long>(kRequests), static_cast<long long>(kPromptLen),
      static_cast<long long>(kDecodeSteps), static_cast<long long>(finite_values),
      static_cast<long long>(nonfinite_values));
  return nonfinite_values == 0 && finite_values > 0 ? 0 : 1;
}
