#include "simulation.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include "decode_graphs.hpp"
#include "device_io.hpp"
#include "mlakit/attention.hpp"
#include "mlakit/kv_cache.hpp"
#include "progress.hpp"
#include "random_rows.hpp"
#include "step_batch.hpp"
#include "work_model.hpp"

namespace mlakit::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Seeds of the independent random streams derived from --seed (odd constants keep them apart).
constexpr uint64_t kActivationStream = 0x9e3779b97f4a7c15ull;
constexpr uint64_t kWeightStream = 0xc2b2ae3d27d4eb4full;
// Under DCP each rank has its own heads: their weights and queries come from streams of the rank.
constexpr uint64_t kRankStream = 0x165667b19e3779f9ull;

struct Layer {
  std::unique_ptr<MlaAttention> attention;
  Tensor kv_cache;  // [num_blocks, block_size, entry_width] on the run's device
};

// Per-step inputs: host staging buffers and, for a CUDA run, their device twins. Sized for the
// largest step (token budget, max_num_seqs requests, the longest request's blocks).
struct StepBuffers {
  Tensor q_host;    // [T_max, N, P + R]
  Tensor kv_host;   // [T_max, L + R]: kv_c = columns [0, L), k_pe = [L, L + R) (row stride L+R)
  Tensor out_host;  // [T_max, N * V] (CUDA runs: the output copied back for verification)
  Tensor q_dev, kv_dev, out_dev;
  Tensor graph_out_dev;     // [layers, R_max, N * V]: each layer's output in graph steps
  Tensor block_table_dev;   // i32 [R_max * W_max] (CUDA runs)
  Tensor slot_mapping_dev;  // i64 [T_max] (CUDA runs)
};

StepBuffers make_buffers(const RunConfig& c, int64_t max_blocks_per_request) {
  const MlaDims& d = c.dims;
  const int64_t t_max = c.scheduler.max_num_batched_tokens;
  StepBuffers b;
  b.q_host = Tensor::empty({t_max, d.num_heads, d.qk_head_dim()}, c.dtype);
  b.kv_host = Tensor::empty({t_max, d.entry_dim()}, c.dtype);
  b.out_host = Tensor::empty({t_max, d.num_heads * d.v_head_dim}, c.dtype);
  if (c.device.is_cpu()) {
    b.q_dev = b.q_host;
    b.kv_dev = b.kv_host;
    b.out_dev = b.out_host;
    return b;
  }
  b.q_dev = Tensor::empty({t_max, d.num_heads, d.qk_head_dim()}, c.dtype, c.device);
  b.kv_dev = Tensor::empty({t_max, d.entry_dim()}, c.dtype, c.device);
  b.out_dev = Tensor::empty({t_max, d.num_heads * d.v_head_dim}, c.dtype, c.device);
  b.block_table_dev =
      Tensor::empty({c.scheduler.max_num_seqs * max_blocks_per_request}, DType::kI32, c.device);
  if (c.cuda_graphs) {
    b.graph_out_dev = Tensor::empty(
        {c.num_layers, c.scheduler.max_num_seqs, d.num_heads * d.v_head_dim}, c.dtype, c.device);
  }
  b.slot_mapping_dev = Tensor::empty({t_max}, DType::kI64, c.device);
  return b;
}

TensorView kv_c_of(const TensorView& kv, int64_t l) { return kv.narrow(1, 0, l); }
TensorView k_pe_of(const TensorView& kv, int64_t l, int64_t r) { return kv.narrow(1, l, r); }

// The ForwardBatch of a step: host arrays as they are, index tensors on the run's device.
// Under DCP the batch has no slot_mapping: the library derives this rank's slots.
ForwardBatch to_forward_batch(const sim::StepBatch& batch, const StepBuffers& buf, Device device) {
  const int64_t t = batch.num_tokens(), num_reqs = batch.num_reqs();
  const int64_t width = batch.block_table_width;
  ForwardBatch fb;
  fb.query_start_loc = batch.query_start_loc;
  fb.seq_lens = batch.seq_lens;
  fb.num_actual_tokens = t;
  if (device.is_cpu()) {
    fb.block_table = TensorView::contiguous(const_cast<int32_t*>(batch.block_table.data()),
                                            DType::kI32, {num_reqs, width});
    if (!batch.slot_mapping.empty()) {
      fb.slot_mapping =
          TensorView::contiguous(const_cast<int64_t*>(batch.slot_mapping.data()), DType::kI64, {t});
    }
    return fb;
  }
  copy_to_device(buf.block_table_dev, batch.block_table.data(),
                 num_reqs * width * static_cast<int64_t>(sizeof(int32_t)));
  copy_to_device(buf.slot_mapping_dev, batch.slot_mapping.data(),
                 t * static_cast<int64_t>(sizeof(int64_t)));
  fb.block_table =
      buf.block_table_dev.view().narrow(0, 0, num_reqs * width).reshape({num_reqs, width});
  fb.slot_mapping = buf.slot_mapping_dev.view().narrow(0, 0, t);
  return fb;
}

}  // namespace

MlaAttentionConfig layer_config(const RunConfig& c, int64_t max_model_len) {
  MlaAttentionConfig config;
  config.dims = c.dims;
  config.scale = c.scale;
  config.act_dtype = c.dtype;
  config.kv_cache_dtype = c.kv_cache_dtype;
  config.block_size = c.scheduler.block_size;
  config.workspace_tokens = c.workspace_tokens;
  config.max_model_len = max_model_len;
  config.max_num_seqs = c.scheduler.max_num_seqs;
  config.max_num_batched_tokens = c.scheduler.max_num_batched_tokens;
  config.device = c.device;
  config.dcp = c.dcp;
  return config;
}

RunResult run_simulation(const RunConfig& c) {
  const auto setup_start = Clock::now();
  RunResult result;
  sim::Scheduler scheduler(sim::make_workload(c.workload), c.scheduler);
  result.num_requests = static_cast<int64_t>(scheduler.requests().size());
  int64_t max_model_len = 0, total_tokens = 0;
  for (const sim::Request& r : scheduler.requests()) {
    max_model_len = std::max(max_model_len, r.total_len());
    total_tokens += r.total_len();
  }
  const int64_t max_blocks_per_request = sim::blocks_for(max_model_len, c.scheduler.block_size);

  const MlaDims& d = c.dims;
  const KvCacheSpec spec{d, c.kv_cache_dtype, c.dtype, c.scheduler.block_size,
                         c.scheduler.num_blocks};
  spec.validate();
  result.cache_bytes_per_layer = spec.num_blocks * spec.block_size * spec.entry_bytes();
  const ForwardScales scales{};  // q_scale = k_scale = 1 (checkpoints without calibrated scales)
  // Under DCP the oracle's mirror holds every token, in virtual blocks of the global view.
  const bool dcp = c.dcp.enabled();
  KvCacheSpec mirror_spec = spec;
  if (dcp) mirror_spec.num_blocks = result.num_requests * max_blocks_per_request;
  Verifier verifier(c.verify, mirror_spec, c.scale, scales.k_scale, c.num_layers);
  const uint64_t rank_stream = dcp ? kRankStream * static_cast<uint64_t>(c.dcp.rank + 1) : 0;

  const MlaAttentionConfig attention_config = layer_config(c, max_model_len);

  std::vector<Layer> layers(c.num_layers);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    // kv_b_proj ~ N(0, 1/L): up-projected k_nope and v keep unit variance.
    const Tensor weight = random_matrix(d.num_heads * d.kv_b_out_dim(), d.kv_lora_rank, c.dtype,
                                        1.0 / std::sqrt(static_cast<double>(d.kv_lora_rank)),
                                        c.workload.seed ^ (kWeightStream + i) ^ rank_stream);
    layers[i].kv_cache = Tensor::empty(spec.cache_shape(), spec.storage_dtype(), c.device);
    layers[i].attention =
        std::make_unique<MlaAttention>(attention_config, weight, std::nullopt, c.dcp_communicator);
    verifier.set_layer_weight(i, weight);
  }
  StepBuffers buf = make_buffers(c, max_blocks_per_request);
  RandomRows activations(c.dtype, /*stddev=*/1.0, c.workload.seed ^ kActivationStream);
  // Under DCP the latent (kv) rows are the same on every rank, the queries the rank's own.
  RandomRows rank_queries(c.dtype, /*stddev=*/1.0,
                          c.workload.seed ^ kActivationStream ^ rank_stream);
  const RunStream run_stream(c.device);
  const Stream stream = run_stream.get();
  // One workspace for every layer, sized for the scheduler's limits; the profile run commits it.
  Workspace workspace(attention_config);
  workspace.touch(stream);
  result.workspace_bytes = workspace.bytes();
  std::unique_ptr<DecodeGraphs> graphs;
  if (c.cuda_graphs) graphs = std::make_unique<DecodeGraphs>(c.device);
  result.setup_s = seconds_since(setup_start);

  Progress progress(c.progress, total_tokens, result.num_requests);
  const int64_t l = d.kv_lora_rank, r = d.qk_rope_head_dim;
  const TensorView q_host_rows =
      buf.q_host.view().reshape({buf.q_host.size(0), d.num_heads * d.qk_head_dim()});
  // New activations of one layer into the host buffers and, for a GPU, their device twins.
  auto fill_activations = [&](int64_t tokens) {
    (dcp ? rank_queries : activations).fill(q_host_rows, tokens);
    activations.fill(buf.kv_host, tokens);
    if (c.device.is_cpu()) return;
    copy_to_device(buf.q_dev, buf.q_host.data<void>(),
                   tokens * q_host_rows.stride(0) * q_host_rows.element_size());
    copy_to_device(buf.kv_dev, buf.kv_host.data<void>(),
                   tokens * buf.kv_host.view().stride(0) * buf.kv_host.view().element_size());
  };
  auto forward_layer = [&](int64_t i, const StepPlan& plan, int64_t t, const TensorView& out) {
    layers[i].attention->forward(buf.q_dev.view().narrow(0, 0, t),
                                 kv_c_of(buf.kv_dev, l).narrow(0, 0, t),
                                 k_pe_of(buf.kv_dev, l, r).narrow(0, 0, t), layers[i].kv_cache,
                                 plan, out.narrow(0, 0, t), scales, stream);
  };
  const auto loop_start = Clock::now();
  for (int64_t step_index = 0; !scheduler.done(); ++step_index) {
    const auto step_start = Clock::now();
    const sim::Step step = scheduler.schedule();
    sim::StepBatch batch = sim::make_step_batch(step, scheduler);
    // What the oracle's mirror addresses: the batch itself, or under DCP its global view.
    const sim::StepBatch global =
        dcp ? sim::global_view(batch, max_blocks_per_request, c.scheduler.block_size) : batch;
    const bool graph_step = graphs != nullptr && !step.has_prefill();
    if (graph_step) {
      pad_decode_batch(batch, decode_bucket(batch.num_reqs(), c.scheduler.max_num_seqs),
                       max_blocks_per_request);
    }
    const int64_t t = batch.num_tokens();
    const ForwardBatch forward_batch = to_forward_batch(batch, buf, c.device);
    const auto plan_start = Clock::now();
    const StepPlan plan = plan_step(attention_config, forward_batch, workspace, stream);
    result.plan_s += seconds_since(plan_start);
    result.workspace_peak_bytes =
        std::max(result.workspace_peak_bytes, plan.workspace_bytes_used());

    PhaseStats& phase = step.has_prefill() ? result.prefill : result.decode;
    const int64_t layer_to_verify = verifier.plan_step(step.has_prefill());
    double verify_s = 0.0;
    auto verify_layer = [&](int64_t i, const TensorView& out) {
      const auto verify_start = Clock::now();
      if (!c.device.is_cpu()) {
        copy_to_host(buf.out_host.data<void>(), out,
                     t * buf.out_host.view().stride(0) * buf.out_host.view().element_size());
      }
      verifier.check(i, global, buf.q_host, kv_c_of(buf.kv_host, l), k_pe_of(buf.kv_host, l, r),
                     buf.out_host);
      verify_s += seconds_since(verify_start);
    };
    if (graph_step) {
      // Every layer reads this step's one set of activations and writes its own output rows.
      fill_activations(t);
      for (int64_t i = 0; i < c.num_layers; ++i)
        verifier.record_writes(i, kv_c_of(buf.kv_host, l), k_pe_of(buf.kv_host, l, r), global);
      auto graph_out = [&](int64_t i) {
        return buf.graph_out_dev.view().narrow(0, i, 1).reshape(
            {buf.graph_out_dev.size(1), buf.graph_out_dev.size(2)});
      };
      const auto forward_start = Clock::now();
      phase.host_s += graphs->run(plan, stream, [&] {
        for (int64_t i = 0; i < c.num_layers; ++i) forward_layer(i, plan, t, graph_out(i));
      });
      synchronize(c.device);
      phase.forward_s += seconds_since(forward_start);
      phase.layer_calls += c.num_layers;
      if (layer_to_verify >= 0) verify_layer(layer_to_verify, graph_out(layer_to_verify));
    } else {
      for (int64_t i = 0; i < c.num_layers; ++i) {
        fill_activations(t);
        verifier.record_writes(i, kv_c_of(buf.kv_host, l), k_pe_of(buf.kv_host, l, r), global);
        const auto forward_start = Clock::now();
        forward_layer(i, plan, t, buf.out_dev);
        phase.host_s += seconds_since(forward_start);
        synchronize(c.device);
        phase.forward_s += seconds_since(forward_start);
        ++phase.layer_calls;
        if (i == layer_to_verify) verify_layer(i, buf.out_dev);
      }
    }
    scheduler.complete(step);
    const sim::StepWork work = sim::step_work(batch, d, spec.entry_bytes(), dtype_size(c.dtype));
    const auto layers_count = static_cast<double>(c.num_layers);
    phase.prefill_flops += work.prefill_flops * layers_count;
    phase.decode_flops += work.decode_flops * layers_count;
    phase.decode_bytes += work.decode_bytes * layers_count;
    ++phase.steps;
    phase.prompt_tokens += step.num_prompt_tokens;
    phase.decode_tokens += step.num_generated_tokens;
    phase.wall_s += seconds_since(step_start) - verify_s;
    result.verify_s += verify_s;

    const sim::SchedulerStats& s = scheduler.stats();
    progress.update(step_index + 1, s.prompt_tokens + s.decode_tokens + s.prefix_hit_tokens,
                    s.finished);
  }
  if (graphs) {
    result.graph_captures = graphs->captures();
    result.graph_replays = graphs->replays();
  }
  progress.finish();
  result.loop_s = seconds_since(loop_start) - result.verify_s;
  result.scheduler = scheduler.stats();
  result.evictions = scheduler.allocator().num_evictions();
  result.verify = verifier.result();
  return result;
}

}  // namespace mlakit::cli
