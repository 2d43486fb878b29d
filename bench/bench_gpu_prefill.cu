// CUDA mla_prefill (up-projected MHA: d_qk 192 = k_nope 128 | k_pe 64, d_v 128, bf16) on the
// PERF.md prefill shapes, beside the bf16 GEMM ceiling measured in the same run (cuBLAS 8192^3).
// Prints ms, TF/s and % of the ceiling. FLOPs counted as useful work: causal
// 2 * B * H * L(L+1)/2 * (192 + 128); non-causal 2 * B * H * Lq * Lk * (192 + 128).
// Usage: bench_gpu_prefill [--json PATH] [--commit HASH] [--case H,B,sq,sk[,n]]...
//   (well under 3 minutes on an H200)
//   --json    also write the rows as JSON to PATH: a list of {shape, out, ms, tflops,
//             ceiling_tflops, commit}
//   --commit  the commit the rows are recorded against (default: $MLAKIT_COMMIT, else "unknown")
//   --case    run this shape instead of the table (repeatable): H heads, B requests of sq queries
//             and sk keys, causal with a bf16 out, or with ",n" non-causal with an f32 out and
//             the LSE (a context chunk); e.g. a sweep of request lengths
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "cuda/common/device_errors.hpp"
#include "gpu_bench_common.cuh"
#include "mlakit/ops.hpp"

namespace {

using mlakit::Device;
using mlakit::DType;
using mlakit::Tensor;
using mlakit::TensorView;

constexpr int kWarmup = 2;  // first launches pay module loading and the smem attribute
constexpr int kRuns = 7;    // median of 7 timed runs (>= 5 asked by PERF.md)
constexpr int64_t kNope = 128, kRope = 64, kDv = 128;  // MLA head sizes

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: cuBLAS status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

// Uniform values in [-1, 1) from a hash of the index (no host copy of gigabytes).
__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    p[i] = __float2bfloat16(static_cast<float>(x) * (2.0f / 4294967296.0f) - 1.0f);
  }
}
void fill(void* p, int64_t n, uint32_t seed) {
  fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  check(cudaGetLastError(), "fill_bf16");
}

// Median time in ms of fn() over kRuns after kWarmup.
template <class Fn>
double median_ms(const Fn& fn) {
  for (int i = 0; i + 1 < kWarmup; ++i) fn();  // the shared timer makes the last warm-up call
  return mlakit::bench::median_ms(
      nullptr, kRuns, [] {}, fn);
}

// bf16 GEMM 8192^3 through cuBLAS (f32 accumulation): the matrix ceiling of this GPU today.
double gemm_ceiling_tflops() {
  constexpr int kN = 8192;  // large enough for cuBLAS to run at its peak
  Tensor a = Tensor::empty({kN, kN}, DType::kBF16, Device::cuda(0));
  Tensor b = Tensor::empty({kN, kN}, DType::kBF16, Device::cuda(0));
  Tensor c = Tensor::empty({kN, kN}, DType::kBF16, Device::cuda(0));
  fill(a.view().data, a.numel(), 1);
  fill(b.view().data, b.numel(), 2);
  cublasHandle_t handle;
  check(cublasCreate(&handle), "cublasCreate");
  const float alpha = 1.0f, beta = 0.0f;
  const double ms = median_ms([&] {
    check(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, kN, kN, kN, &alpha, a.view().data,
                       CUDA_R_16BF, kN, b.view().data, CUDA_R_16BF, kN, &beta, c.view().data,
                       CUDA_R_16BF, kN, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  });
  cublasDestroy(handle);
  const double tflops = 2.0 * kN * kN * kN / (ms * 1e-3) / 1e12;
  std::printf("bf16 GEMM 8192^3 (cuBLAS): %.3f ms, %.1f TF/s\n", ms, tflops);
  return tflops;
}

struct Shape {
  int64_t heads, batch, sq, sk;  // sq queries and sk keys per request
  bool causal;
  DType out_dtype;  // f32 + lse for context chunks (the orchestrator merges them)
};

// Times one shape and prints its row; returns the row as a JSON object.
std::string run_shape(const Shape& s, double ceiling, const std::string& commit) {
  const int64_t t = s.batch * s.sq, keys = s.batch * s.sk, n = s.heads;
  Tensor q = Tensor::empty({t, n, kNope + kRope}, DType::kBF16, Device::cuda(0));
  Tensor kv = Tensor::empty({keys, n, kNope + kDv}, DType::kBF16, Device::cuda(0));  // kv_b_proj
  Tensor k_pe = Tensor::empty({keys, kRope}, DType::kBF16, Device::cuda(0));
  Tensor out = Tensor::empty({t, n, kDv}, s.out_dtype, Device::cuda(0));
  Tensor lse = Tensor::empty({n, t}, DType::kF32, Device::cuda(0));
  fill(q.view().data, q.numel(), 3);
  fill(kv.view().data, kv.numel(), 4);
  fill(k_pe.view().data, k_pe.numel(), 5);
  std::vector<int32_t> cu_q, cu_k;
  for (int64_t b = 0; b <= s.batch; ++b) {
    cu_q.push_back(static_cast<int32_t>(b * s.sq));
    cu_k.push_back(static_cast<int32_t>(b * s.sk));
  }
  Tensor cu_q_d = Tensor::empty({s.batch + 1}, DType::kI32, Device::cuda(0));
  Tensor cu_k_d = Tensor::empty({s.batch + 1}, DType::kI32, Device::cuda(0));
  check(cudaMemcpy(cu_q_d.view().data, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice),
        "cudaMemcpy");
  check(cudaMemcpy(cu_k_d.view().data, cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice),
        "cudaMemcpy");
  const TensorView k_nope = kv.view().narrow(2, 0, kNope), v = kv.view().narrow(2, kNope, kDv);
  const float scale = 0.0721688f;  // 1 / sqrt(192)
  const std::optional<TensorView> lse_view =
      s.causal ? std::nullopt : std::optional<TensorView>(lse.view());
  const double ms = median_ms([&] {
    mlakit::ops::mla_prefill(q, k_nope, k_pe, v, cu_q_d, cu_k_d, s.sq, s.sk, scale, s.causal, out,
                             lse_view);
  });
  mlakit::cuda::check_device_errors(Device::cuda(0));
  const double pairs =
      s.causal ? static_cast<double>(s.sq) * (s.sq + 1) / 2.0 : static_cast<double>(s.sq) * s.sk;
  const double flops = 2.0 * s.batch * n * pairs * (kNope + kRope + kDv);
  const double tflops = flops / (ms * 1e-3) / 1e12;
  const std::string shape = mlakit::bench::format(
      "H=%ld B=%ld sq=%ld sk=%ld %s", static_cast<long>(n), static_cast<long>(s.batch),
      static_cast<long>(s.sq), static_cast<long>(s.sk), s.causal ? "causal" : "non-causal");
  std::printf("H=%-4ld B=%-2ld sq=%-6ld sk=%-6ld %-10s out %-4s  %9.3f ms  %7.1f TF/s  %5.1f %%\n",
              static_cast<long>(n), static_cast<long>(s.batch), static_cast<long>(s.sq),
              static_cast<long>(s.sk), s.causal ? "causal" : "non-causal",
              mlakit::dtype_name(s.out_dtype), ms, tflops, 100.0 * tflops / ceiling);
  return mlakit::bench::format(
      "{\"shape\": \"%s\", \"out\": \"%s\", \"ms\": %.4f, \"tflops\": %.1f, "
      "\"ceiling_tflops\": %.1f, \"commit\": \"%s\"}",
      shape.c_str(), mlakit::dtype_name(s.out_dtype), ms, tflops, ceiling, commit.c_str());
}

// A --case argument "H,B,sq,sk" or "H,B,sq,sk,n"; nullopt when malformed or out of range (1..128
// heads; at most 2^24 token-heads and key-heads; causal needs sq == sk, which the TF/s count
// assumes).
std::optional<Shape> parse_case(const char* text) {
  long heads = 0, batch = 0, sq = 0, sk = 0;
  char mode = 'c', tail = 0;
  const int fields =
      std::sscanf(text, "%ld,%ld,%ld,%ld,%c%c", &heads, &batch, &sq, &sk, &mode, &tail);
  // ~1.4 KB of q, k / v and f32 out per token-head: 2^24 of them stay within ~24 GB.
  constexpr long kMaxRowHeads = 1L << 24;
  if ((fields != 4 && fields != 5) || (mode != 'c' && mode != 'n') || heads < 1 || heads > 128 ||
      batch < 1 || sq < 1 || sk < 1 || batch > kMaxRowHeads || sq > kMaxRowHeads ||
      sk > kMaxRowHeads || batch * sq * heads > kMaxRowHeads || batch * sk * heads > kMaxRowHeads ||
      (mode == 'c' && sq != sk)) {
    return std::nullopt;
  }
  const bool causal = mode == 'c';
  return Shape{heads, batch, sq, sk, causal, causal ? DType::kBF16 : DType::kF32};
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  std::vector<Shape> custom;
  const char* env_commit = std::getenv("MLAKIT_COMMIT");
  std::string commit = env_commit != nullptr ? env_commit : "unknown";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--json" || arg == "--commit") && i + 1 < argc) {
      (arg == "--json" ? json_path : commit) = argv[++i];
    } else if (arg == "--case" && i + 1 < argc) {
      const std::optional<Shape> shape = parse_case(argv[++i]);
      if (!shape) {
        std::fprintf(stderr,
                     "bench_gpu_prefill: --case takes H,B,sq,sk[,n] with H in [1, 128], B, sq, sk "
                     ">= 1, B * sq * H and B * sk * H <= 2^24, sq == sk when causal; got %s\n",
                     argv[i]);
        return 2;
      }
      custom.push_back(*shape);
    } else {
      std::fprintf(stderr,
                   "usage: bench_gpu_prefill [--json PATH] [--commit HASH] "
                   "[--case H,B,sq,sk[,n]]...\n");
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("%s, %d SMs; mla_prefill bf16, d_qk 192, d_v 128; medians of %d after %d warm-up\n",
              prop.name, prop.multiProcessorCount, kRuns, kWarmup);
  const double ceiling = gemm_ceiling_tflops();
  const Shape shapes[] = {
      {128, 1, 4096, 4096, true, DType::kBF16},
      {128, 1, 16384, 16384, true, DType::kBF16},
      {16, 1, 16384, 16384, true, DType::kBF16},
      {16, 8, 4096, 4096, true, DType::kBF16},
      {128, 1, 4096, 16384, false, DType::kF32},  // context chunk: 4096 queries x 16384 keys
      // Short requests (issue 10's 16 x 1024 rows, what chunked prefill under a token budget
      // produces): 1-8 key tiles per block, so the per-block fixed cost dominates.
      {16, 16, 1024, 1024, true, DType::kBF16},
      {128, 16, 1024, 1024, true, DType::kBF16},
  };
  std::vector<std::string> rows;
  for (const Shape& s :
       custom.empty() ? std::vector<Shape>(std::begin(shapes), std::end(shapes)) : custom) {
    rows.push_back(run_shape(s, ceiling, commit));
  }
  if (!json_path.empty()) mlakit::bench::write_json_rows(json_path, "bench_gpu_prefill", rows);
  return 0;
}
