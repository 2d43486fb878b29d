// The flags of `mlakit run` as typed, and their resolution into a RunConfig.
#pragma once

#include <cstdint>
#include <string>

#include "simulation.hpp"

namespace mlakit::cli {

struct RunOptions {
  std::string model;  // empty: deepseek-v2-lite on the CPU, deepseek-v3 on a GPU
  int64_t tp = 1;
  int64_t num_layers = 2;
  int64_t num_requests = 16;
  std::string prompt_len = "64:512";
  std::string output_len = "16:64";
  int64_t shared_prefix_len = 256;
  double shared_prefix_fraction = 0.5;
  uint64_t seed = 0;
  int64_t block_size = 64;
  int64_t num_blocks = 0;    // 0: auto
  double kv_cache_gb = 0.0;  // > 0: num_blocks from a memory budget over all layers
  int64_t max_num_seqs = 8;
  int64_t max_num_batched_tokens = 512;
  std::string kv_cache_dtype = "auto";
  std::string dtype;  // empty: the preset's
  int64_t workspace_tokens = 0;
  std::string device = "cpu";
  bool verify = false;
  int64_t verify_every = 8;
  int64_t verify_heads = 4;
  std::string json_path;
  bool no_progress = false;
  bool cuda_graphs = false;
  int64_t dcp = 1;             // DCP ranks (the job's MPI ranks); 1: no DCP
  int64_t dcp_interleave = 1;  // positions a DCP rank takes per turn
};

// "bf16" / "f16" / "f32" (also "bfloat16", "float16", "float32"); throws on anything else.
DType parse_dtype(const std::string& name);
// "cpu", "cuda" or "cuda:N"; throws on anything else.
Device parse_device(const std::string& name);

// The largest --kv-cache-gb (1 PiB): larger values are typos (1e9) or overflow (inf, 1e300).
inline constexpr double kMaxKvCacheGib = 1024.0 * 1024.0;

// Checks the combination of flags and fills in the derived values (heads per rank, dtype,
// num_blocks). Throws mlakit::Error naming the flag to change. Bounds: --num-requests,
// --num-blocks (also as derived from --kv-cache-gb or the automatic rule) and the longest
// request (--prompt-len max + --output-len max - 1) at most 2^31 - 1 (int32 ids and lengths),
// --kv-cache-gb finite and at most kMaxKvCacheGib. Memory is checked separately
// (run_memory.hpp).
RunConfig resolve_run_options(const RunOptions& options);
// What set num_blocks, for messages: "--num-blocks", "--kv-cache-gb" or "automatic".
std::string num_blocks_source(const RunOptions& options);

}  // namespace mlakit::cli
