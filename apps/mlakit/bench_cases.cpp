#include "bench_cases.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

#include "device_io.hpp"
#include "mlakit/attention.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/plan.hpp"
#include "mlakit/step.hpp"
#include "timing.hpp"

namespace mlakit::cli {
namespace {

constexpr int64_t kBlockSize = 64;  // vLLM's page size for MLA
// Bytes of KV cache a decode case rotates through (copies of the batch's blocks), so that every
// timed run reads its keys from memory rather than from a cache a smaller case fits in.
constexpr int64_t kRotateBytes = int64_t{256} << 20;

// Values in [-1, 1) from a 32-bit multiplicative hash of the index: fast enough for 256 MiB.
void fill_host(void* data, DType dtype, int64_t count, uint32_t seed) {
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t h = (static_cast<uint32_t>(i) + seed) * 2654435761u;  // Knuth's multiplier
    store_float(data, dtype, i, static_cast<float>(h >> 8) / 8388608.0f - 1.0f);
  }
}

Tensor random_tensor(std::initializer_list<int64_t> shape, DType dtype, Device device,
                     uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype, device);
  if (device.is_cpu()) {
    fill_host(t.view().data, dtype, t.numel(), seed);
    return t;
  }
  std::vector<unsigned char> host(static_cast<size_t>(t.numel() * dtype_size(dtype)));
  fill_host(host.data(), dtype, t.numel(), seed);
  copy_to_device(t, host.data(), static_cast<int64_t>(host.size()));
  return t;
}

template <class T>
Tensor index_tensor(std::span<const T> values, std::initializer_list<int64_t> shape, DType dtype,
                    Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  copy_to_device(t, values.data(), static_cast<int64_t>(values.size_bytes()));
  return t;
}

// Attention FLOPs of one decode query over s_kv keys, all heads: QK^T over L + R, PV over L.
double decode_attention_flops(const MlaDims& d, double keys) {
  return 2.0 * double(d.num_heads) * keys * double(d.entry_dim() + d.kv_lora_rank);
}

// Useful FLOPs of causal prefill attention over s tokens (the masked half is not counted).
double prefill_attention_flops(const MlaDims& d, double s) {
  return 2.0 * double(d.num_heads) * s * (s + 1) / 2 * double(d.qk_head_dim() + d.v_head_dim);
}

BenchResult run_decode(const BenchSetup& st, const BenchCase& c) {
  const MlaDims& d = st.dims;
  const int64_t blocks_per_request = (c.tokens + kBlockSize - 1) / kBlockSize;
  const int64_t kv_bytes = c.batch * c.tokens * d.entry_dim() * dtype_size(st.dtype);
  const int64_t copies = std::max<int64_t>(1, kRotateBytes / std::max<int64_t>(1, kv_bytes));
  KvCacheSpec spec{d, KvCacheDType::kAuto, st.dtype, kBlockSize,
                   copies * c.batch * blocks_per_request};
  const auto shape = spec.cache_shape();
  const Tensor cache = random_tensor({shape[0], shape[1], shape[2]}, st.dtype, st.device, 1);
  std::vector<Tensor> tables;  // copy k reads blocks [k * B * W, (k + 1) * B * W)
  for (int64_t k = 0; k < copies; ++k) {
    std::vector<int32_t> ids(static_cast<size_t>(c.batch * blocks_per_request));
    std::iota(ids.begin(), ids.end(), static_cast<int32_t>(k * c.batch * blocks_per_request));
    tables.push_back(
        index_tensor<int32_t>(ids, {c.batch, blocks_per_request}, DType::kI32, st.device));
  }
  const std::vector<int32_t> lens(static_cast<size_t>(c.batch), static_cast<int32_t>(c.tokens));
  const Tensor seq_lens = index_tensor<int32_t>(lens, {c.batch}, DType::kI32, st.device);
  const Tensor q = random_tensor({c.batch, 1, d.num_heads, d.entry_dim()}, st.dtype, st.device, 2);
  const Tensor out = Tensor::empty({c.batch, 1, d.num_heads, d.kv_lora_rank}, st.dtype, st.device);
  const Tensor lse = Tensor::empty({c.batch, 1, d.num_heads}, DType::kF32, st.device);
  const ops::DecodePlanShape plan_shape{st.device,   c.batch,    1,
                                        d.num_heads, kBlockSize, blocks_per_request * kBlockSize};
  const DecodeSchedule schedule = ops::plan_mla_decode(plan_shape, lens);
  const Tensor workspace = Tensor::empty(
      {std::max<int64_t>(
          1, ops::mla_decode_workspace_elems(schedule, 1, d.num_heads, d.kv_lora_rank))},
      DType::kF32, st.device);
  const ops::DecodeParams params{st.scale, KvCacheDType::kAuto, 1.0f, 1.0f, d.kv_lora_rank};
  int64_t next = 0;
  const double seconds = median_seconds(st.reps, [&] {
    ops::mla_decode(q, cache, tables[size_t(next++ % copies)], seq_lens, out, lse, params, schedule,
                    workspace);
    synchronize(st.device);
  });
  const double bytes = double(kv_bytes) + double(q.numel() + out.numel()) * dtype_size(st.dtype);
  return {c, seconds, decode_attention_flops(d, double(c.batch * c.tokens)), bytes};
}

BenchResult run_prefill(const BenchSetup& st, const BenchCase& c) {
  const MlaDims& d = st.dims;
  const int64_t s = c.tokens;
  const Tensor q = random_tensor({s, d.num_heads, d.qk_head_dim()}, st.dtype, st.device, 1);
  const Tensor k_nope = random_tensor({s, d.num_heads, d.qk_nope_head_dim}, st.dtype, st.device, 2);
  const Tensor k_pe = random_tensor({s, d.qk_rope_head_dim}, st.dtype, st.device, 3);
  const Tensor v = random_tensor({s, d.num_heads, d.v_head_dim}, st.dtype, st.device, 4);
  const Tensor out = Tensor::empty({s, d.num_heads, d.v_head_dim}, st.dtype, st.device);
  const std::vector<int32_t> cu = {0, static_cast<int32_t>(s)};
  const Tensor cu_seqlens = index_tensor<int32_t>(cu, {2}, DType::kI32, st.device);
  const double seconds = median_seconds(st.reps, [&] {
    ops::mla_prefill(q, k_nope, k_pe, v, cu_seqlens, cu_seqlens, s, s, st.scale, true, out,
                     std::nullopt);
    synchronize(st.device);
  });
  const double bytes = double(q.numel() + k_nope.numel() + k_pe.numel() + v.numel() + out.numel()) *
                       dtype_size(st.dtype);
  return {c, seconds, prefill_attention_flops(d, double(s)), bytes};
}

// One layer step through the engine path: decode-only (batch requests, each one new token after
// tokens - 1 cached) or one prefill of `tokens` new tokens. plan_step once, forward timed.
BenchResult run_forward(const BenchSetup& st, const BenchCase& c) {
  const MlaDims& d = st.dims;
  const bool decode = c.kind == BenchKind::kForwardDecode;
  const int64_t new_tokens = decode ? c.batch : c.tokens;  // T
  const int64_t blocks_per_request = (c.tokens + kBlockSize - 1) / kBlockSize;
  MlaAttentionConfig config;
  config.dims = d;
  config.scale = st.scale;
  config.act_dtype = st.dtype;
  config.block_size = kBlockSize;
  config.max_model_len = blocks_per_request * kBlockSize;
  config.max_num_seqs = c.batch;
  config.max_num_batched_tokens = new_tokens;
  config.device = st.device;
  const Tensor kv_b_proj =
      random_tensor({d.num_heads * d.kv_b_out_dim(), d.kv_lora_rank}, st.dtype, Device::cpu(), 5);
  MlaAttention layer(config, kv_b_proj);
  KvCacheSpec spec{d, KvCacheDType::kAuto, st.dtype, kBlockSize, c.batch * blocks_per_request};
  const auto shape = spec.cache_shape();
  const Tensor cache = random_tensor({shape[0], shape[1], shape[2]}, st.dtype, st.device, 1);
  Workspace workspace(config);

  std::vector<int32_t> ids(static_cast<size_t>(c.batch * blocks_per_request));
  std::iota(ids.begin(), ids.end(), 0);
  const Tensor block_table =
      index_tensor<int32_t>(ids, {c.batch, blocks_per_request}, DType::kI32, st.device);
  std::vector<int32_t> query_start_loc(static_cast<size_t>(c.batch + 1));
  std::vector<int64_t> slots(static_cast<size_t>(new_tokens));
  for (int64_t r = 0; r <= c.batch; ++r) {
    query_start_loc[size_t(r)] = static_cast<int32_t>(decode ? r : r * c.tokens);
  }
  for (int64_t t = 0; t < new_tokens; ++t) {  // decode: the last position of request t
    slots[size_t(t)] = decode ? t * blocks_per_request * kBlockSize + c.tokens - 1 : t;
  }
  const std::vector<int32_t> seq_lens(static_cast<size_t>(c.batch), static_cast<int32_t>(c.tokens));
  const Tensor slot_mapping = index_tensor<int64_t>(slots, {new_tokens}, DType::kI64, st.device);
  ForwardBatch batch;
  batch.query_start_loc = query_start_loc;
  batch.seq_lens = seq_lens;
  batch.num_actual_tokens = new_tokens;
  batch.block_table = block_table;
  batch.slot_mapping = slot_mapping;
  const StepPlan plan = plan_step(config, batch, workspace);

  const Tensor q =
      random_tensor({new_tokens, d.num_heads, d.qk_head_dim()}, st.dtype, st.device, 2);
  const Tensor kv = random_tensor({new_tokens, d.entry_dim()}, st.dtype, st.device, 3);
  const TensorView kv_c = kv.view().narrow(1, 0, d.kv_lora_rank);
  const TensorView k_pe = kv.view().narrow(1, d.kv_lora_rank, d.qk_rope_head_dim);
  const Tensor out = Tensor::empty({new_tokens, d.num_heads * d.v_head_dim}, st.dtype, st.device);
  const double seconds = median_seconds(st.reps, [&] {
    layer.forward(q, kv_c, k_pe, cache, plan, out);
    synchronize(st.device);
  });

  const double size = dtype_size(st.dtype);
  const double activations = double(q.numel() + kv.numel() + out.numel()) * size;
  if (decode) {
    // Absorbed decode: q_nope W_UK (P -> L) and o_lat W_UV (L -> V) per head, around attention.
    const double absorbed =
        double(d.num_heads) * double(d.qk_nope_head_dim + d.v_head_dim) * double(d.kv_lora_rank);
    const double flops =
        decode_attention_flops(d, double(c.batch * c.tokens)) + 2.0 * double(c.batch) * absorbed;
    const double bytes =
        double(c.batch * c.tokens * d.entry_dim()) * size + absorbed * size + activations;
    return {c, seconds, flops, bytes};
  }
  // Prefill: kv_b_proj up-projection (L -> N (P + V)) of every token, then causal attention.
  const double weight = double(d.num_heads * d.kv_b_out_dim() * d.kv_lora_rank);
  const double flops =
      2.0 * double(c.tokens) * weight + prefill_attention_flops(d, double(c.tokens));
  const double bytes =
      weight * size + activations + 2.0 * double(c.tokens * d.num_heads * d.kv_b_out_dim()) * size;
  return {c, seconds, flops, bytes};
}

}  // namespace

const char* bench_kind_name(BenchKind kind) {
  switch (kind) {
    case BenchKind::kDecode:
      return "decode";
    case BenchKind::kPrefill:
      return "prefill";
    case BenchKind::kForwardDecode:
    case BenchKind::kForwardPrefill:
      return "forward";
  }
  return "?";
}

std::string BenchCase::label() const {
  switch (kind) {
    case BenchKind::kDecode:
      return "B=" + std::to_string(batch) + " s_kv=" + std::to_string(tokens);
    case BenchKind::kPrefill:
      return "S=" + std::to_string(tokens) + " causal";
    case BenchKind::kForwardDecode:
      return "decode step B=" + std::to_string(batch) + " s_kv=" + std::to_string(tokens);
    case BenchKind::kForwardPrefill:
      return "prefill step S=" + std::to_string(tokens);
  }
  return "?";
}

std::vector<BenchCase> bench_grid(Device device, bool quick) {
  std::vector<int64_t> decode_batches, decode_lens, prefill_lens, step_batches, step_prompts;
  int64_t step_len = 0;
  if (device.is_cuda()) {  // serving sizes of an H100/H200 (deepseek-v3, 128 heads)
    decode_batches = quick ? std::vector<int64_t>{1, 64} : std::vector<int64_t>{1, 16, 64, 128};
    decode_lens = quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{1024, 4096, 16384};
    prefill_lens = quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{1024, 4096, 16384};
    step_batches = quick ? std::vector<int64_t>{64} : std::vector<int64_t>{16, 128};
    step_len = 4096;
    step_prompts = quick ? std::vector<int64_t>{2048} : std::vector<int64_t>{2048, 8192};
  } else {  // 2 to 64 cores (deepseek-v2-lite, 16 heads)
    decode_batches = quick ? std::vector<int64_t>{1, 8} : std::vector<int64_t>{1, 8, 32};
    decode_lens = quick ? std::vector<int64_t>{1024, 4096} : std::vector<int64_t>{1024, 4096};
    prefill_lens = quick ? std::vector<int64_t>{256, 1024} : std::vector<int64_t>{512, 1024, 2048};
    step_batches = quick ? std::vector<int64_t>{8} : std::vector<int64_t>{8, 32};
    step_len = quick ? 1024 : 2048;
    step_prompts = quick ? std::vector<int64_t>{512} : std::vector<int64_t>{512, 2048};
  }
  std::vector<BenchCase> grid;
  for (int64_t b : decode_batches) {
    for (int64_t s : decode_lens) grid.push_back({BenchKind::kDecode, b, s});
  }
  for (int64_t s : prefill_lens) grid.push_back({BenchKind::kPrefill, 1, s});
  for (int64_t b : step_batches) grid.push_back({BenchKind::kForwardDecode, b, step_len});
  for (int64_t s : step_prompts) grid.push_back({BenchKind::kForwardPrefill, 1, s});
  return grid;
}

BenchResult run_bench_case(const BenchSetup& setup, const BenchCase& bench_case) {
  switch (bench_case.kind) {
    case BenchKind::kDecode:
      return run_decode(setup, bench_case);
    case BenchKind::kPrefill:
      return run_prefill(setup, bench_case);
    default:
      return run_forward(setup, bench_case);
  }
}

}  // namespace mlakit::cli
