#include "run_memory.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "mlakit/dtype.hpp"
#include "mlakit/error.hpp"
#include "mlakit/kv_cache.hpp"

namespace mlakit::cli {

namespace {

// Host bytes per request beyond the Request itself: the scheduler's state (counters and its
// block-list vector header) and the workload's temporaries, rounded up.
constexpr double kRequestStateBytes = 128;
// Host bytes per KV block of the block allocator: a refcount, an optional prefix key, a free-list
// node (two pointers and the id) and its iterator, rounded up.
constexpr double kAllocatorBlockBytes = 96;
// Host bytes per layer object (MlaAttention's state, its Tensor handles and the vector slot),
// rounded up.
constexpr double kLayerObjectBytes = 1024;

double sum(const std::vector<MemoryPart>& parts) {
  return std::accumulate(parts.begin(), parts.end(), 0.0,
                         [](double total, const MemoryPart& p) { return total + p.bytes; });
}

std::string str(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f", value);
  return text;
}

}  // namespace

double RunMemory::host_bytes() const { return sum(host); }
double RunMemory::device_bytes() const { return sum(device); }

std::string format_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (unit < 5 && bytes >= 1024.0) {
    bytes /= 1024.0;
    ++unit;
  }
  char text[48];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.4g %s", bytes, kUnits[unit]);
  return text;
}

double host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

RunMemory estimate_run_memory(const RunConfig& c, const std::string& num_blocks_flag) {
  const MlaDims& d = c.dims;
  const double dtype_bytes = static_cast<double>(dtype_size(c.dtype));
  const double layers = static_cast<double>(c.num_layers);
  const double n = static_cast<double>(d.num_heads), l = static_cast<double>(d.kv_lora_rank),
               r = static_cast<double>(d.qk_rope_head_dim),
               p = static_cast<double>(d.qk_nope_head_dim), v = static_cast<double>(d.v_head_dim);
  const double num_blocks = static_cast<double>(c.scheduler.num_blocks);
  const double block_size = static_cast<double>(c.scheduler.block_size);
  const double t_max = static_cast<double>(c.scheduler.max_num_batched_tokens);
  const double seqs = static_cast<double>(c.scheduler.max_num_seqs);
  // The longest request: prompt max + output max - 1 tokens (resolve_run_options bounds it).
  const int64_t max_len = c.workload.prompt_len.max + c.workload.output_len.max - 1;
  const double max_blocks = std::ceil(static_cast<double>(max_len) / block_size);
  const KvCacheSpec spec{d, c.kv_cache_dtype, c.dtype, c.scheduler.block_size, 0};
  const double entry_bytes = static_cast<double>(spec.entry_bytes());
  const std::string layers_flag = "--num-layers " + std::to_string(c.num_layers);
  const std::string blocks_text =
      num_blocks_flag == "--num-blocks" ? "--num-blocks " + str(num_blocks)
      : num_blocks_flag == "--kv-cache-gb"
          ? str(num_blocks) + " blocks of --kv-cache-gb"
          : str(num_blocks) + " blocks (automatic --num-blocks: --max-num-seqs x the longest " +
                "request, --prompt-len max + --output-len max - 1)";

  RunMemory m;
  std::vector<MemoryPart>& dev = c.device.is_cpu() ? m.host : m.device;
  dev.push_back({"KV caches (" + layers_flag + " x " + blocks_text + " x --block-size " +
                     std::to_string(c.scheduler.block_size) + " x " + str(entry_bytes) +
                     " B per token)",
                 layers * num_blocks * block_size * entry_bytes});
  // kv_b_proj [N (P + V), L] and its absorbed halves W_UK_T [N, P, L] and W_UV [N, L, V].
  const double weight = n * (p + v) * l * dtype_bytes;
  dev.push_back(
      {"weights (" + layers_flag + " x " + format_bytes(2 * weight) + ")", layers * 2 * weight});
  m.host.push_back({"layer objects (" + layers_flag + ")", layers * kLayerObjectBytes});
  // q [T, N, P + R], [kv_c | k_pe] [T, L + R], out [T, N V]: host staging, device twins.
  const double step_rows = t_max * (n * (p + r) + (l + r) + n * v) * dtype_bytes;
  const std::string tokens_flag =
      "--max-num-batched-tokens " + std::to_string(c.scheduler.max_num_batched_tokens);
  m.host.push_back({"step buffers (" + tokens_flag + ")", step_rows});
  if (!c.device.is_cpu()) {
    m.device.push_back({"step buffers (" + tokens_flag + ", --max-num-seqs)",
                        step_rows + t_max * 8 + seqs * max_blocks * 4 +
                            (c.cuda_graphs ? layers * seqs * n * v * dtype_bytes : 0.0)});
  }
  // The workspace the library sizes for these limits (its own checks report a bad configuration
  // when the run starts).
  try {
    dev.push_back({"workspace (" + tokens_flag + ", --max-num-seqs, --prompt-len, --output-len)",
                   static_cast<double>(workspace_bytes(layer_config(c, max_len)))});
  } catch (const Error&) {
  }
  const double requests = static_cast<double>(c.workload.num_requests);
  m.host.push_back({"requests (--num-requests " + std::to_string(c.workload.num_requests) + ")",
                    requests * (sizeof(sim::Request) + kRequestStateBytes)});
  m.host.push_back({"block allocator (" + blocks_text + ")", num_blocks * kAllocatorBlockBytes});
  // Block lists of the running requests, and the step's block table.
  m.host.push_back(
      {"block tables (--prompt-len, --output-len, --max-num-seqs)", 2 * seqs * max_blocks * 4});
  if (c.verify.enabled) {
    const double heads = static_cast<double>(std::clamp<int64_t>(c.verify.heads, 1, d.num_heads));
    // The host mirror of each layer's cache in f32 (every block touched, at most) and the checked
    // heads' rows of kv_b_proj in f64.
    m.host.push_back({"--verify cache mirrors (" + layers_flag + " x " + blocks_text + ")",
                      layers * num_blocks * (block_size * (l + r) * 4 + 24)});
    m.host.push_back({"--verify weights (" + layers_flag + ", --verify-heads)",
                      layers * heads * (p + v) * l * 8});
  }
  return m;
}

void check_run_memory(const RunMemory& memory, double host_limit,
                      std::optional<double> device_limit) {
  auto check = [](const std::vector<MemoryPart>& parts, double limit, const char* where) {
    const double total = sum(parts);
    if (!(total > limit)) return;
    std::vector<MemoryPart> largest = parts;
    std::sort(largest.begin(), largest.end(),
              [](const MemoryPart& a, const MemoryPart& b) { return a.bytes > b.bytes; });
    std::string detail;
    for (const MemoryPart& p : largest) {
      if (p.bytes < 0.1 * total && !detail.empty()) break;  // the parts that matter
      detail += (detail.empty() ? "" : ", ") + p.what + " " + format_bytes(p.bytes);
    }
    throw Error(ErrorCode::kInvalidArgument,
                std::string("the run needs ") + format_bytes(total) + " of " + where +
                    " memory, more than the " + format_bytes(limit) + " " +
                    (where[0] == 'h' ? "this machine has" : "free on the device") + ": " + detail +
                    "; lower the flags named");
  };
  check(memory.host, host_limit, "host");
  if (device_limit) check(memory.device, *device_limit, "device");
}

}  // namespace mlakit::cli
