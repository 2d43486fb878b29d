#include "decode_graphs.hpp"

#include <algorithm>
#include <chrono>
#include <string>

#include "device_io.hpp"
#include "mlakit/error.hpp"

namespace mlakit::cli {

namespace {

// vLLM's first capture sizes; past them every multiple of kBucketStep.
constexpr int64_t kSmallBuckets[] = {1, 2, 4};
constexpr int64_t kBucketStep = 8;

[[noreturn]] void no_graphs(Device device) {
  throw Error(ErrorCode::kUnsupported,
              "--cuda-graphs needs a CUDA device and a CUDA build, got " + device_name(device));
}

}  // namespace

int64_t decode_bucket(int64_t num_reqs, int64_t max_num_seqs) {
  for (int64_t size : kSmallBuckets) {
    if (num_reqs <= size) return std::min(size, max_num_seqs);
  }
  return std::min((num_reqs + kBucketStep - 1) / kBucketStep * kBucketStep, max_num_seqs);
}

void pad_decode_batch(sim::StepBatch& batch, int64_t bucket, int64_t width) {
  const int64_t reqs = batch.num_reqs(), old_width = batch.block_table_width;
  std::vector<int32_t> table(bucket * width, -1);
  for (int64_t r = 0; r < reqs; ++r) {
    std::copy_n(batch.block_table.begin() + r * old_width, std::min(old_width, width),
                table.begin() + r * width);
  }
  batch.block_table = std::move(table);
  batch.block_table_width = width;
  batch.seq_lens.resize(bucket, 0);
  batch.query_start_loc.resize(bucket + 1, batch.query_start_loc.back());
  batch.slot_mapping.resize(bucket, -1);
  batch.num_decodes = bucket;
}

RunStream::RunStream(Device device) : device_(device) {
  if (device.is_cpu()) return;
#if defined(MLAKIT_WITH_CUDA)
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  cudaStream_t s = nullptr;
  // Blocking (no cudaStreamNonBlocking): ordered with the legacy-stream copies of device_io.
  check_cuda(cudaStreamCreate(&s), "cudaStreamCreate");
  stream_.handle = s;
#else
  no_graphs(device);
#endif
}

RunStream::~RunStream() {
#if defined(MLAKIT_WITH_CUDA)
  if (stream_.handle != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_.handle));
#endif
}

struct DecodeGraphs::Graph {
  StepPlan plan;  // the plan it was captured with: its launches
#if defined(MLAKIT_WITH_CUDA)
  cudaGraphExec_t exec = nullptr;
#endif
};

DecodeGraphs::DecodeGraphs(Device device) : device_(device) {
  if (!device.is_cuda()) no_graphs(device);
}

DecodeGraphs::~DecodeGraphs() {
#if defined(MLAKIT_WITH_CUDA)
  for (const auto& g : graphs_) cudaGraphExecDestroy(g->exec);
#endif
}

double DecodeGraphs::run(const StepPlan& plan, Stream stream,
                         const std::function<void()>& enqueue_step) {
#if defined(MLAKIT_WITH_CUDA)
  const auto s = static_cast<cudaStream_t>(stream.handle);
  Graph* graph = nullptr;
  for (const auto& g : graphs_) {
    if (g->plan.same_launches(plan)) graph = g.get();
  }
  if (graph == nullptr) {
    auto g = std::make_unique<Graph>();
    cudaGraph_t captured = nullptr;
    check_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal),
               "cudaStreamBeginCapture");
    try {
      enqueue_step();
    } catch (...) {
      cudaStreamEndCapture(s, &captured);
      if (captured != nullptr) cudaGraphDestroy(captured);
      throw;
    }
    check_cuda(cudaStreamEndCapture(s, &captured), "cudaStreamEndCapture");
    const cudaError_t status = cudaGraphInstantiate(&g->exec, captured, 0);
    cudaGraphDestroy(captured);
    check_cuda(status, "cudaGraphInstantiate");
    g->plan = plan;
    graph = g.get();
    graphs_.push_back(std::move(g));
  }
  const auto start = std::chrono::steady_clock::now();
  check_cuda(cudaGraphLaunch(graph->exec, s), "cudaGraphLaunch");
  ++replays_;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
#else
  (void)plan;
  (void)stream;
  (void)enqueue_step;
  no_graphs(device_);
#endif
}

}  // namespace mlakit::cli
