// A whole step of an L-layer model through the engine path (plan_step once, then
// MlaAttention::forward per layer over one shared Workspace), on one GPU, three ways:
//   eager host  host time of one forward() call (no synchronization: launches only), per layer;
//   graph       the step's L forwards captured once in a CUDA graph and replayed: device time per
//               layer (events around each replay, median);
//   kernels     the device time of one layer's own kernels, memsets and copies, summed from CUPTI
//               activity records of eager runs (what a layer would cost with no gap between them).
// The issue-9 bars (decode): graph time per layer <= 1.10 x the kernel sum; eager host time <= 10
// us. With --query-len Q > 1 every request is a prefill of Q new tokens at the end of its seq_len
// (the rest its context, gathered in chunks): issue 10's bar, eager device time per layer <= 1.15 x
// the sum of its kernels (up-projections, gathers, attention on the new tokens and on each context
// chunk, merges); no graph (decode steps only).
//   bench_gpu_forward [--layers 61] [--batch 8] [--seq-len 1024] [--query-len 1] [--heads 128]
//                     [--json FILE]
#include <cuda_runtime.h>
#include <cupti.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "mlakit/attention.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/step.hpp"
#include "ops/cache_write_with_q_rope.hpp"

namespace {

using mlakit::Device;
using mlakit::DType;
using mlakit::Tensor;

constexpr int kWarmups = 3;               // untimed runs before each measurement
constexpr int kReps = 21;                 // timed runs per measurement (median)
constexpr int64_t kBlockSize = 64;        // DeepSeek-V3 serving page size
constexpr float kScale = 0.1352338f;      // DeepSeek-V3 softmax scale
constexpr size_t kCuptiBuffer = 8 << 20;  // bytes per CUPTI activity buffer: thousands of records

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}
void check(CUptiResult status, const char* what) {
  if (status != CUPTI_SUCCESS) {
    const char* message = nullptr;
    cuptiGetResultString(status, &message);
    std::fprintf(stderr, "%s failed: %s\n", what, message ? message : "?");
    std::exit(1);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---- CUPTI: device time of everything a region enqueues
// ------------------------------------------

uint64_t g_device_ns = 0;  // summed durations of the kernels, memsets and copies recorded
int64_t g_records = 0;
// Host time per CUDA runtime / driver API function (name -> calls, ns), for the host breakdown.
std::map<std::string, std::pair<int64_t, uint64_t>> g_api;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kCuptiBuffer));
  *size = kCuptiBuffer;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    uint64_t start = 0, end = 0;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        start = k->start;
        end = k->end;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        start = m->start;
        end = m->end;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        start = m->start;
        end = m->end;
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
        const char* name = nullptr;
        cuptiGetCallbackName(record->kind == CUPTI_ACTIVITY_KIND_RUNTIME
                                 ? CUPTI_CB_DOMAIN_RUNTIME_API
                                 : CUPTI_CB_DOMAIN_DRIVER_API,
                             a->cbid, &name);
        auto& entry = g_api[name != nullptr ? name : "?"];
        ++entry.first;
        entry.second += a->end - a->start;
        continue;
      }
      default:
        continue;
    }
    g_device_ns += end - start;
    ++g_records;
  }
  std::free(buffer);
}

// Summed device time (us) and number of device activities of fn().
template <class Fn>
std::pair<double, int64_t> device_activity(Fn&& fn) {
  check(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
  g_device_ns = 0;
  g_records = 0;
  for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET,
                                  CUPTI_ACTIVITY_KIND_MEMCPY}) {
    check(cuptiActivityEnable(kind), "cuptiActivityEnable");
  }
  fn();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET,
                                  CUPTI_ACTIVITY_KIND_MEMCPY}) {
    check(cuptiActivityDisable(kind), "cuptiActivityDisable");
  }
  check(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
  return {static_cast<double>(g_device_ns) * 1e-3, g_records};
}

// Host time spent inside CUDA runtime and driver API functions during fn(), by function.
template <class Fn>
void api_activity(Fn&& fn) {
  check(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
  g_api.clear();
  for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER}) {
    check(cuptiActivityEnable(kind), "cuptiActivityEnable");
  }
  fn();
  for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER}) {
    check(cuptiActivityDisable(kind), "cuptiActivityDisable");
  }
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
}

// An empty kernel: the floor of one launch's host time.
__global__ void empty_kernel() {}

// Host time of one launch of an empty kernel (median of kReps bursts of 100, no synchronization
// inside a burst), in us.
double empty_launch_us(cudaStream_t stream) {
  constexpr int kBurst = 100;  // launches per timed burst: well below the launch queue's depth
  std::vector<double> per_launch;
  for (int rep = 0; rep < kWarmups + kReps; ++rep) {
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBurst; ++i) empty_kernel<<<1, 1, 0, stream>>>();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    check(cudaGetLastError(), "empty_kernel launch");
    if (rep >= kWarmups) per_launch.push_back(us / kBurst);
  }
  return median(per_launch);
}

// Host time of one call of a CUDA runtime function that enqueues nothing (median of kReps bursts
// of 1000), in us: what each cudaGetDevice / cudaGetLastError inside an op costs on this host.
template <class F>
double runtime_call_us(F&& call) {
  constexpr int kBurst = 1000;  // calls per timed burst: long enough for the clock's resolution
  std::vector<double> per_call;
  for (int rep = 0; rep < kWarmups + kReps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBurst; ++i) call();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (rep >= kWarmups) per_call.push_back(us / kBurst);
  }
  return median(per_call);
}

// Host time of one call of `launch` (median of kReps bursts of kBurst calls, no synchronization
// inside a burst), in us.
template <class F>
double host_us_per_call(cudaStream_t stream, F&& launch) {
  constexpr int kBurst = 20;  // calls per timed burst: a few hundred launches, below the queue
  std::vector<double> per_call;
  for (int rep = 0; rep < kWarmups + kReps; ++rep) {
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBurst; ++i) launch();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (rep >= kWarmups) per_call.push_back(us / kBurst);
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return median(per_call);
}

// ---- the model
// -----------------------------------------------------------------------------------

struct Options {
  int64_t layers = 61, batch = 8, seq_len = 1024, heads = 128;
  int64_t query_len = 1;  // new tokens per request: 1 decodes, more prefills (seq_len counts them)
  std::string json;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--json") {
      o.json = value;
      continue;
    }
    const int64_t v = std::atoll(value.c_str());
    if (key == "--layers") {
      o.layers = v;
    } else if (key == "--batch") {
      o.batch = v;
    } else if (key == "--seq-len") {
      o.seq_len = v;
    } else if (key == "--heads") {
      o.heads = v;
    } else if (key == "--query-len") {
      o.query_len = v;
    } else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      std::exit(2);
    }
  }
  if (o.layers < 1 || o.batch < 1 || o.seq_len < 1 || o.heads < 1 || o.query_len < 1) {
    std::fprintf(stderr, "--layers, --batch, --seq-len, --query-len and --heads must be >= 1\n");
    std::exit(2);
  }
  if (o.query_len > o.seq_len) {
    std::fprintf(stderr, "--query-len must not exceed --seq-len (which counts the new tokens)\n");
    std::exit(2);
  }
  return o;
}

// A host bf16 tensor of N(0, stddev^2) values.
Tensor host_random(std::mt19937_64& rng, std::initializer_list<int64_t> shape, double stddev) {
  const Tensor f32 = Tensor::empty(shape, DType::kF32);
  std::normal_distribution<float> dist(0.0f, static_cast<float>(stddev));
  for (int64_t i = 0; i < f32.numel(); ++i) f32.data<float>()[i] = dist(rng);
  Tensor bf16 = Tensor::empty(shape, DType::kBF16);
  mlakit::ops::copy(f32, bf16);
  return bf16;
}

// A device copy of a host tensor.
Tensor to_gpu(const Tensor& host) {
  const mlakit::TensorView& v = host.view();
  Tensor dev = Tensor::empty(std::span<const int64_t>(v.shape, v.ndim), v.dtype, Device::cuda(0));
  mlakit::ops::copy(host, dev);
  return dev;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const Device gpu = Device::cuda(0);
  std::mt19937_64 rng(20261203);
  mlakit::MlaAttentionConfig cfg;
  cfg.dims = mlakit::MlaDims{o.heads, 512, 64, 128, 128};
  cfg.scale = kScale;
  cfg.act_dtype = DType::kBF16;
  cfg.block_size = kBlockSize;
  const bool decode = o.query_len == 1;
  const int64_t tokens = o.batch * o.query_len;
  cfg.max_num_seqs = o.batch;
  cfg.max_num_batched_tokens = tokens;
  cfg.max_model_len = o.seq_len + kBlockSize;
  cfg.device = gpu;
  const mlakit::MlaDims& d = cfg.dims;

  // One request per row, lengths around seq_len (at least query_len), each on its own pages; its
  // last query_len positions are the step's new tokens.
  const int64_t width = (cfg.max_model_len + kBlockSize - 1) / kBlockSize;
  const int64_t num_blocks = o.batch * width + 1;
  std::vector<int32_t> qsl{0}, seq_lens;
  std::vector<int64_t> table(static_cast<size_t>(o.batch * width)), slots;
  std::uniform_int_distribution<int64_t> jitter(-32, 32);  // +-32 keys: not all lengths equal
  for (int64_t r = 0; r < o.batch; ++r) {
    const int64_t len = std::min<int64_t>(std::max<int64_t>(o.query_len, o.seq_len + jitter(rng)),
                                          cfg.max_model_len);
    seq_lens.push_back(static_cast<int32_t>(len));
    qsl.push_back(static_cast<int32_t>(qsl.back() + o.query_len));
    for (int64_t c = 0; c < width; ++c) table[r * width + c] = 1 + r * width + c;
    for (int64_t pos = len - o.query_len; pos < len; ++pos) {
      slots.push_back(table[r * width + pos / kBlockSize] * kBlockSize + pos % kBlockSize);
    }
  }
  auto index_tensor = [&](const std::vector<int64_t>& v, std::initializer_list<int64_t> shape,
                          DType dtype) {
    Tensor host = Tensor::empty(shape, dtype);
    for (size_t i = 0; i < v.size(); ++i) {
      if (dtype == DType::kI32) {
        host.data<int32_t>()[i] = static_cast<int32_t>(v[i]);
      } else {
        host.data<int64_t>()[i] = v[i];
      }
    }
    return to_gpu(host);
  };
  const Tensor block_table = index_tensor(table, {o.batch, width}, DType::kI32);
  const Tensor slot_mapping = index_tensor(slots, {tokens}, DType::kI64);
  const Tensor seq_lens_dev =
      index_tensor(std::vector<int64_t>(seq_lens.begin(), seq_lens.end()), {o.batch}, DType::kI32);

  std::vector<std::unique_ptr<mlakit::MlaAttention>> layers;
  std::vector<Tensor> caches, outputs;
  for (int64_t l = 0; l < o.layers; ++l) {
    // kv_b_proj ~ N(0, 1/L) (0.044 ~ 1/sqrt(512)): up-projected values keep unit variance.
    layers.push_back(std::make_unique<mlakit::MlaAttention>(
        cfg, host_random(rng, {d.num_heads * d.kv_b_out_dim(), d.kv_lora_rank}, 0.044)));
    caches.push_back(to_gpu(host_random(rng, {num_blocks, kBlockSize, d.entry_dim()}, 1.0)));
    outputs.push_back(Tensor::empty({tokens, d.num_heads * d.v_head_dim}, DType::kBF16, gpu));
  }
  const Tensor q = to_gpu(host_random(rng, {tokens, d.num_heads, d.qk_head_dim()}, 1.0));
  const Tensor kv = to_gpu(host_random(rng, {tokens, d.entry_dim()}, 1.0));
  const mlakit::TensorView kv_c = kv.view().narrow(1, 0, d.kv_lora_rank);
  const mlakit::TensorView k_pe = kv.view().narrow(1, d.kv_lora_rank, d.qk_rope_head_dim);

  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const mlakit::Stream s{stream};
  mlakit::Workspace workspace(cfg);
  workspace.touch(s);
  mlakit::ForwardBatch batch;
  batch.query_start_loc = qsl;
  batch.seq_lens = seq_lens;
  batch.num_actual_tokens = tokens;
  batch.block_table = block_table;
  batch.slot_mapping = slot_mapping;

  using Clock = std::chrono::steady_clock;
  const auto plan_start = Clock::now();
  const mlakit::StepPlan plan = mlakit::plan_step(cfg, batch, workspace, s);
  const double plan_us =
      std::chrono::duration<double, std::micro>(Clock::now() - plan_start).count();
  auto run_layer = [&](int64_t l) {
    layers[l]->forward(q, kv_c, k_pe, caches[l], plan, outputs[l], {}, s);
  };
  auto run_step = [&] {
    for (int64_t l = 0; l < o.layers; ++l) run_layer(l);
  };

  // Eager: host time of the L forward() calls (launches only), then the step's device time.
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> host_us, eager_us, graph_us;
  for (int rep = 0; rep < kWarmups + kReps; ++rep) {
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    const auto t0 = Clock::now();
    run_step();
    const double host = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (rep >= kWarmups) {
      host_us.push_back(host / static_cast<double>(o.layers));
      eager_us.push_back(1e3 * ms / static_cast<double>(o.layers));
    }
  }

  const double launch_us = empty_launch_us(stream);
  int device_index = 0;
  const double get_device_us = runtime_call_us([&] { cudaGetDevice(&device_index); });
  const double get_last_error_us = runtime_call_us([] { cudaGetLastError(); });

  // Where the eager host time goes, op by op (decode steps): each op a decode step's forward()
  // calls, called alone with the layer's shapes (the rest of forward() is the orchestrator's).
  std::vector<std::pair<const char*, double>> op_host_us;
  if (decode) {
    const int64_t n = d.num_heads, p = d.qk_nope_head_dim, l = d.kv_lora_rank,
                  r = d.qk_rope_head_dim, e = d.entry_dim();
    const Tensor ql = Tensor::empty({o.batch, n, e}, DType::kBF16, gpu);
    const Tensor o_lat = Tensor::empty({o.batch, 1, n, l}, DType::kBF16, gpu);
    const Tensor lse = Tensor::empty({o.batch, 1, n}, DType::kF32, gpu);
    const mlakit::DecodeSchedule op_schedule = mlakit::ops::plan_mla_decode(
        {gpu, o.batch, 1, n, kBlockSize, width * kBlockSize, false}, seq_lens);
    const Tensor split_ws = Tensor::empty(
        {mlakit::ops::mla_decode_workspace_elems(op_schedule, 1, n, l)}, DType::kF32, gpu);
    const mlakit::DecodeSchedule ahead = mlakit::ops::mla_decode_plan_ahead(
        op_schedule, block_table, seq_lens_dev, kBlockSize, l, split_ws, s);
    const mlakit::ops::DecodeParams params{kScale, mlakit::KvCacheDType::kAuto, 1.0f, 1.0f, l};
    const mlakit::AbsorbedWeights& w0 = layers[0]->weights();
    const mlakit::TensorView out_heads = mlakit::TensorView::strided(
        outputs[0].view().data, DType::kBF16, {o.batch, n, d.v_head_dim},
        {n * d.v_head_dim, d.v_head_dim, 1}, gpu);
    op_host_us = {
        {"concat_and_cache_mla + q_pe copy (one launch)",
         host_us_per_call(stream,
                          [&] {
                            mlakit::ops::concat_and_cache_mla_with_q_rope(
                                kv_c, k_pe, caches[0], slot_mapping, mlakit::KvCacheDType::kAuto,
                                1.0f, q.view().narrow(2, p, r), ql.view().narrow(2, l, r), s);
                          })},
        {"batched_matmul (W_UK absorb)",
         host_us_per_call(stream,
                          [&] {
                            mlakit::ops::batched_matmul(
                                q.view().narrow(2, 0, p).transpose(0, 1), w0.w_uk_t,
                                ql.view().narrow(2, 0, l).transpose(0, 1), s);
                          })},
        {"mla_decode (planned ahead)",
         host_us_per_call(stream,
                          [&] {
                            mlakit::ops::mla_decode(ql.view().reshape({o.batch, 1, n, e}),
                                                    caches[0], block_table, seq_lens_dev, o_lat,
                                                    lse, params, ahead, split_ws, s);
                          })},
        {"batched_matmul (W_UV)",
         host_us_per_call(stream,
                          [&] {
                            mlakit::ops::batched_matmul(
                                o_lat.view().reshape({o.batch, n, l}).transpose(0, 1), w0.w_uv,
                                out_heads.transpose(0, 1), s);
                          })},
    };
  }
  double op_host_sum = 0;
  for (const auto& [name, us] : op_host_us) op_host_sum += us;

  // Kernel time of one layer: CUPTI records of kReps eager runs of layer 0.
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
        "cuptiActivityRegisterCallbacks");
  for (int rep = 0; rep < kWarmups; ++rep) run_layer(0);
  const auto [kernel_total_us, records] = device_activity([&] {
    for (int rep = 0; rep < kReps; ++rep) run_layer(0);
  });
  const double kernel_us = kernel_total_us / kReps;
  const double activities_per_layer = static_cast<double>(records) / kReps;
  // Where the eager host time goes: CUDA API calls of kReps forwards of layer 0 (a runtime call
  // includes the driver calls it makes; both are listed).
  api_activity([&] {
    for (int rep = 0; rep < kReps; ++rep) run_layer(0);
  });
  std::vector<std::pair<uint64_t, std::string>> api_rows;
  for (const auto& [name, entry] : g_api) api_rows.push_back({entry.second, name});
  std::sort(api_rows.rbegin(), api_rows.rend());

  // Graph (decode steps): the whole step captured once, replayed.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (decode) {
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
    run_step();
    check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    for (int rep = 0; rep < kWarmups + kReps; ++rep) {
      check(cudaEventRecord(start, stream), "cudaEventRecord");
      check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      check(cudaEventRecord(stop, stream), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      if (rep >= kWarmups) graph_us.push_back(1e3 * ms / static_cast<double>(o.layers));
    }
  }
  mlakit::ops::check_device_errors(gpu, s);

  const double host = median(host_us), eager = median(eager_us);
  const double replay = decode ? median(graph_us) : NAN;
  const double ratio = replay / kernel_us;
  const double eager_ratio = eager / kernel_us;  // issue 10's bar for prefill steps: <= 1.15
  std::printf(
      "%s step: %lld layers, B %lld, %lld new tokens each, s_kv ~%lld, h_q %lld, bf16 "
      "cache, page %lld\n",
      decode ? "decode" : "prefill", static_cast<long long>(o.layers),
      static_cast<long long>(o.batch), static_cast<long long>(o.query_len),
      static_cast<long long>(o.seq_len), static_cast<long long>(o.heads),
      static_cast<long long>(kBlockSize));
  std::printf("workspace %.1f MiB (step uses %.1f MiB), plan_step %.1f us\n",
              workspace.bytes() / 1048576.0, plan.workspace_bytes_used() / 1048576.0, plan_us);
  std::printf("| per layer | us | bar |\n|---|---|---|\n");
  std::printf("| eager forward() host time | %.2f | <= 10 (%s) |\n", host,
              host <= 10.0 ? "met" : "NOT met");
  std::printf("| eager device time | %.2f | |\n", eager);
  std::printf("| one empty-kernel launch, host time (the floor of a launch) | %.2f | |\n",
              launch_us);
  std::printf("| one cudaGetDevice / one cudaGetLastError, host time | %.3f / %.3f | |\n",
              get_device_us, get_last_error_us);
  std::printf("| kernels (CUPTI sum, %.1f activities) | %.2f | |\n", activities_per_layer,
              kernel_us);
  if (decode) {
    std::printf("| graph replay | %.2f | <= 1.10 x kernels: %.3f (%s) |\n", replay, ratio,
                ratio <= 1.10 ? "met" : "NOT met");
    std::printf("host time per call of each op of a decode layer, called alone:\n");
    for (const auto& [name, us] : op_host_us) std::printf("  %-44s %8.2f us\n", name, us);
    std::printf("  %-44s %8.2f us (forward() %.2f: the rest is the orchestrator's)\n", "sum",
                op_host_sum, host);
  } else {
    std::printf("| eager device time / kernels | %.3f | <= 1.15 (%s) |\n", eager_ratio,
                eager_ratio <= 1.15 ? "met" : "NOT met");
  }
  std::printf("host time in CUDA API calls per layer forward (CUPTI, top 12):\n");
  for (size_t i = 0; i < std::min<size_t>(12, api_rows.size()); ++i) {
    const auto& [calls, ns] = g_api[api_rows[i].second];
    std::printf("  %-44s %5.1f calls %8.2f us\n", api_rows[i].second.c_str(),
                static_cast<double>(calls) / kReps, static_cast<double>(ns) * 1e-3 / kReps);
  }
  if (!o.json.empty()) {
    FILE* f = std::fopen(o.json.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", o.json.c_str());
      return 1;
    }
    std::fprintf(f,
                 "{\"layers\": %lld, \"batch\": %lld, \"seq_len\": %lld, \"query_len\": %lld, "
                 "\"heads\": %lld, "
                 "\"workspace_bytes\": %lld, \"plan_step_us\": %.3f, \"eager_host_us_per_layer\": "
                 "%.3f, \"eager_device_us_per_layer\": %.3f, \"kernel_us_per_layer\": %.3f, "
                 "\"activities_per_layer\": %.2f, \"graph_us_per_layer\": %.3f, "
                 "\"graph_over_kernels\": %.4f, \"empty_launch_us\": %.3f, \"get_device_us\": "
                 "%.4f, \"get_last_error_us\": %.4f, \"op_host_us\": {",
                 static_cast<long long>(o.layers), static_cast<long long>(o.batch),
                 static_cast<long long>(o.seq_len), static_cast<long long>(o.query_len),
                 static_cast<long long>(o.heads), static_cast<long long>(workspace.bytes()),
                 plan_us, host, eager, kernel_us, activities_per_layer, decode ? replay : 0.0,
                 decode ? ratio : 0.0, launch_us, get_device_us, get_last_error_us);
    for (size_t i = 0; i < op_host_us.size(); ++i) {
      std::fprintf(f, "%s\"%s\": %.3f", i ? ", " : "", op_host_us[i].first, op_host_us[i].second);
    }
    std::fprintf(f, "}}\n");
    std::fclose(f);
  }
  if (decode) {
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
  return 0;
}
