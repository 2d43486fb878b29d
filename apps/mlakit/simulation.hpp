// `mlakit run`: serves a synthetic workload through a stack of MLA layers (MlaAttention::forward
// per step and layer) under the scheduler of scheduler.hpp, and measures it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mlakit/config.hpp"
#include "mlakit/dist.hpp"
#include "mlakit/step.hpp"
#include "mlakit/types.hpp"
#include "scheduler.hpp"
#include "verifier.hpp"
#include "workload.hpp"

namespace mlakit::cli {

struct RunConfig {
  std::string model;  // preset name
  int64_t tp = 1;
  MlaDims dims;  // this rank's dims (num_heads already divided by tp)
  float scale = 0.0f;
  DType dtype = DType::kBF16;
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;
  int64_t num_layers = 2;
  sim::WorkloadConfig workload;
  sim::SchedulerConfig scheduler;  // num_blocks resolved (> 0)
  int64_t workspace_tokens = 0;    // 0: the library's default (spec B.2)
  Device device{};
  VerifyConfig verify;
  bool progress = true;
  bool cuda_graphs = false;  // decode-only steps replayed as CUDA graphs (decode_graphs.hpp)
  // Decode context parallelism (--dcp): this process is rank dcp.rank of the group; the
  // communicator (the group's, not owned) is required when dcp.world_size > 1.
  DcpConfig dcp{};
  dist::Communicator* dcp_communicator = nullptr;
};

struct PhaseStats {
  int64_t steps = 0;
  int64_t prompt_tokens = 0;
  int64_t decode_tokens = 0;
  double wall_s = 0.0;      // whole steps: scheduling, inputs, forward (verification excluded)
  double forward_s = 0.0;   // MlaAttention::forward summed over layers (until the device is done)
  double host_s = 0.0;      // host time of the forward() calls / graph launches alone
  int64_t layer_calls = 0;  // layer forwards (a graph replay counts one per layer)
  double prefill_flops = 0.0;  // work_model.hpp, summed over layers
  double decode_flops = 0.0;
  double decode_bytes = 0.0;
};

struct RunResult {
  int64_t num_requests = 0;
  sim::SchedulerStats scheduler;
  int64_t evictions = 0;  // cached prefix blocks reused for other data
  int64_t cache_bytes_per_layer = 0;
  PhaseStats prefill;                // steps with at least one prompt token
  PhaseStats decode;                 // decode-only steps
  double setup_s = 0.0;              // weights, absorption, caches, buffers
  double loop_s = 0.0;               // the serving loop, verification excluded
  double verify_s = 0.0;             // oracle time
  double plan_s = 0.0;               // plan_step, once per step
  int64_t workspace_bytes = 0;       // the one Workspace every layer shares
  int64_t workspace_peak_bytes = 0;  // the most any step used of it
  int64_t graph_captures = 0;
  int64_t graph_replays = 0;
  VerifyResult verify;
  double comm_s = 0.0;     // DCP: time in the communicator's collectives (set by the caller)
  int64_t comm_bytes = 0;  // DCP: bytes this rank sent through them
  // DCP: per rank (rank 0's result only): KV blocks of its cache, the most it used, its
  // communication time, and whether its --verify passed.
  struct RankStats {
    int64_t kv_blocks = 0, peak_blocks_used = 0;
    double comm_s = 0.0;
    bool verify_passed = true;
  };
  std::vector<RankStats> ranks;

  double forward_s() const { return prefill.forward_s + decode.forward_s; }
};

// The configuration of every layer of the run, for requests of at most max_model_len tokens.
MlaAttentionConfig layer_config(const RunConfig& config, int64_t max_model_len);

// Throws mlakit::Error for bad configurations (and whatever the library throws).
RunResult run_simulation(const RunConfig& config);

}  // namespace mlakit::cli
