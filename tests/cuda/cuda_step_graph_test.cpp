// Whole decode steps in a CUDA graph (DESIGN.md §2): a decode-only step of several layers over one
// StepPlan is captured once for a batch bucket of 8 (padding requests included), then replayed for
// 20 steps whose lengths, block tables, slots and activations change, each written into the same
// buffers before plan_step uploads the new indices. Every replayed step must give the same bits as
// the same step run eagerly (plan_step + forward on a second workspace and a second set of
// caches), and the caches must end identical.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "common/test_util.hpp"
#include "gpu_test_util.hpp"
#include "mlakit/attention.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/step.hpp"

namespace mlakit::test {
namespace {

constexpr int64_t kLayers = 4;
constexpr int64_t kBucket = 8;  // requests (and tokens) of the captured decode batch
constexpr int64_t kBlockSize = 16;
constexpr int64_t kMaxBlocksPerRequest = 24;                        // max_model_len 384
constexpr int64_t kNumBlocks = kBucket * kMaxBlocksPerRequest + 1;  // + a null block

struct Layer {
  std::unique_ptr<MlaAttention> attn;
  Tensor cache_graph, cache_eager;  // [kNumBlocks, kBlockSize, 576] bf16, identical at the start
  Tensor out_graph, out_eager;      // [kBucket, N * V] bf16
};

// One step's host inputs: decodes first, the last requests padding (q_len 0, seq_len 0).
struct HostStep {
  std::vector<int32_t> qsl, seq_lens;
  std::vector<int64_t> slots;
  std::vector<int32_t> table;  // [kBucket, kMaxBlocksPerRequest]
  int64_t real = 0;
};

HostStep random_step(std::mt19937_64& rng) {
  HostStep s;
  s.real = std::uniform_int_distribution<int64_t>(1, kBucket)(rng);
  std::vector<int32_t> blocks(kNumBlocks - 1);
  std::iota(blocks.begin(), blocks.end(), 1);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  s.table.assign(kBucket * kMaxBlocksPerRequest, -1);
  s.qsl.push_back(0);
  int64_t next = 0;
  for (int64_t r = 0; r < kBucket; ++r) {
    const bool real = r < s.real;
    const int32_t len =
        real ? std::uniform_int_distribution<int32_t>(1, kMaxBlocksPerRequest * kBlockSize)(rng)
             : 0;
    s.seq_lens.push_back(len);
    s.qsl.push_back(s.qsl.back() + (real ? 1 : 0));
    for (int64_t b = 0; b < (len + kBlockSize - 1) / kBlockSize; ++b)
      s.table[r * kMaxBlocksPerRequest + b] = blocks[next++];
    if (real) {
      const int64_t pos = len - 1;
      s.slots.push_back(int64_t{s.table[r * kMaxBlocksPerRequest + pos / kBlockSize]} * kBlockSize +
                        pos % kBlockSize);
    }
  }
  s.slots.resize(kBucket, -1);  // padded tokens write nothing
  return s;
}

TEST(CudaStepGraph, DecodeStepsReplayWithNewLengthsTablesAndSlots) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = make_rng(2000);
  const Device gpu = Device::cuda(0);
  MlaAttentionConfig cfg;
  cfg.dims = MlaDims{16, 512, 64, 128, 128};
  cfg.scale = 0.1147214f;
  cfg.act_dtype = DType::kBF16;
  cfg.block_size = kBlockSize;
  cfg.query_len_support = QueryLenSupport::kUniform;
  cfg.max_num_seqs = kBucket;
  cfg.max_num_batched_tokens = kBucket;
  cfg.max_model_len = kMaxBlocksPerRequest * kBlockSize;
  cfg.device = gpu;
  const MlaDims& d = cfg.dims;

  std::vector<Layer> layers(kLayers);
  for (Layer& layer : layers) {
    layer.attn = std::make_unique<MlaAttention>(
        cfg, random_tensor(rng, {d.num_heads * d.kv_b_out_dim(), d.kv_lora_rank}, DType::kBF16,
                           1.0 / 22.6));  // ~1/sqrt(L): O(1) outputs
    const Tensor cache = random_tensor(rng, {kNumBlocks, kBlockSize, d.entry_dim()}, DType::kBF16);
    layer.cache_graph = to_device(cache);
    layer.cache_eager = to_device(cache);
    layer.out_graph = to_device(nan_tensor({kBucket, d.num_heads * d.v_head_dim}, DType::kBF16));
    layer.out_eager = to_device(nan_tensor({kBucket, d.num_heads * d.v_head_dim}, DType::kBF16));
  }
  // The engine's persistent buffers: the graph reads them at these addresses on every replay.
  Tensor q = to_device(nan_tensor({kBucket, d.num_heads, d.qk_head_dim()}, DType::kBF16));
  Tensor kv = to_device(nan_tensor({kBucket, d.entry_dim()}, DType::kBF16));
  Tensor table = to_device(Tensor::zeros({kBucket, kMaxBlocksPerRequest}, DType::kI32));
  Tensor slots = to_device(Tensor::zeros({kBucket}, DType::kI64));
  const TensorView kv_c = kv.view().narrow(1, 0, d.kv_lora_rank);
  const TensorView k_pe = kv.view().narrow(1, d.kv_lora_rank, d.qk_rope_head_dim);

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Workspace graph_ws(cfg), eager_ws(cfg);
  graph_ws.touch({stream});
  eager_ws.touch({stream});

  HostStep host;
  auto load = [&](const HostStep& s) {  // new step inputs into the same device buffers
    ops::copy(int_tensor(std::vector<int64_t>(s.table.begin(), s.table.end()),
                         {kBucket, kMaxBlocksPerRequest}, DType::kI32),
              table, {stream});
    ops::copy(int_tensor(s.slots, {kBucket}, DType::kI64), slots, {stream});
    ops::copy(random_tensor(rng, {kBucket, d.num_heads, d.qk_head_dim()}, DType::kBF16), q,
              {stream});
    ops::copy(random_tensor(rng, {kBucket, d.entry_dim()}, DType::kBF16), kv, {stream});
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // the host tensors die here
  };
  auto batch_of = [&](const HostStep& s) {
    ForwardBatch b;
    b.query_start_loc = s.qsl;
    b.seq_lens = s.seq_lens;
    b.num_actual_tokens = kBucket;  // the bucket: padded tokens included
    b.block_table = table;
    b.slot_mapping = slots;
    return b;
  };

  // Capture step 0.
  host = random_step(rng);
  load(host);
  const StepPlan captured = plan_step(cfg, batch_of(host), graph_ws, {stream});
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  for (Layer& layer : layers)
    layer.attn->forward(q, kv_c, k_pe, layer.cache_graph, captured, layer.out_graph, {}, {stream});
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  // The capture ran nothing: run step 0 for real through the eager caches too.
  for (Layer& layer : layers)
    layer.attn->forward(q, kv_c, k_pe, layer.cache_eager, captured, layer.out_eager, {}, {stream});

  for (int step = 0; step < 21; ++step) {
    if (step > 0) {
      host = random_step(rng);
      load(host);
    }
    const StepPlan replay = plan_step(cfg, batch_of(host), graph_ws, {stream});
    ASSERT_TRUE(replay.same_launches(captured)) << "step " << step;
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    const StepPlan eager = plan_step(cfg, batch_of(host), eager_ws, {stream});
    for (Layer& layer : layers)
      layer.attn->forward(q, kv_c, k_pe, layer.cache_eager, eager, layer.out_eager, {}, {stream});
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (int64_t li = 0; li < kLayers; ++li) {
      const Layer& layer = layers[li];
      const Tensor got = to_host(layer.out_graph), want = to_host(layer.out_eager);
      EXPECT_TRUE(same_bits(want, got, /*nan_equal=*/false))
          << "step " << step << ", layer " << li << " (" << host.real << " real requests)";
      // Padding rows are zeros and real rows finite.
      const std::vector<double> values = to_doubles(got);
      const int64_t width = d.num_heads * d.v_head_dim;
      for (int64_t i = 0; i < kBucket * width; ++i) {
        if (i / width >= host.real) {
          ASSERT_EQ(values[i], 0.0) << "padding row " << i / width << ", step " << step;
        } else {
          ASSERT_TRUE(std::isfinite(values[i])) << "row " << i / width << ", step " << step;
        }
      }
    }
  }
  for (const Layer& layer : layers)
    EXPECT_TRUE(same_bits(to_host(layer.cache_eager), to_host(layer.cache_graph)));
  EXPECT_NO_THROW(ops::check_device_errors(gpu, {stream}));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace mlakit::test
