// `mlakit run --cuda-graphs`: decode-only steps replayed as CUDA graphs, one graph per batch
// bucket, the way an engine does (vLLM's capture sizes; padded requests have q_len 0 and seq_len
// 0, padded tokens slot -1). A graph is captured the first time a step plan of its shape is seen
// (StepPlan::same_launches) and replayed after each later plan_step of that shape has uploaded
// the new lengths; the block table, slots and activations live in fixed buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "mlakit/step.hpp"
#include "mlakit/types.hpp"
#include "step_batch.hpp"

namespace mlakit::cli {

// Requests of the captured batch that serves `num_reqs` requests: 1, 2, 4, then multiples of 8
// (vLLM's capture sizes), at most max_num_seqs.
int64_t decode_bucket(int64_t num_reqs, int64_t max_num_seqs);

// Pads a decode-only batch (q_len 1 each) to `bucket` requests and tokens, and its block table
// to `width` columns (unused entries -1, padded slots -1).
void pad_decode_batch(sim::StepBatch& batch, int64_t bucket, int64_t width);

// A stream the run enqueues on: on a GPU one that graphs can capture and that is ordered with the
// synchronous copies of device_io.hpp; on the CPU the null stream.
class RunStream {
 public:
  explicit RunStream(Device device);
  ~RunStream();
  RunStream(const RunStream&) = delete;
  RunStream& operator=(const RunStream&) = delete;
  Stream get() const { return stream_; }

 private:
  Device device_;
  Stream stream_;
};

class DecodeGraphs {
 public:
  explicit DecodeGraphs(Device device);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // Replays the graph of plan's shape on `stream`, first capturing enqueue_step() into it when no
  // graph of that shape exists yet (a capture runs nothing: the step then runs by its replay).
  // Returns the host time of the launch call in seconds.
  double run(const StepPlan& plan, Stream stream, const std::function<void()>& enqueue_step);

  int64_t captures() const { return static_cast<int64_t>(graphs_.size()); }
  int64_t replays() const { return replays_; }

 private:
  struct Graph;
  Device device_;
  std::vector<std::unique_ptr<Graph>> graphs_;
  int64_t replays_ = 0;
};

}  // namespace mlakit::cli
