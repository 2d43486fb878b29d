// Pieces the GPU benchmarks share: a CUDA error check that ends the program, random device data,
// the median of event-timed calls and the JSON list of rows. Each bench_gpu_*.cu is one program of
// one translation unit that includes this header once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mlakit/types.hpp"

namespace mlakit::bench {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

// Median of `reps` timings (ms) of `fn` on `stream`, after one warm-up call. `before` runs on the
// host ahead of every call, outside the timed span (e.g. a barrier of the threads of several
// ranks, so that they launch together).
template <class Before, class Fn>
double median_ms(cudaStream_t stream, int reps, const Before& before, const Fn& fn) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  before();
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    before();
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    fn();
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    t.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

__device__ inline float hash_uniform(uint64_t i, uint64_t seed) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  return static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1)
}

// Fills n elements of `dtype` (bf16, or finite e4m3 bytes) with values in [-1, 1).
__global__ void fill_random(void* data, int64_t n, DType dtype, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = hash_uniform(static_cast<uint64_t>(i), seed);
    if (dtype == DType::kBF16) {
      static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16(v);
    } else {
      static_cast<__nv_fp8_storage_t*>(data)[i] =
          __nv_cvt_float_to_fp8(v * 4.0f, __NV_SATFINITE, __NV_E4M3);
    }
  }
}

// printf into a std::string.
__attribute__((format(printf, 1, 2))) inline std::string format(const char* fmt, ...) {
  va_list args, again;
  va_start(args, fmt);
  va_copy(again, args);
  const int size = std::vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string text(size > 0 ? size : 0, '\0');
  std::vsnprintf(text.data(), text.size() + 1, fmt, again);
  va_end(again);
  return text;
}

// Writes `rows` (JSON objects, one a line) as a JSON list to `path`; ends the program, naming
// `program`, when the file cannot be written.
inline void write_json_rows(const std::string& path, const char* program,
                            const std::vector<std::string>& rows) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "%s: cannot write %s\n", program, path.c_str());
    std::exit(1);
  }
  std::fprintf(f, "[\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    std::fprintf(f, "  %s%s\n", rows[i].c_str(), i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "]\n");
  std::fclose(f);
}

// Random values in a bf16 or byte (e4m3) tensor of the current device, on the default stream.
// 1024 blocks of 256 threads stride over any size and keep every SM of an H100/H200 busy.
inline void fill(const Tensor& t, uint64_t seed) {
  fill_random<<<1024, 256>>>(t.view().data, t.numel(), t.view().dtype, seed);
  check(cudaGetLastError(), "fill_random");
}

}  // namespace mlakit::bench
