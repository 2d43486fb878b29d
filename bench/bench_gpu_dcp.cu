// The decode step of one MLA layer under decode context parallelism (DCP) over NCCL (issue 14;
// docs/dcp.md "Decode"): B requests of s_kv cached tokens each, DeepSeek-V3 dims (576-wide
// entries, 512-wide latent outputs), page size 64, bf16 ("auto") and fp8_e4m3 caches.
//
// One process drives the GPUs as tests/cuda/dcp_nccl_test.cpp does: ncclCommInitAll makes one
// communicator per device, one thread per device runs that rank. It runs every W in 1, 2, 4, ...
// up to the visible GPU count (and the count itself), so the W = 1 baseline of the speed-up is
// measured in the same run, on the same cards. h_q (--heads) is the model's query heads, the
// heads every rank's decode attends with: each rank owns h_q / W of them (N) and holds its 1/W
// share of every request's tokens (interleave 1), so a rank reads 1/W of the KV and does 1/W of
// the FLOPs of the W = 1 step. The cache is filled with random values directly in the layout DCP
// gives a rank (an ordinary paged cache of its local positions, docs/dcp.md "Placement").
//
// Per W and cache, every rank times (CUDA-graph replay, median of kReps after a warm-up, the
// ranks' threads meeting at a barrier before each replay):
//   step:    dist::dcp_gather_queries + ops::mla_decode (W N heads, local keys) +
//            dist::dcp_combine_heads (f32 exchange, as MlaAttention does)
//   decode:  the same ops::mla_decode alone
//   comm:    the step's three collectives alone, on the same buffers: all-gather of q (bf16
//            [B, N, 576] a rank), all-gather of the LSEs (f32 [B, W N]), reduce-scatter of the
//            corrected partials (f32 [W, B, N, 512] -> [B, N, 512])
// and reports the slowest rank's medians, the bytes a rank receives in the collectives (a ring
// collective receives W - 1 shares: docs/dcp.md's table) and comm / step. The KV of the full
// shape (1.2 GB for W = 1) dwarfs the 50-60 MiB L2, so no input rotation is needed; shapes shrunk
// with --batch/--seq-len may run from L2.
//
// NCCL_NVLS_ENABLE=0 is required on the lent machines (docs/dcp.md): set here when unset, before
// the communicators are created.
#include <cuda_runtime.h>

#include <cstdio>

#ifdef MLAKIT_WITH_NCCL
#include <nccl.h>

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dist/dcp_decode.hpp"
#include "gpu_bench_common.cuh"
#include "mlakit/dcp.hpp"
#include "mlakit/dist_nccl.hpp"
#include "mlakit/ops.hpp"

namespace {

using mlakit::Device;
using mlakit::DType;
using mlakit::KvCacheDType;
using mlakit::Tensor;
using mlakit::bench::check;

constexpr int64_t kPageSize = 64;     // issue 14's page size (vLLM's usual MLA block)
constexpr int64_t kEntry = 576;       // L + R: DeepSeek-V3's cache entry and absorbed q width
constexpr int64_t kLatent = 512;      // L: DeepSeek-V3's latent output width
constexpr int64_t kInterleave = 1;    // vLLM's default: positions go round the ranks one by one
constexpr float kScale = 0.1352338f;  // DeepSeek-V3's softmax scale (DESIGN.md §1)
// fp8: the random q (bf16 in [-1, 1)) needs no scaling to fit e4m3; timing ignores the values.
constexpr float kQScale = 1.0f;
constexpr float kKScale = 1.0f;  // likewise for the cache's e4m3 bytes
constexpr int kReps = 20;        // timed replays per measurement (issue 14 asks >= 10)

struct Shape {
  int64_t batch = 8;         // B: issue 14's decode batch
  int64_t seq_len = 131072;  // s_kv: 128 Ki cached tokens a request
  int64_t heads = 128;       // h_q: DeepSeek-V3's query heads at TP 1
};

std::string shape_label(const Shape& s) {
  return mlakit::bench::format("B%ld s_kv %ld h_q %ld", s.batch, s.seq_len, s.heads);
}

// Bytes one rank receives in each collective of the step (ring: W - 1 shares of each).
struct CommBytes {
  int64_t queries, lse, partials;
  int64_t total() const { return queries + lse + partials; }
};
CommBytes comm_bytes(const Shape& s, int64_t w) {
  const int64_t n = s.heads / w;
  const int64_t bf16 = mlakit::dtype_size(DType::kBF16), f32 = mlakit::dtype_size(DType::kF32);
  return {(w - 1) * s.batch * n * kEntry * bf16, (w - 1) * s.batch * s.heads * f32,
          (w - 1) * s.batch * n * kLatent * f32};
}

// Everything one rank's step reads and writes, on its device.
struct RankBuffers {
  Tensor q_local;           // bf16 [B, N, 576]: this rank's absorbed queries
  Tensor gathered_queries;  // bf16 [W, B, N, 576]
  Tensor q_all;             // [B, W N, 576]: bf16, or u8 (e4m3) for an fp8 cache
  Tensor cache;             // [blocks, 64, 576]: bf16, or u8 (e4m3); this rank's local positions
  Tensor block_table;       // i32 [B, width]
  Tensor seq_lens;          // i32 [B]: this rank's local lengths
  Tensor partial_out;       // f32 [B, 1, W N, 512]
  Tensor partial_lse;       // f32 [B, 1, W N]
  Tensor workspace;         // f32 [mla_decode_workspace_elems]: splits and the work plan
  Tensor gathered_lse;      // f32 [W, B, W N]
  Tensor corrected;         // f32 [W, B, N, 512]
  Tensor out;               // f32 [B, N, 512]: this rank's heads, combined
  mlakit::DecodeSchedule schedule;
};

// Zeroes a tensor (any values time alike; zeros keep the sums finite).
void zero(const Tensor& t) {
  check(cudaMemset(t.view().data, 0, t.numel() * t.view().element_size()), "cudaMemset");
}

// Requests own consecutive pages: at 72 KiB (bf16) a page, their order does not change the reads.
Tensor block_table(int64_t batch, int64_t width, Device gpu) {
  std::vector<int32_t> table(batch * width);
  std::iota(table.begin(), table.end(), 0);
  Tensor t = Tensor::empty({batch, width}, DType::kI32, gpu);
  check(cudaMemcpy(t.view().data, table.data(), table.size() * sizeof(int32_t),
                   cudaMemcpyHostToDevice),
        "block table");
  return t;
}

RankBuffers make_buffers(const Shape& s, KvCacheDType kv, int64_t w, int64_t rank,
                         cudaStream_t stream) {
  const Device gpu = Device::cuda(static_cast<int>(rank));
  const int64_t b = s.batch, n = s.heads / w, h = s.heads;
  const int64_t local_len = mlakit::dcp_local_seq_len(s.seq_len, w, rank, kInterleave);
  const int64_t width = std::max<int64_t>(1, (local_len + kPageSize - 1) / kPageSize);
  const DType cache_dtype = kv == KvCacheDType::kAuto ? DType::kBF16 : DType::kU8;
  RankBuffers k;
  k.q_local = Tensor::empty({b, n, kEntry}, DType::kBF16, gpu);
  k.gathered_queries = Tensor::empty({w, b, n, kEntry}, DType::kBF16, gpu);
  k.q_all = Tensor::empty({b, h, kEntry}, cache_dtype, gpu);
  k.cache = Tensor::empty({b * width, kPageSize, kEntry}, cache_dtype, gpu);
  k.block_table = block_table(b, width, gpu);
  const std::vector<int32_t> lens(b, static_cast<int32_t>(local_len));
  k.seq_lens = Tensor::empty({b}, DType::kI32, gpu);
  check(
      cudaMemcpy(k.seq_lens.view().data, lens.data(), b * sizeof(int32_t), cudaMemcpyHostToDevice),
      "seq_lens");
  k.partial_out = Tensor::empty({b, 1, h, kLatent}, DType::kF32, gpu);
  k.partial_lse = Tensor::empty({b, 1, h}, DType::kF32, gpu);
  k.gathered_lse = Tensor::empty({w, b, h}, DType::kF32, gpu);
  k.corrected = Tensor::empty({w, b, n, kLatent}, DType::kF32, gpu);
  k.out = Tensor::empty({b, n, kLatent}, DType::kF32, gpu);
  const mlakit::DecodeSchedule schedule =
      mlakit::ops::plan_mla_decode({.device = gpu,
                                    .batch = b,
                                    .s_q = 1,
                                    .num_heads = h,
                                    .block_size = kPageSize,
                                    .max_seq_len = width * kPageSize},
                                   {});
  k.workspace = Tensor::empty(
      {std::max<int64_t>(1, mlakit::ops::mla_decode_workspace_elems(schedule, 1, h, kLatent))},
      DType::kF32, gpu);
  const uint64_t seed = 1000 * static_cast<uint64_t>(rank);  // other values on every rank
  mlakit::bench::fill(k.q_local, seed);
  mlakit::bench::fill(k.q_all, seed + 1);
  mlakit::bench::fill(k.cache, seed + 2);
  for (const Tensor* t : {&k.partial_out, &k.partial_lse, &k.gathered_lse, &k.corrected, &k.out})
    zero(*t);
  check(cudaDeviceSynchronize(), "fill");
  // The work plan written once ahead, as plan_step does for every layer of an engine step.
  k.schedule = mlakit::ops::mla_decode_plan_ahead(schedule, k.block_table, k.seq_lens, kPageSize,
                                                  kLatent, k.workspace, mlakit::Stream{stream});
  check(cudaStreamSynchronize(stream), "plan ahead");
  return k;
}

void local_decode(const RankBuffers& k, KvCacheDType kv, cudaStream_t stream) {
  const int64_t b = k.q_all.size(0), h = k.q_all.size(1);
  const mlakit::ops::DecodeParams params{.scale = kScale,
                                         .kv_dtype = kv,
                                         .q_scale = kQScale,
                                         .k_scale = kKScale,
                                         .kv_lora_rank = kLatent};
  mlakit::ops::mla_decode(k.q_all.view().reshape({b, 1, h, kEntry}), k.cache, k.block_table,
                          k.seq_lens, k.partial_out, k.partial_lse, params, k.schedule, k.workspace,
                          mlakit::Stream{stream});
}

void collectives(mlakit::dist::Communicator& comm, const RankBuffers& k, cudaStream_t stream) {
  const int64_t b = k.q_all.size(0), h = k.q_all.size(1);
  comm.all_gather(k.q_local, k.gathered_queries, mlakit::Stream{stream});
  comm.all_gather(k.partial_lse.view().reshape({b, h}), k.gathered_lse, mlakit::Stream{stream});
  comm.reduce_scatter_sum(k.corrected, k.out, mlakit::Stream{stream});
}

void dcp_step(mlakit::dist::Communicator& comm, const RankBuffers& k, KvCacheDType kv,
              cudaStream_t stream) {
  const int64_t b = k.q_all.size(0), h = k.q_all.size(1);
  const bool fp8 = kv != KvCacheDType::kAuto;
  mlakit::dist::dcp_gather_queries(comm, k.q_local, k.gathered_queries, k.q_all,
                                   fp8 ? std::optional<float>(kQScale) : std::nullopt,
                                   mlakit::Stream{stream});
  local_decode(k, kv, stream);
  mlakit::dist::dcp_combine_heads(comm, k.partial_out.view().reshape({b, h, kLatent}),
                                  k.partial_lse.view().reshape({b, h}), k.gathered_lse, k.corrected,
                                  k.out, mlakit::Stream{stream});
}

// Median (µs) of kReps replays of a CUDA graph of `fn`, captured on this thread's `stream`; every
// rank's thread meets at `barrier` before each replay, so the ranks launch together and a rank's
// time includes its wait for the others in the collectives.
template <class Fn>
double replay_us(cudaStream_t stream, std::barrier<>& barrier, const Fn& fn) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  fn();
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const double ms = mlakit::bench::median_ms(
      stream, kReps, [&] { barrier.arrive_and_wait(); },
      [&] { check(cudaGraphLaunch(exec, stream), "replay"); });
  check(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
  check(cudaGraphDestroy(graph), "cudaGraphDestroy");
  return ms * 1e3;
}

struct Times {
  double step_us = 0, decode_us = 0, comm_us = 0;
};

// One rank of one (W, cache) case. An eager step first sets up NCCL's connections outside the
// captures.
Times run_rank(mlakit::dist::Communicator& comm, const Shape& s, KvCacheDType kv,
               std::barrier<>& barrier) {
  check(cudaSetDevice(comm.device().index), "cudaSetDevice");
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  Times t;
  {
    const RankBuffers k = make_buffers(s, kv, comm.world_size(), comm.rank(), stream);
    dcp_step(comm, k, kv, stream);
    check(cudaStreamSynchronize(stream), "eager step");
    t.step_us = replay_us(stream, barrier, [&] { dcp_step(comm, k, kv, stream); });
    t.decode_us = replay_us(stream, barrier, [&] { local_decode(k, kv, stream); });
    t.comm_us = replay_us(stream, barrier, [&] { collectives(comm, k, stream); });
    mlakit::ops::check_device_errors(comm.device(), mlakit::Stream{stream});
  }
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return t;
}

struct Row {
  std::string shape, kv;
  int64_t w;
  Times t;  // the slowest rank's medians
  int64_t comm_bytes;
  double comm_share() const { return t.comm_us / t.step_us; }
};

// Every rank of a group of w (GPUs 0 .. w - 1), one thread each; the slowest rank's times.
Times run_world(int64_t w, const Shape& s, KvCacheDType kv) {
  std::vector<ncclComm_t> comms(w);
  if (ncclCommInitAll(comms.data(), static_cast<int>(w), nullptr) != ncclSuccess) {
    std::fprintf(stderr, "bench_gpu_dcp: ncclCommInitAll over %ld GPUs failed\n", w);
    std::exit(1);
  }
  std::vector<Times> per_rank(w);
  std::barrier<> barrier(w);
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < w; ++rank) {
    threads.emplace_back([&, rank] {
      const auto comm = mlakit::dist::make_nccl_communicator(comms[rank], static_cast<int>(rank));
      per_rank[rank] = run_rank(*comm, s, kv, barrier);
    });
  }
  for (std::thread& t : threads) t.join();
  for (ncclComm_t comm : comms) ncclCommDestroy(comm);
  Times slowest;
  for (const Times& t : per_rank) {
    slowest.step_us = std::max(slowest.step_us, t.step_us);
    slowest.decode_us = std::max(slowest.decode_us, t.decode_us);
    slowest.comm_us = std::max(slowest.comm_us, t.comm_us);
  }
  return slowest;
}

// 1, 2, 4, ... up to `count`, and `count` itself.
std::vector<int64_t> world_sizes(int64_t count) {
  std::vector<int64_t> sizes;
  for (int64_t w = 1; w <= count; w *= 2) sizes.push_back(w);
  if (sizes.back() != count) sizes.push_back(count);
  return sizes;
}

void print_row(const Row& r, double baseline_step_us) {
  std::printf("%3ld %-9s %9.1f %9.1f %9.1f %9.3f %6.1f%% %8.2fx\n", r.w, r.kv.c_str(), r.t.step_us,
              r.t.decode_us, r.t.comm_us, r.comm_bytes / 1e6, 100.0 * r.comm_share(),
              baseline_step_us / r.t.step_us);
  std::fflush(stdout);
}

// A JSON list of {shape, kv, W, step_us, decode_us, comm_us, comm_bytes, comm_share, commit}.
void write_json(const std::string& path, const std::vector<Row>& rows, const std::string& commit) {
  std::vector<std::string> lines;
  for (const Row& r : rows) {
    lines.push_back(mlakit::bench::format(
        "{\"shape\": \"%s\", \"kv\": \"%s\", \"W\": %ld, \"step_us\": %.1f, "
        "\"decode_us\": %.1f, \"comm_us\": %.1f, \"comm_bytes\": %ld, \"comm_share\": %.3f, "
        "\"commit\": \"%s\"}",
        r.shape.c_str(), r.kv.c_str(), r.w, r.t.step_us, r.t.decode_us, r.t.comm_us, r.comm_bytes,
        r.comm_share(), commit.c_str()));
  }
  mlakit::bench::write_json_rows(path, "bench_gpu_dcp", lines);
}

struct Options {
  Shape shape;
  std::string json_path, commit;
};

// A positive integer option value, or exit 2.
int64_t positive(const char* name, const char* text) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value <= 0) {
    std::fprintf(stderr, "bench_gpu_dcp: %s takes a positive integer, got %s\n", name, text);
    std::exit(2);
  }
  return value;
}

Options parse(int argc, char** argv) {
  Options o;
  const char* env_commit = std::getenv("MLAKIT_COMMIT");
  o.commit = env_commit != nullptr ? env_commit : "unknown";
  for (int i = 1; i < argc; i += 2) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (value != nullptr && arg == "--json") {
      o.json_path = value;
    } else if (value != nullptr && arg == "--commit") {
      o.commit = value;
    } else if (value != nullptr && arg == "--batch") {
      o.shape.batch = positive("--batch", value);
    } else if (value != nullptr && arg == "--seq-len") {
      o.shape.seq_len = positive("--seq-len", value);
    } else if (value != nullptr && arg == "--heads") {
      o.shape.heads = positive("--heads", value);
    } else {
      std::fprintf(stderr,
                   "usage: bench_gpu_dcp [--json PATH] [--commit HASH] [--batch B] [--seq-len S] "
                   "[--heads H]\n");
      std::exit(2);
    }
  }
  return o;
}

}  // namespace

// Usage: bench_gpu_dcp [--json PATH] [--commit HASH] [--batch B] [--seq-len S] [--heads H]
//   --json     also write the rows as JSON to PATH (bench/results/<date>-h200xW-dcp.json)
//   --commit   the commit the rows are recorded against (default: $MLAKIT_COMMIT, else "unknown")
//   --batch, --seq-len, --heads   shrink the shape (default B 8, s_kv 131072, h_q 128); H must be
//              a multiple of every W run
int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_gpu_dcp: no CUDA device\n");
    return 0;
  }
  const std::vector<int64_t> sizes = world_sizes(count);
  for (int64_t w : sizes) {
    if (o.shape.heads % w != 0) {
      std::fprintf(stderr, "bench_gpu_dcp: --heads %ld is not a multiple of W = %ld\n",
                   o.shape.heads, w);
      return 2;
    }
  }
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("%d x %s; NCCL_NVLS_ENABLE=%s; commit %s\n", count, prop.name,
              std::getenv("NCCL_NVLS_ENABLE"), o.commit.c_str());
  const std::string shape = shape_label(o.shape);
  std::printf("DCP decode step, %s, page %ld, interleave %ld; the slowest rank's medians of %d\n",
              shape.c_str(), kPageSize, kInterleave, kReps);
  for (int64_t w : sizes) {
    const CommBytes bytes = comm_bytes(o.shape, w);
    std::printf("W %ld: a rank receives %.3f MB of q, %.3f MB of LSEs, %.3f MB of partials\n", w,
                bytes.queries / 1e6, bytes.lse / 1e6, bytes.partials / 1e6);
  }
  std::printf(
      "The W = 1 row of each cache is the baseline of the speed-up: issue 14 asks W = 2 "
      ">= 1.6x and W = 4 >= 2.8x.\n\n");
  std::printf("%3s %-9s %9s %9s %9s %9s %7s %9s\n", "W", "kv", "step us", "decode us", "comm us",
              "comm MB", "comm %", "speed-up");
  std::vector<Row> rows;
  for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3}) {
    const std::string kv_name = kv == KvCacheDType::kAuto ? "bf16" : "fp8_e4m3";
    double baseline_step_us = 0;
    for (int64_t w : sizes) {
      const Row row{shape, kv_name, w, run_world(w, o.shape, kv), comm_bytes(o.shape, w).total()};
      if (w == 1) baseline_step_us = row.t.step_us;
      print_row(row, baseline_step_us);
      rows.push_back(row);
    }
  }
  if (!o.json_path.empty()) write_json(o.json_path, rows, o.commit);
  return 0;
}

#else

int main() {
  std::printf("bench_gpu_dcp: no NCCL in this build (MLAKIT_WITH_NCCL off)\n");
  return 0;
}

#endif  // MLAKIT_WITH_NCCL
