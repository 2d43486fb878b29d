#include "run_options.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "mlakit/error.hpp"
#include "mlakit/kv_cache.hpp"
#include "presets.hpp"

namespace mlakit::cli {

namespace {

[[noreturn]] void invalid(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, message);
}

// Block ids, request ids and sequence lengths are int32 (the library's block tables and seq_lens).
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

}  // namespace

DType parse_dtype(const std::string& name) {
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "f16" || name == "float16" || name == "fp16") return DType::kF16;
  if (name == "f32" || name == "float32" || name == "fp32") return DType::kF32;
  invalid("--dtype must be bf16, f16 or f32, got \"" + name + "\"");
}

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::cpu();
  if (name == "cuda") return Device::cuda(0);
  if (name.rfind("cuda:", 0) == 0) {
    int index = -1;
    const char* first = name.data() + 5;  // after "cuda:"
    const char* last = name.data() + name.size();
    const auto [end, ec] = std::from_chars(first, last, index);
    if (ec == std::errc() && end == last && first != last && index >= 0) {
      return Device::cuda(index);
    }
  }
  invalid("--device must be cpu, cuda or cuda:N, got \"" + name + "\"");
}

std::string num_blocks_source(const RunOptions& o) {
  if (o.kv_cache_gb != 0.0) return "--kv-cache-gb";
  if (o.num_blocks > 0) return "--num-blocks";
  return "automatic";
}

RunConfig resolve_run_options(const RunOptions& o) {
  // Without --preset: DeepSeek-V2-Lite on the CPU, DeepSeek-V3 (128 heads) on a GPU.
  const std::string model =
      !o.model.empty() ? o.model
                       : (parse_device(o.device).is_cuda() ? "deepseek-v3" : "deepseek-v2-lite");
  const ModelPreset& preset = find_preset(model);
  RunConfig c;
  c.model = preset.name;
  c.tp = o.tp;
  if (o.tp < 1 || preset.dims.num_heads % o.tp != 0) {
    invalid("--tp " + std::to_string(o.tp) + " must divide the " +
            std::to_string(preset.dims.num_heads) + " heads of " + preset.name);
  }
  // The DCP ranks split the heads as a tensor-parallel group does (each serves its own heads and
  // holds its share of every request's tokens).
  if (o.dcp < 1 || (preset.dims.num_heads / o.tp) % o.dcp != 0) {
    invalid("--dcp " + std::to_string(o.dcp) + " must divide the " +
            std::to_string(preset.dims.num_heads / o.tp) + " heads of " + preset.name +
            " per --tp rank");
  }
  if (o.dcp_interleave < 1) {
    invalid("--dcp-interleave must be >= 1, got " + std::to_string(o.dcp_interleave));
  }
  c.dims = preset.dims;
  c.dims.num_heads /= o.tp * o.dcp;
  c.dcp = DcpConfig{.world_size = o.dcp, .rank = 0, .interleave = o.dcp_interleave};
  c.scheduler.dcp_world_size = o.dcp;
  c.scheduler.dcp_interleave = o.dcp_interleave;
  c.scale = preset.scale;
  c.dtype = o.dtype.empty() ? preset.dtype : parse_dtype(o.dtype);
  c.kv_cache_dtype = parse_kv_cache_dtype(o.kv_cache_dtype);
  if (o.num_layers < 1) invalid("--num-layers must be >= 1, got " + std::to_string(o.num_layers));
  c.num_layers = o.num_layers;

  if (o.num_requests > kInt32Max) {
    invalid("--num-requests must be at most 2147483647 (request ids are int32), got " +
            std::to_string(o.num_requests));
  }
  c.workload.num_requests = o.num_requests;
  c.workload.prompt_len = sim::parse_len_range(o.prompt_len, "--prompt-len");
  c.workload.output_len = sim::parse_len_range(o.output_len, "--output-len");
  int64_t longest = 0;  // a request's tokens through forward: prompt + output - 1
  if (__builtin_add_overflow(c.workload.prompt_len.max, c.workload.output_len.max - 1, &longest) ||
      longest > kInt32Max) {
    invalid(
        "--prompt-len max + --output-len max - 1 must be at most 2147483647 (seq_lens are "
        "int32), got " +
        std::to_string(c.workload.prompt_len.max) + " + " +
        std::to_string(c.workload.output_len.max) + " - 1");
  }
  c.workload.shared_prefix_len = o.shared_prefix_len;
  c.workload.shared_prefix_fraction = o.shared_prefix_fraction;
  c.workload.seed = o.seed;

  if (o.block_size < 1) invalid("--block-size must be >= 1, got " + std::to_string(o.block_size));
  c.scheduler.block_size = o.block_size;
  c.scheduler.max_num_seqs = o.max_num_seqs;
  c.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  const KvCacheSpec spec{c.dims, c.kv_cache_dtype, c.dtype, o.block_size, 0};
  spec.validate();  // e.g. fp8_ds_mla with f32 activations
  if (o.kv_cache_gb != 0.0) {
    if (!std::isfinite(o.kv_cache_gb) || o.kv_cache_gb < 0.0 || o.kv_cache_gb > kMaxKvCacheGib) {
      invalid("--kv-cache-gb must be a finite number of GiB in (0, " +
              std::to_string(static_cast<int64_t>(kMaxKvCacheGib)) + "], got " +
              std::to_string(o.kv_cache_gb));
    }
    // In double: the product of the flags may exceed int64.
    const double bytes_per_block = static_cast<double>(o.num_layers) *
                                   static_cast<double>(o.block_size) *
                                   static_cast<double>(spec.entry_bytes());
    const double gib = 1024.0 * 1024.0 * 1024.0;  // bytes per GiB
    const double blocks = std::floor(o.kv_cache_gb * gib / bytes_per_block);
    if (blocks < 1.0) {
      invalid("--kv-cache-gb " + std::to_string(o.kv_cache_gb) + " holds no block of " +
              std::to_string(o.block_size) + " tokens over " + std::to_string(o.num_layers) +
              " layers; raise it");
    }
    if (blocks > static_cast<double>(kInt32Max)) {
      invalid("--kv-cache-gb " + std::to_string(o.kv_cache_gb) + " gives " +
              std::to_string(blocks) + " blocks per layer, more than 2147483647 (block ids are " +
              "int32); lower it or raise --block-size");
    }
    c.scheduler.num_blocks = static_cast<int64_t>(blocks);
  } else if (o.num_blocks > 0) {
    if (o.num_blocks > kInt32Max) {
      invalid("--num-blocks must be at most 2147483647 (block ids are int32), got " +
              std::to_string(o.num_blocks));
    }
    c.scheduler.num_blocks = o.num_blocks;
  } else {
    // Auto: room for as many of the largest possible requests as can run at once.
    // Under DCP the largest share of it (rank 0's).
    int64_t blocks = 0;
    if (__builtin_mul_overflow(
            std::min(o.max_num_seqs, o.num_requests),
            sim::blocks_for(sim::held_tokens(longest, c.scheduler), o.block_size), &blocks) ||
        blocks > kInt32Max) {
      invalid(
          "the automatic --num-blocks, min(--max-num-seqs, --num-requests) x blocks of the "
          "longest request (--prompt-len max + --output-len max - 1 tokens), exceeds "
          "2147483647 (block ids are int32); lower them or give --num-blocks");
    }
    c.scheduler.num_blocks = blocks;
  }
  c.workspace_tokens = o.workspace_tokens;
  c.device = parse_device(o.device);
  // The heads checked are at most the heads of this rank (the summary prints this count).
  c.verify = {o.verify, o.verify_every, std::min(o.verify_heads, c.dims.num_heads)};
  c.progress = !o.no_progress;
  c.cuda_graphs = o.cuda_graphs;
  if (c.cuda_graphs && !c.device.is_cuda()) {
    invalid("--cuda-graphs needs --device cuda (CUDA graphs replay GPU work), got --device " +
            o.device);
  }
  if (o.dcp > 1 && !c.device.is_cpu()) {
    invalid("--dcp runs its ranks on the CPU (MPI communicator); drop --device " + o.device);
  }
  return c;
}

}  // namespace mlakit::cli
