// CUDA absorbed-MQA decode (ops::mla_decode on device tensors, with the library's schedule from
// plan_mla_decode) against this GPU's ceilings, measured in the same run: device-to-device copy
// bandwidth (cudaMemcpy of 2 GiB, read + write bytes), streaming-read bandwidth (a 16-byte-load
// kernel over 2 GiB) and the bf16 matrix peak (cublasGemmEx 8192^3, bf16 in/out, f32 compute).
// Memory floor = bytes / read bandwidth, compute floor = FLOPs / bf16 peak, floor = the larger, as
// in PERF.md; bytes = KV + q + out (+ lse), FLOPs = 2 s_q h_q sum(s_kv) (576 + 512).
// Rows: every shape of issue 8's table (with FlashMLA's µs from PERF.md and the ratio), the same
// shapes with a batch-invariant schedule (its cost), and the s_q x h_q grid at B64 s_kv 4096.
// Each case cycles through enough copies of all its inputs that one cycle reads more than 3x the
// L2 (180 MiB on an H200); one CUDA graph holds one decode per copy; per-decode time = replay
// time / copies; median of kReps replays. Two times per row: "us" with each copy's work plan
// written ahead by mla_decode_plan_ahead outside the graph (what each layer of an engine step pays,
// and how FlashMLA's times leave out its get_mla_metadata: the figure compared with FlashMLA), and
// "self-plan" with the op's own plan kernel in the graph. --json PATH also writes the rows.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/decode/schedule.hpp"
#include "gpu_bench_common.cuh"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/plan.hpp"

namespace {

// PERF.md's decode floor: max(bytes / 4.46 TB/s, FLOPs / 667 TF/s), the ceilings its anchors and
// the issue's bars are stated against (this run's measured ceilings give the stricter "floor").
constexpr double kPerfReadGbs = 4460.0;
constexpr double kPerfTflops = 667.0;

using mlakit::Device;
using mlakit::DType;
using mlakit::KvCacheDType;
using mlakit::Tensor;

constexpr int kReps = 7;                              // timed replays per measurement (median)
constexpr int64_t kCeilingBytes = int64_t{2} << 30;   // 2 GiB: > 30x the 60 MiB L2
constexpr int64_t kRotateBytes = int64_t{180} << 20;  // 3x L2: one cycle of copies exceeds it
constexpr int kGemmN = 8192;                          // PERF.md's bf16 ceiling GEMM, 8192^3
constexpr int64_t kPageSize = 64;                     // PERF.md's decode grid page size
constexpr float kScale = 0.1352338f;                  // DeepSeek-V3 softmax scale

using mlakit::bench::check;
using mlakit::bench::fill;

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s failed: cuBLAS status %d\n", what, static_cast<int>(status));
    std::exit(1);
  }
}

// Median of kReps timings (ms) of `fn` on `stream`, after one warm-up call.
template <class Fn>
double median_ms(cudaStream_t stream, const Fn& fn) {
  return mlakit::bench::median_ms(
      stream, kReps, [] {}, fn);
}

// ---- ceilings
// --------------------------------------------------------------------------------------

// Reads n 16-byte vectors once (streaming loads, four in flight per thread per unrolled step).
__global__ void stream_read(const uint4* __restrict__ data, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
#pragma unroll 4
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldcs(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;  // keeps the loads; practically never stores
}

struct Ceilings {
  double copy_gbs, read_gbs, bf16_tflops;
};

Ceilings measure_ceilings(cudaStream_t stream, int num_sms) {
  Ceilings c{};
  void *src = nullptr, *dst = nullptr;
  uint32_t* sink = nullptr;
  check(cudaMalloc(&src, kCeilingBytes), "cudaMalloc");
  check(cudaMalloc(&dst, kCeilingBytes), "cudaMalloc");
  check(cudaMalloc(&sink, sizeof(uint32_t)), "cudaMalloc");
  check(cudaMemset(src, 1, kCeilingBytes), "cudaMemset");
  const double copy_ms = median_ms(stream, [&] {
    check(cudaMemcpyAsync(dst, src, kCeilingBytes, cudaMemcpyDeviceToDevice, stream), "copy");
  });
  c.copy_gbs = 2.0 * kCeilingBytes / (copy_ms * 1e-3) / 1e9;
  const double read_ms = median_ms(stream, [&] {
    stream_read<<<num_sms * 8, 512, 0, stream>>>(static_cast<const uint4*>(src), kCeilingBytes / 16,
                                                 sink);
  });
  c.read_gbs = kCeilingBytes / (read_ms * 1e-3) / 1e9;
  check(cudaFree(src), "cudaFree");
  check(cudaFree(dst), "cudaFree");
  check(cudaFree(sink), "cudaFree");

  const int64_t n = kGemmN;
  const Tensor a = Tensor::empty({n, n}, DType::kBF16, Device::cuda(0));
  const Tensor b = Tensor::empty({n, n}, DType::kBF16, Device::cuda(0));
  const Tensor d = Tensor::empty({n, n}, DType::kBF16, Device::cuda(0));
  fill(a, 1);
  fill(b, 2);
  cublasHandle_t handle;
  check(cublasCreate(&handle), "cublasCreate");
  check(cublasSetStream(handle, stream), "cublasSetStream");
  const float alpha = 1.0f, beta = 0.0f;
  const double gemm_ms = median_ms(stream, [&] {
    check(
        cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, kGemmN, kGemmN, kGemmN, &alpha,
                     a.view().data, CUDA_R_16BF, kGemmN, b.view().data, CUDA_R_16BF, kGemmN, &beta,
                     d.view().data, CUDA_R_16BF, kGemmN, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  });
  c.bf16_tflops = 2.0 * n * n * n / (gemm_ms * 1e-3) / 1e12;
  cublasDestroy(handle);
  return c;
}

// ---- FlashMLA anchors
// ----------------------------------------------------------------------------

// FlashMLA 9241ae3 (sm90 dense decode, bf16 cache, page 64) on one H200, measured side by side with
// mlakit 1534446 in one process: same tensors, CUDA-graph replay, median of 5, inputs rotated past
// 3x L2. Copied from ../shared/PERF.md, "Side by side, 2026-12-03" (issue 8's table). FlashMLA has
// no fp8 cache; its varlen row used its own draw of lengths in [1, 8192].
struct FlashMlaAnchor {
  const char* shape;
  double us;
};
constexpr FlashMlaAnchor kFlashMlaAnchorsPerfMd[] = {
    {"B128 s_kv 4096 h_q 16", 151.0},        {"B128 s_kv 8192 h_q 16", 294.4},
    {"B32 s_kv 1024 h_q 16", 20.2},          {"B64 s_kv 1024 h_q 16", 30.4},
    {"B128 s_kv 4096 h_q 128", 256.5},       {"B128 s_kv 8192 h_q 128", 496.3},
    {"B128 s_kv 8192 h_q 128 s_q 2", 956.2}, {"B1 s_kv 4096 h_q 128", 19.4},
    {"B4 s_kv 32768 h_q 128", 78.8},         {"B128 s_kv U[1,8192] h_q 128", 278.7},
};

// FlashMLA's µs for `shape` (a bf16 row of the anchor table), 0 when it has none.
double flashmla_us(const std::string& shape, KvCacheDType kv) {
  if (kv != KvCacheDType::kAuto) return 0;
  for (const FlashMlaAnchor& a : kFlashMlaAnchorsPerfMd) {
    if (shape == a.shape) return a.us;
  }
  return 0;
}

// ---- decode cases ------------------------------------------------------------------------------

// The seed of the varlen row's lengths (uniform in [1, 8192]): fixed, so every run times the same
// batch.
constexpr uint64_t kVarlenSeed = 8192;

struct Case {
  std::string shape;              // as issue 8 and PERF.md name it
  std::vector<int32_t> seq_lens;  // [B]
  int64_t heads, s_q;
  KvCacheDType kv_dtype;
  bool batch_invariant;
  // q's dtype: bf16, or fp8 e4m3 (FlashMLA's fp8 contract: q quantized too, f16 MMAs).
  DType q_dtype = DType::kBF16;
};

// The cache format and, for fp8_e4m3, q's dtype: "bf16", "fp8_e4m3" (fp8 q, f16 MMAs: the rows
// recorded before 2026-12-03 21:00 UTC), "fp8_e4m3 q bf16" (bf16 MMAs), "fp8_ds_mla" (bf16 q).
std::string kv_label(const Case& c) {
  switch (c.kv_dtype) {
    case KvCacheDType::kAuto:
      return "bf16";
    case KvCacheDType::kFp8E4m3:
      return c.q_dtype == DType::kBF16 ? "fp8_e4m3 q bf16" : "fp8_e4m3";
    default:
      return "fp8_ds_mla";
  }
}

// Bytes of one cache entry (kv_cache.hpp).
int64_t entry_bytes_of(KvCacheDType kv) {
  switch (kv) {
    case KvCacheDType::kAuto:
      return 1152;  // 576 bf16
    case KvCacheDType::kFp8E4m3:
      return 576;  // 576 e4m3
    default:
      return 656;  // 512 e4m3, 4 f32 scales, 64 bf16 rope values
  }
}

Case uniform_case(int64_t batch, int64_t s_kv, int64_t heads, int64_t s_q, KvCacheDType kv,
                  bool invariant) {
  char shape[64];
  std::snprintf(shape, sizeof(shape), "B%ld s_kv %ld h_q %ld", batch, s_kv, heads);
  if (s_q > 1) {
    std::snprintf(shape + std::strlen(shape), sizeof(shape) - std::strlen(shape), " s_q %ld", s_q);
  }
  return {shape,    std::vector<int32_t>(batch, static_cast<int32_t>(s_kv)), heads, s_q, kv,
          invariant};
}

Case varlen_case(bool invariant) {
  std::mt19937_64 rng(kVarlenSeed);
  std::uniform_int_distribution<int32_t> len(1, 8192);
  std::vector<int32_t> lens(128);
  for (int32_t& l : lens) l = len(rng);
  return {"B128 s_kv U[1,8192] h_q 128", lens, 128, 1, KvCacheDType::kAuto, invariant};
}

// All inputs and outputs of one decode call.
struct Copy {
  Tensor q, cache, block_table, seq_lens, out, lse, workspace;
};

Copy make_copy(const Case& c, int64_t width, const mlakit::DecodeSchedule& schedule,
               std::mt19937_64& rng, uint64_t seed) {
  const bool native = c.kv_dtype == KvCacheDType::kAuto;
  const int64_t batch = static_cast<int64_t>(c.seq_lens.size());
  int64_t num_blocks = 0;
  for (int32_t len : c.seq_lens) num_blocks += (len + kPageSize - 1) / kPageSize;
  const Device gpu = Device::cuda(0);
  Copy k;
  const int64_t entry = native ? 576 : entry_bytes_of(c.kv_dtype);
  k.q = Tensor::empty({batch, c.s_q, c.heads, 576}, c.q_dtype, gpu);
  k.cache = Tensor::empty({num_blocks, kPageSize, entry}, native ? DType::kBF16 : DType::kU8, gpu);
  fill(k.q, seed);
  fill(k.cache, seed + 1);  // u8 storage is filled as finite e4m3
  if (c.kv_dtype == KvCacheDType::kFp8DsMla) {
    // The four f32 scales and the 64 bf16 rope values of each entry: bytes 0x3c make both finite
    // (f32 0x3c3c3c3c and bf16 0x3c3c are ~0.0115); the timing does not depend on the values.
    constexpr int kScaleOffset = 512, kFiniteByte = 0x3c, kScaleAndRopeBytes = 656 - 512;
    check(cudaMemset2D(static_cast<uint8_t*>(k.cache.view().data) + kScaleOffset, entry,
                       kFiniteByte, kScaleAndRopeBytes, num_blocks * kPageSize),
          "ds_mla scales");
  }
  // Requests own shuffled pages, as a paged allocator hands them out.
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> table(batch * width, 0);
  int64_t next = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t col = 0; col < (c.seq_lens[b] + kPageSize - 1) / kPageSize; ++col) {
      table[b * width + col] = ids[next++];
    }
  }
  k.block_table = Tensor::empty({batch, width}, DType::kI32, gpu);
  k.seq_lens = Tensor::empty({batch}, DType::kI32, gpu);
  check(
      cudaMemcpy(k.block_table.view().data, table.data(), table.size() * 4, cudaMemcpyHostToDevice),
      "table");
  check(cudaMemcpy(k.seq_lens.view().data, c.seq_lens.data(), c.seq_lens.size() * 4,
                   cudaMemcpyHostToDevice),
        "lens");
  k.out = Tensor::empty({batch, c.s_q, c.heads, 512}, DType::kBF16, gpu);
  k.lse = Tensor::empty({batch, c.s_q, c.heads}, DType::kF32, gpu);
  k.workspace = Tensor::empty({std::max<int64_t>(1, mlakit::ops::mla_decode_workspace_elems(
                                                        schedule, c.s_q, c.heads, 512))},
                              DType::kF32, gpu);
  return k;
}

struct Row {
  std::string shape, kv;
  double mlakit_us;         // work plan written ahead (the engine's per-layer cost)
  double self_planning_us;  // the op's own plan kernel included
  double flashmla_us, floor_us;
};

// forced_parts > 0: that many parts per row tile instead of the library's choice (one CTA per SM).
Row run_case(const Case& c, const Ceilings& ceil, int64_t forced_parts, cudaStream_t stream) {
  const int64_t batch = static_cast<int64_t>(c.seq_lens.size());
  const int64_t entry_bytes = entry_bytes_of(c.kv_dtype);
  const int64_t elem = dtype_size(c.q_dtype);  // q bytes per value
  int64_t keys = 0, max_len = 0;
  for (int32_t len : c.seq_lens) {
    keys += len;
    max_len = std::max<int64_t>(max_len, len);
  }
  const int64_t width = (max_len + kPageSize - 1) / kPageSize;
  const int64_t kv_bytes = keys * entry_bytes;
  const int64_t q_bytes = batch * c.s_q * c.heads * 576 * elem;
  const int64_t out_bytes = batch * c.s_q * c.heads * (512 * 2 + 4);
  const int64_t bytes = kv_bytes + q_bytes + out_bytes;
  const double flops = 2.0 * c.s_q * c.heads * double(keys) * (576 + 512);

  // The library's schedule: from the shape only (the lengths' bound is the table's width).
  const mlakit::DecodeSchedule schedule =
      forced_parts > 0
          ? mlakit::cuda::device_decode_schedule(batch, c.s_q, c.heads, width * kPageSize,
                                                 forced_parts, c.batch_invariant)
          : mlakit::ops::plan_mla_decode({Device::cuda(0), batch, c.s_q, c.heads, kPageSize,
                                          width * kPageSize, c.batch_invariant},
                                         {});
  const int copies = static_cast<int>(std::max<int64_t>(1, (kRotateBytes + bytes - 1) / bytes));
  std::mt19937_64 rng(42);
  std::vector<Copy> k;
  for (int i = 0; i < copies; ++i) k.push_back(make_copy(c, width, schedule, rng, 100 + 10 * i));
  check(cudaDeviceSynchronize(), "fill");

  const mlakit::ops::DecodeParams params{kScale, c.kv_dtype, 1.0f, 1.0f, /*kv_lora_rank=*/512};
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  for (const Copy& x : k) {
    mlakit::ops::mla_decode(x.q, x.cache, x.block_table, x.seq_lens, x.out, x.lse, params, schedule,
                            x.workspace, mlakit::Stream{stream});
  }
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const double self_planning_ms =
      median_ms(stream, [&] { check(cudaGraphLaunch(exec, stream), "replay"); }) / copies;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  // The same decodes with their work plans written ahead (mla_decode_plan_ahead, outside the
  // graph), as an engine step plans once for all its layers and as FlashMLA's timings exclude its
  // get_mla_metadata: the figure compared with FlashMLA.
  std::vector<mlakit::DecodeSchedule> ahead;
  for (const Copy& x : k) {
    ahead.push_back(mlakit::ops::mla_decode_plan_ahead(
        schedule, x.block_table, x.seq_lens, kPageSize, 512, x.workspace, mlakit::Stream{stream}));
  }
  check(cudaStreamSynchronize(stream), "plan ahead");
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  for (size_t i = 0; i < k.size(); ++i) {
    const Copy& x = k[i];
    mlakit::ops::mla_decode(x.q, x.cache, x.block_table, x.seq_lens, x.out, x.lse, params, ahead[i],
                            x.workspace, mlakit::Stream{stream});
  }
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const double ms =
      median_ms(stream, [&] { check(cudaGraphLaunch(exec, stream), "replay"); }) / copies;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  mlakit::ops::check_device_errors(Device::cuda(0), mlakit::Stream{stream});

  const double us = ms * 1e3, self_planning_us = self_planning_ms * 1e3;
  const double memory_floor_us = bytes / (ceil.read_gbs * 1e9) * 1e6;
  const double compute_floor_us = flops / (ceil.bf16_tflops * 1e12) * 1e6;
  const double floor_us = std::max(memory_floor_us, compute_floor_us);
  const double perf_floor_us =
      std::max(bytes / (kPerfReadGbs * 1e9), flops / (kPerfTflops * 1e12)) * 1e6;
  Row row{
      c.shape + (c.batch_invariant ? " batch-invariant" : ""),    kv_label(c), us, self_planning_us,
      c.batch_invariant ? 0.0 : flashmla_us(c.shape, c.kv_dtype), floor_us};
  char ratio[16] = "      -";
  if (row.flashmla_us > 0) std::snprintf(ratio, sizeof(ratio), "%7.2f", us / row.flashmla_us);
  char anchor[16] = "      -";
  if (row.flashmla_us > 0) std::snprintf(anchor, sizeof(anchor), "%7.1f", row.flashmla_us);
  std::printf("%-44s %-15s %5ld %9.1f %9.1f %6.0f %6.1f %8.1f %8.1f %6.1f%% %6.1f%% %s %s\n",
              row.shape.c_str(), row.kv.c_str(), schedule.device.num_parts, us, self_planning_us,
              bytes / (us * 1e-6) / 1e9, flops / (us * 1e-6) / 1e12, memory_floor_us,
              compute_floor_us, 100.0 * floor_us / us, 100.0 * perf_floor_us / us, anchor, ratio);
  std::fflush(stdout);
  return row;
}

// The machine-readable rows: a JSON list of {shape, kv, mlakit_us, flashmla_us (null without an
// anchor), floor_us, commit}.
void write_json(const std::string& path, const std::vector<Row>& rows, const std::string& commit) {
  std::vector<std::string> lines;
  for (const Row& r : rows) {
    const std::string anchor =
        r.flashmla_us > 0 ? mlakit::bench::format("%.1f", r.flashmla_us) : "null";
    lines.push_back(mlakit::bench::format(
        "{\"shape\": \"%s\", \"kv\": \"%s\", \"mlakit_us\": %.1f, "
        "\"mlakit_self_planning_us\": %.1f, \"flashmla_us\": %s, \"floor_us\": %.1f, "
        "\"commit\": \"%s\"}",
        r.shape.c_str(), r.kv.c_str(), r.mlakit_us, r.self_planning_us, anchor.c_str(), r.floor_us,
        commit.c_str()));
  }
  mlakit::bench::write_json_rows(path, "bench_gpu_decode", lines);
}

// Whether a row's label contains any of the ';'-separated texts of `only` (empty: every row).
bool label_selected(const std::string& label, const std::string& only) {
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(only.find(';', begin), only.size());
    if (label.find(only.substr(begin, end - begin)) != std::string::npos) return true;
    if (end == only.size()) return false;
    begin = end + 1;
  }
}

// Issue 8's table, then each of its shapes batch-invariant (its cost), the fp8 formats with a bf16
// q, then item 4's s_q x h_q grid at B64 s_kv 4096.
std::vector<Case> table_cases() {
  std::vector<Case> cases;
  for (bool invariant : {false, true}) {
    const KvCacheDType bf16 = KvCacheDType::kAuto, fp8 = KvCacheDType::kFp8E4m3;
    cases.push_back(uniform_case(128, 4096, 16, 1, bf16, invariant));
    cases.push_back(uniform_case(128, 8192, 16, 1, bf16, invariant));
    cases.push_back(uniform_case(32, 1024, 16, 1, bf16, invariant));
    cases.push_back(uniform_case(64, 1024, 16, 1, bf16, invariant));
    cases.push_back(uniform_case(128, 4096, 128, 1, bf16, invariant));
    cases.push_back(uniform_case(128, 8192, 128, 1, bf16, invariant));
    cases.push_back(uniform_case(128, 8192, 128, 2, bf16, invariant));
    cases.push_back(uniform_case(1, 4096, 128, 1, bf16, invariant));
    cases.push_back(uniform_case(4, 32768, 128, 1, bf16, invariant));
    cases.push_back(varlen_case(invariant));
    for (int64_t heads : {16, 128}) {  // fp8 q (f16 MMAs), as FlashMLA's fp8 contract has it
      Case c = uniform_case(128, 8192, heads, 1, fp8, invariant);
      c.q_dtype = DType::kFp8E4m3;
      cases.push_back(c);
    }
  }
  // The fp8 formats with a bf16 q (bf16 MMAs), what an engine with an fp8 cache passes.
  for (int64_t heads : {16, 128}) {
    for (KvCacheDType kv : {KvCacheDType::kFp8E4m3, KvCacheDType::kFp8DsMla}) {
      Case c = uniform_case(128, 8192, heads, 1, kv, false);
      c.q_dtype = DType::kBF16;
      cases.push_back(c);
    }
  }
  for (int64_t heads : {16, 32, 64, 128}) {
    for (int64_t s_q : {1, 2, 4, 8}) {
      cases.push_back(uniform_case(64, 4096, heads, s_q, KvCacheDType::kAuto, false));
    }
  }
  return cases;
}

}  // namespace

// Usage: bench_gpu_decode [--json PATH] [--commit HASH] [--only TEXT] [--parts N]
//   --json    also write the rows as JSON to PATH (bench/results/<date>-h200-decode.json)
//   --commit  the commit the rows are recorded against (default: $MLAKIT_COMMIT, else "unknown")
//   --only    run just the rows whose "shape kv" label contains TEXT (e.g. under a profiler);
//             TEXT may list several, separated by ';' (a row runs when it contains any of them)
//   --parts   N parts per row tile (1..256) instead of the library's plan (a schedule experiment:
//             the rows' "parts" column shows it)
//   --case    B,s_kv,h_q,s_q: run this uniform bf16 shape instead of the table (repeatable; e.g. an
//             s_kv sweep that separates a decode's per-tile time from its fixed cost)
int main(int argc, char** argv) {
  std::string json_path, only, parts_text = "0";
  std::vector<Case> custom_cases;
  const char* env_commit = std::getenv("MLAKIT_COMMIT");
  std::string commit = env_commit != nullptr ? env_commit : "unknown";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--case" && i + 1 < argc) {
      long b = 0, s_kv = 0, heads = 0, s_q = 0;
      char tail = 0;
      if (std::sscanf(argv[++i], "%ld,%ld,%ld,%ld%c", &b, &s_kv, &heads, &s_q, &tail) != 4 ||
          b < 1 || b > 4096 || s_kv < s_q || s_kv > (1L << 20) || heads < 1 || heads > 128 ||
          s_q < 1 || s_q > 16) {
        std::fprintf(stderr,
                     "bench_gpu_decode: --case takes B,s_kv,h_q,s_q with B in [1, 4096], s_q in "
                     "[1, 16], s_kv in [s_q, 2^20], h_q in [1, 128]; got %s\n",
                     argv[i]);
        return 2;
      }
      custom_cases.push_back(uniform_case(b, s_kv, heads, s_q, KvCacheDType::kAuto, false));
    } else if ((arg == "--json" || arg == "--commit" || arg == "--only" || arg == "--parts") &&
               i + 1 < argc) {
      (arg == "--json"     ? json_path
       : arg == "--commit" ? commit
       : arg == "--only"   ? only
                           : parts_text) = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: bench_gpu_decode [--json PATH] [--commit HASH] [--only TEXT] "
                   "[--parts N] [--case B,s_kv,h_q,s_q]...\n");
      return 2;
    }
  }
  char* parts_end = nullptr;
  const long forced_parts = std::strtol(parts_text.c_str(), &parts_end, 10);
  if (*parts_end != '\0' || forced_parts < 0 || forced_parts > 256) {
    std::fprintf(stderr, "bench_gpu_decode: --parts takes an integer in [1, 256], got %s\n",
                 parts_text.c_str());
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_gpu_decode: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("%s: %d SMs, %.0f MiB L2; commit %s\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1048576.0, commit.c_str());
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");

  const Ceilings ceil = measure_ceilings(stream, prop.multiProcessorCount);
  std::printf(
      "ceilings: D2D copy %.0f GB/s (read + write), streaming read %.0f GB/s, "
      "bf16 GEMM %d^3 %.0f TFLOP/s\n\n",
      ceil.copy_gbs, ceil.read_gbs, kGemmN, ceil.bf16_tflops);

  std::printf("%-44s %-15s %5s %9s %9s %6s %6s %8s %8s %7s %7s %7s %7s\n", "shape (page 64)", "kv",
              "parts", "us", "self-plan", "GB/s", "TF/s", "mem us", "flop us", "%floor", "%PERF",
              "FlashMLA", "ratio");
  const std::vector<Case> cases = custom_cases.empty() ? table_cases() : custom_cases;
  std::vector<Row> rows;
  for (const Case& c : cases) {
    const std::string label =
        c.shape + (c.batch_invariant ? " batch-invariant " : " ") + kv_label(c);
    if (label_selected(label, only)) {
      rows.push_back(run_case(c, ceil, forced_parts, stream));
    }
  }
  cudaStreamDestroy(stream);
  if (!json_path.empty()) write_json(json_path, rows, commit);
  return 0;
}
