#include "common/mla_harness.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <string>

#include "common/test_util.hpp"
#include "core/device_memory.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"
#include "reference/reference.hpp"

namespace mlakit::test {

namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::vector<double> random_values(std::mt19937_64& rng, int64_t n, double stddev, DType dtype) {
  std::normal_distribution<double> dist(0.0, stddev);
  std::vector<double> v(n);
  for (double& x : v) x = round_to_dtype(static_cast<float>(dist(rng)), dtype);
  return v;
}

// The value the cache returns for one stored element (spec A.2), computed independently of the
// cache kernels: fp8 = e4m3(x / k_scale) * k_scale; ds_mla = e4m3(x / tile_scale) * tile_scale.
void dequantize_like_cache(KvCacheDType kv, float k_scale, int64_t l, std::vector<double>& kv_c,
                           int64_t tokens, std::vector<double>& k_pe, int64_t r) {
  if (kv == KvCacheDType::kAuto) return;
  for (int64_t t = 0; t < tokens; ++t) {
    double* row = &kv_c[t * l];
    if (kv == KvCacheDType::kFp8E4m3) {
      for (int64_t j = 0; j < l; ++j)
        row[j] = double(e4m3_bits_to_float(float_to_e4m3_bits(float(row[j]) / k_scale))) * k_scale;
      for (int64_t j = 0; j < r; ++j) {
        double& x = k_pe[t * r + j];
        x = double(e4m3_bits_to_float(float_to_e4m3_bits(float(x) / k_scale))) * k_scale;
      }
      continue;
    }
    for (int64_t tile = 0; tile < l / kDsMlaTileSize; ++tile) {
      float amax = 0;
      for (int64_t j = 0; j < kDsMlaTileSize; ++j)
        amax = std::max(amax, std::fabs(float(row[tile * kDsMlaTileSize + j])));
      const float scale = std::max(amax / kFp8E4m3Max, FLT_MIN);
      for (int64_t j = 0; j < kDsMlaTileSize; ++j) {
        double& x = row[tile * kDsMlaTileSize + j];
        x = double(e4m3_bits_to_float(float_to_e4m3_bits(float(x) / scale))) * scale;
      }
    }
  }
}

// The host tensor itself on the CPU, else a copy on `device`.
Tensor on_device(const Tensor& host, Device device) {
  if (device.is_cpu()) return host;
  const TensorView& h = host.view();
  Tensor d = Tensor::empty(std::span<const int64_t>(h.shape, h.ndim), h.dtype, device);
  ops::copy(h, d);
  return d;
}

// A host copy of a tensor on any device.
Tensor on_host(const Tensor& t) {
  if (t.view().device.is_cpu()) return t;
  const TensorView& v = t.view();
  Tensor h = Tensor::empty(std::span<const int64_t>(v.shape, v.ndim), v.dtype);
  ops::copy(v, h);
  detail::device_synchronize(v.device);
  return h;
}

Tolerance tolerance_for_case(const E2eCase& c) {
  Tolerance t = tolerance_for(c.act_dtype);
  // Intermediates (k_nope, v, the absorbed q) are rounded to the activation dtype once more
  // than the inputs: allow twice the single-rounding bound.
  t.atol *= 2;
  t.rtol *= 2;
  return t;
}

// D.1's decode-path reference for fp8_e4m3 caches: the decode query is itself quantized (spec
// A.6), which the non-absorbed oracle cannot express, so these rows are checked against the
// absorbed form computed in fp64 with the query quantized as the library does: ql = q_nope W_UK
// rounded to the activation dtype, then e4m3(x * (1 / q_scale)) * q_scale (q_pe too); latent MQA
// over the cache values; out = o_lat W_UV. Returns [q_len, N, V].
std::vector<double> fp8_decode_reference(const E2eCase& c, const std::vector<double>& w,
                                         const std::vector<double>& q,
                                         const std::vector<double>& kv_seen,
                                         const std::vector<double>& pe_seen, int64_t q_len,
                                         int64_t keys, double scale) {
  const MlaDims& d = c.dims;
  const int64_t n = d.num_heads, l = d.kv_lora_rank, r = d.qk_rope_head_dim, p = d.qk_nope_head_dim,
                v = d.v_head_dim, dqk = d.qk_head_dim(), e = l + r;
  const float inv_q_scale = 1.0f / c.q_scale;
  auto quantize = [&](double x) {
    const float rounded = round_to_dtype(static_cast<float>(x), c.act_dtype);
    return double(e4m3_bits_to_float(float_to_e4m3_bits(rounded * inv_q_scale))) * c.q_scale;
  };
  std::vector<double> q_abs(q_len * n * e), k(keys * e), o(q_len * n * v, 0.0);
  for (int64_t t = 0; t < q_len; ++t) {
    for (int64_t h = 0; h < n; ++h) {
      const double* qh = &q[(t * n + h) * dqk];
      double* qa = &q_abs[(t * n + h) * e];
      for (int64_t i = 0; i < l; ++i) {
        double acc = 0;
        for (int64_t j = 0; j < p; ++j) acc += qh[j] * w[(h * (p + v) + j) * l + i];
        qa[i] = quantize(acc);
      }
      for (int64_t i = 0; i < r; ++i) qa[l + i] = quantize(qh[p + i]);
    }
  }
  for (int64_t s = 0; s < keys; ++s) {
    std::copy_n(&kv_seen[s * l], l, &k[s * e]);
    std::copy_n(&pe_seen[s * r], r, &k[s * e + l]);
  }
  const ref::AttentionResult lat =
      ref::attention(q_abs, k, kv_seen, q_len, keys, n, /*kv_heads=*/1, e, l, scale, true);
  for (int64_t t = 0; t < q_len; ++t)
    for (int64_t h = 0; h < n; ++h)
      for (int64_t j = 0; j < v; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < l; ++i)
          acc += lat.out[(t * n + h) * l + i] * w[(h * (p + v) + p + j) * l + i];
        o[(t * n + h) * v + j] = acc;
      }
  return o;
}

}  // namespace

namespace {

// One layer of a case: its weights, cache, activations and output (the batch structure, i.e.
// lengths, block table and slots, is shared by every layer of the step, as in an engine).
struct LayerData {
  std::vector<double> w;                                         // [N * (P + V), L]
  std::vector<std::vector<double>> kv_c_full, k_pe_full, q_req;  // per request
  Tensor cache, q, kv_lora, output;                              // host copies
  Tensor cache_d, q_d, kv_lora_d, output_d;                      // on the case's device
  std::unique_ptr<MlaAttention> attn;
};

}  // namespace

E2eCase random_case(std::mt19937_64& rng, int iter, int max_context, int max_query,
                    int64_t chunk_blocks) {
  std::uniform_int_distribution<int> n_req(1, 6), ctx_len(0, max_context), q_len(1, max_query),
      coin(0, 1);
  E2eCase c;
  c.name = "random_" + std::to_string(iter);
  c.dims = MlaDims{4, 64, 16, 32, 32};  // small dims: the fp64 oracle stays cheap
  c.act_dtype = coin(rng) ? DType::kF32 : DType::kBF16;
  c.kv_dtype = coin(rng) ? KvCacheDType::kAuto : KvCacheDType::kFp8E4m3;
  c.block_size = std::vector<int64_t>{1, 4, 16, 32}[iter % 4];
  c.chunk_policy = coin(rng) ? ChunkPolicy::kPacked : ChunkPolicy::kEqualShare;
  c.workspace_tokens = coin(rng) ? 0 : c.block_size * chunk_blocks;
  const int reqs = n_req(rng);
  const int decodes = std::uniform_int_distribution<int>(0, reqs)(rng);
  for (int i = 0; i < reqs; ++i) {
    const bool decode = i < decodes;
    const int ql = decode ? 1 : q_len(rng);
    const int ctx = decode ? 1 + ctx_len(rng) : (coin(rng) ? 0 : ctx_len(rng));
    c.seq_lens.push_back(ctx + ql);
    c.query_lens.push_back(ql);
  }
  return c;
}

E2eResult run_e2e_case(const E2eCase& c) {
  E2eResult result;
  std::mt19937_64 rng = make_rng(c.seed_stream);
  const MlaDims& d = c.dims;
  const int64_t n = d.num_heads, l = d.kv_lora_rank, r = d.qk_rope_head_dim, p = d.qk_nope_head_dim,
                v = d.v_head_dim, dqk = d.qk_head_dim();
  const int64_t real_reqs = static_cast<int64_t>(c.seq_lens.size());
  const int64_t all_reqs = real_reqs + c.padding_requests;
  const int64_t bs = c.block_size;
  const double scale = 1.0 / std::sqrt(double(dqk)) * 1.25;  // a model-like, non-default scale
  EXPECT_TRUE(c.step_plan || c.num_layers == 1) << c.name << ": layers share a step plan";
  // A group of one rank is no DCP (MlaAttention ignores the communicator then).
  const bool dcp = c.dcp_comm != nullptr && c.head_ranks > 1;
  const int64_t ranks = c.head_ranks, interleave = dcp ? c.dcp_interleave : 1;
  if (c.dcp_comm != nullptr) {
    EXPECT_EQ(c.dcp_comm->world_size(), ranks) << c.name << ": head_ranks is the DCP group size";
    EXPECT_EQ(c.dcp_comm->rank(), c.head_rank) << c.name << ": head_rank is the DCP rank";
  }
  // Placement under DCP (spec A.3), written out here rather than taken from the library: position
  // pos of a request is held by rank (pos / I) % W, at local position (pos / (W I)) I + pos % I.
  auto held_here = [&](int64_t pos) { return !dcp || (pos / interleave) % ranks == c.head_rank; };
  auto local_position = [&](int64_t pos) {
    return dcp ? pos / (ranks * interleave) * interleave + pos % interleave : pos;
  };

  int32_t max_seq = 1;
  for (int32_t s : c.seq_lens) max_seq = std::max(max_seq, s);
  int64_t real_tokens = 0;
  std::vector<int32_t> qsl{0};
  for (int64_t q = 0; q < real_reqs; ++q) qsl.push_back(qsl.back() + c.query_lens[q]);
  real_tokens = qsl.back();
  for (int64_t q = 0; q < c.padding_requests; ++q) qsl.push_back(qsl.back());
  const int64_t tokens = real_tokens + c.padding_tokens;
  const int64_t rows = tokens + c.spare_rows;
  std::vector<int32_t> seq_lens_all = c.seq_lens;
  seq_lens_all.resize(all_reqs, 0);
  std::vector<int64_t> held(real_reqs, 0);  // tokens of each request in this layer's cache
  for (int64_t q = 0; q < real_reqs; ++q)
    for (int64_t pos = 0; pos < c.seq_lens[q]; ++pos) held[q] += held_here(pos) ? 1 : 0;

  MlaAttentionConfig cfg;
  cfg.dims = d;
  cfg.scale = static_cast<float>(scale);
  cfg.act_dtype = c.act_dtype;
  cfg.kv_cache_dtype = c.kv_dtype;
  cfg.block_size = bs;
  cfg.decode_threshold = c.decode_threshold;
  cfg.query_len_support = c.support;
  cfg.workspace_tokens = c.workspace_tokens;
  cfg.max_model_len = max_seq;
  cfg.max_num_seqs = std::max<int64_t>(all_reqs, 1);
  cfg.max_num_batched_tokens = std::max<int64_t>(tokens, 1);
  cfg.chunk_policy = c.chunk_policy;
  cfg.batch_invariant = c.batch_invariant;
  cfg.device = c.device;
  if (dcp) cfg.dcp = DcpConfig{.world_size = ranks, .rank = c.head_rank, .interleave = interleave};

  // Paged cache layout shared by the layers: block 0 is a null block, blocks are handed out in a
  // random order, and every byte starts as NaN so that a read of an unwritten slot shows. Under
  // DCP the layer's cache and block table hold only its own tokens, at their local positions.
  int64_t blocks_needed = 0;
  for (int64_t h : held) blocks_needed += cdiv(h, bs);
  const int64_t num_blocks = blocks_needed + 1 + 3;  // + null block + spares never used
  KvCacheSpec spec{d, c.kv_dtype, c.act_dtype, bs, num_blocks};
  const auto cache_shape = spec.cache_shape();
  std::vector<int32_t> ids(num_blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  // Ranks of a head group draw their block orders apart (their caches differ), the model alike.
  std::mt19937_64 rank_rng = make_rng(c.seed_stream * 1009 + 1 + c.head_rank);
  std::shuffle(ids.begin(), ids.end(), ranks > 1 ? rank_rng : rng);
  int64_t width = 1;
  for (int64_t h : held) width = std::max(width, cdiv(h, bs));
  width += 1;  // an extra column that no valid read may touch
  Tensor block_table = Tensor::empty({all_reqs, width}, DType::kI32);
  std::fill_n(block_table.data<int32_t>(), all_reqs * width, -1);
  int64_t next_id = 0;
  for (int64_t q = 0; q < real_reqs; ++q)
    for (int64_t b = 0; b < cdiv(held[q], bs); ++b)
      block_table.data<int32_t>()[q * width + b] = ids[next_id++];
  // The slot of a position held here (DESIGN.md: slot = block * block_size + offset).
  auto slot_of = [&](int64_t req, int64_t pos) -> int64_t {
    const int64_t local = local_position(pos);
    return int64_t{block_table.data<int32_t>()[req * width + local / bs]} * bs + local % bs;
  };
  Tensor slot_t = Tensor::empty({tokens}, DType::kI64);
  std::fill_n(slot_t.data<int64_t>(), tokens, -1);
  for (int64_t q = 0; q < real_reqs; ++q) {
    const int64_t ctx = c.seq_lens[q] - c.query_lens[q];
    for (int64_t j = 0; j < c.query_lens[q] && !dcp; ++j)
      slot_t.data<int64_t>()[qsl[q] + j] = slot_of(q, ctx + j);
  }
  const Tensor block_table_d = on_device(block_table, c.device),
               slot_d = on_device(slot_t, c.device);

  std::vector<LayerData> layers(static_cast<size_t>(c.num_layers));
  for (LayerData& layer : layers) {
    // Weights, 1/sqrt(L) so that outputs are O(1) (spec D.1); this layer's rows of the model's.
    const std::vector<double> model_w =
        random_values(rng, ranks * n * (p + v) * l, 1.0 / std::sqrt(double(l)), c.act_dtype);
    layer.w.assign(model_w.begin() + c.head_rank * n * (p + v) * l,
                   model_w.begin() + (c.head_rank + 1) * n * (p + v) * l);
    layer.attn = std::make_unique<MlaAttention>(
        cfg, tensor_from(layer.w, {n * (p + v), l}, c.act_dtype), std::nullopt, c.dcp_comm);
    layer.cache =
        Tensor::empty(std::span<const int64_t>(cache_shape.data(), 3), spec.storage_dtype());
    fill_nan(layer.cache);
    layer.kv_c_full.resize(real_reqs);
    layer.k_pe_full.resize(real_reqs);
    layer.q_req.resize(real_reqs);
    for (int64_t q = 0; q < real_reqs; ++q) {
      layer.kv_c_full[q] = random_values(rng, c.seq_lens[q] * l, 1.0, c.act_dtype);
      layer.k_pe_full[q] = random_values(rng, c.seq_lens[q] * r, 1.0, c.act_dtype);
      // This layer's query heads of the model's [q_len, head_ranks * N, P + R].
      const std::vector<double> model_q =
          random_values(rng, c.query_lens[q] * ranks * n * dqk, 1.0, c.act_dtype);
      for (int64_t j = 0; j < c.query_lens[q]; ++j) {
        const auto first = model_q.begin() + (j * ranks + c.head_rank) * n * dqk;
        layer.q_req[q].insert(layer.q_req[q].end(), first, first + n * dqk);
      }
    }

    // Context tokens go into the cache through the library's cache writer.
    std::vector<double> ctx_kv, ctx_pe;
    std::vector<int64_t> slots;
    for (int64_t q = 0; q < real_reqs; ++q) {
      const int64_t ctx = c.seq_lens[q] - c.query_lens[q];
      for (int64_t pos = 0; pos < ctx; ++pos) {
        if (!held_here(pos)) continue;
        const auto kv_row = layer.kv_c_full[q].begin() + pos * l;
        const auto pe_row = layer.k_pe_full[q].begin() + pos * r;
        ctx_kv.insert(ctx_kv.end(), kv_row, kv_row + l);
        ctx_pe.insert(ctx_pe.end(), pe_row, pe_row + r);
        slots.push_back(slot_of(q, pos));
      }
    }
    const int64_t ctx_tokens = static_cast<int64_t>(slots.size());
    if (ctx_tokens > 0) {
      ops::concat_and_cache_mla(tensor_from(ctx_kv, {ctx_tokens, l}, c.act_dtype),
                                tensor_from(ctx_pe, {ctx_tokens, r}, c.act_dtype), layer.cache,
                                int_tensor(slots, {ctx_tokens}, DType::kI64), c.kv_dtype,
                                c.k_scale);
    }

    // Step inputs. kv_c and k_pe are slices of one [rows, L + R] buffer (as in a model, where they
    // come out of one projection), so kv_c has row stride L + R.
    layer.q = nan_tensor({rows, n, dqk}, c.act_dtype);
    layer.kv_lora = nan_tensor({rows, l + r}, c.act_dtype);
    for (int64_t q = 0; q < real_reqs; ++q) {
      const int64_t ctx = c.seq_lens[q] - c.query_lens[q];
      for (int64_t j = 0; j < c.query_lens[q]; ++j) {
        const int64_t row = qsl[q] + j, pos = ctx + j;
        for (int64_t k = 0; k < n * dqk; ++k)
          store_float(layer.q.view().data, c.act_dtype, row * n * dqk + k,
                      float(layer.q_req[q][j * n * dqk + k]));
        for (int64_t k = 0; k < l; ++k)
          store_float(layer.kv_lora.view().data, c.act_dtype, row * (l + r) + k,
                      float(layer.kv_c_full[q][pos * l + k]));
        for (int64_t k = 0; k < r; ++k)
          store_float(layer.kv_lora.view().data, c.act_dtype, row * (l + r) + l + k,
                      float(layer.k_pe_full[q][pos * r + k]));
      }
    }
    for (int64_t row = real_tokens; row < tokens; ++row) {  // padding tokens: finite garbage
      for (int64_t k = 0; k < n * dqk; ++k)
        store_float(layer.q.view().data, c.act_dtype, row * n * dqk + k, 0.5f);
      for (int64_t k = 0; k < l + r; ++k)
        store_float(layer.kv_lora.view().data, c.act_dtype, row * (l + r) + k, 0.5f);
    }
    layer.output = nan_tensor({rows, n * v}, c.act_dtype);
    layer.cache_d = on_device(layer.cache, c.device);
    layer.q_d = on_device(layer.q, c.device);
    layer.kv_lora_d = on_device(layer.kv_lora, c.device);
    layer.output_d = on_device(layer.output, c.device);
  }

  ForwardBatch batch;
  batch.query_start_loc = qsl;
  batch.seq_lens = seq_lens_all;
  batch.num_actual_tokens = tokens;
  batch.block_table = block_table_d;
  if (!dcp) batch.slot_mapping = slot_d;  // DCP: plan_step derives this rank's slots
  const Plan plan = layers[0].attn->plan(batch);
  result.num_decodes = plan.split.num_decodes;
  result.num_prefills = plan.split.num_prefills;
  result.context_chunks = static_cast<int64_t>(plan.context_chunks.size());
  const ForwardScales scales{c.q_scale, c.k_scale};
  auto run_layer = [&](LayerData& layer, auto&& step_or_batch, const Tensor& output) {
    layer.attn->forward(layer.q_d, layer.kv_lora_d.view().narrow(1, 0, l),
                        layer.kv_lora_d.view().narrow(1, l, r), layer.cache_d, step_or_batch,
                        output, scales);
  };
  if (c.step_plan) {
    Workspace workspace(cfg);
    const StepPlan step = plan_step(cfg, batch, workspace);
    EXPECT_LE(step.workspace_bytes_used(), workspace.bytes()) << c.name;
    for (LayerData& layer : layers) run_layer(layer, step, layer.output_d);
    // The single-call form plans the same way: the same bits (its cache write rewrites the same
    // values).
    const Tensor again = on_device(nan_tensor({rows, n * v}, c.act_dtype), c.device);
    run_layer(layers[0], &batch, again);
    EXPECT_TRUE(all_close(on_host(again), to_doubles(on_host(layers[0].output_d)), {0, 0}))
        << c.name << ": step plan and single call differ";
  } else {
    run_layer(layers[0], &batch, layers[0].output_d);
  }
  for (LayerData& layer : layers) {
    if (!c.device.is_cpu()) ops::copy(layer.output_d, layer.output);
  }
  if (!c.device.is_cpu()) detail::device_synchronize(c.device);

  // The oracle, per layer and request, on the values the library sees.
  for (size_t li = 0; li < layers.size(); ++li) {
    const LayerData& layer = layers[li];
    const std::string where = c.name + (layers.size() > 1 ? ", layer " + std::to_string(li) : "");
    ref::MlaWeights weights{n, l, p, r, v, layer.w};
    for (int64_t q = 0; q < real_reqs && c.check_oracle; ++q) {
      const int64_t s = c.seq_lens[q], ql = c.query_lens[q], ctx = s - ql;
      if (ql == 0) continue;
      const bool decode = q < plan.split.num_decodes;
      std::vector<double> kv_seen = layer.kv_c_full[q], pe_seen = layer.k_pe_full[q];
      // Decodes read every key from the cache; prefills read the context from the cache and
      // attend to their new tokens unquantized (spec F-24).
      dequantize_like_cache(c.kv_dtype, c.k_scale, l, kv_seen, decode ? s : ctx, pe_seen, r);
      const ref::AttentionResult expected =
          ref::mla_mha(weights, layer.q_req[q], kv_seen, pe_seen, ql, s, scale);
      const TensorView out_rows = layer.output.view().narrow(0, qsl[q], ql);
      Tolerance tol = tolerance_for_case(c);
      std::vector<double> expected_out = expected.out;
      if (c.kv_dtype == KvCacheDType::kFp8E4m3 && decode) {
        expected_out =
            fp8_decode_reference(c, layer.w, layer.q_req[q], kv_seen, pe_seen, ql, s, scale);
        // fp64 and the library's f32 GEMM can round ql to the two sides of an e4m3 rounding
        // boundary; one such flip moves an O(1) output by ~1e-2 at most.
        tol.atol = std::max(tol.atol, 2e-2);
        tol.rtol = std::max(tol.rtol, 2e-2);
      }
      const auto check = all_close(out_rows, expected_out, tol);
      EXPECT_TRUE(check) << where << ": request " << q << " (" << (decode ? "decode" : "prefill")
                         << ", seq_len " << s << ", q_len " << ql << ")";
      const std::vector<double> got = to_doubles(out_rows);
      for (size_t i = 0; i < got.size(); ++i)
        result.max_abs_error = std::max(result.max_abs_error, std::fabs(got[i] - expected_out[i]));
    }
    if (tokens > real_tokens) {  // padding tokens attend to nothing: zeros
      const std::vector<double> zeros((tokens - real_tokens) * n * v, 0.0);
      EXPECT_TRUE(all_close(layer.output.view().narrow(0, real_tokens, tokens - real_tokens), zeros,
                            {0, 0}))
          << where << ": padding rows";
    }
    const std::vector<double> nans(c.spare_rows * n * v, NAN);
    EXPECT_TRUE(all_close(layer.output.view().narrow(0, tokens, c.spare_rows), nans, {0, 0}))
        << where << ": rows past num_actual_tokens must stay untouched";
  }
  result.output = layers[0].output;
  if (std::getenv("MLAKIT_E2E_VERBOSE"))
    std::cerr << c.name << ": max |error| " << result.max_abs_error << "\n";
  return result;
}

}  // namespace mlakit::test
