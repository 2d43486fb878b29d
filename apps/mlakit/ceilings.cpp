#include "ceilings.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "device_io.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/threads.hpp"
#include "timing.hpp"

namespace mlakit::cli {
namespace {

// CPU streaming read: each of the library's threads sums its share of a buffer far larger than
// the last-level cache, with four independent integer accumulators (loads in flight, no
// floating-point dependency chain). GB/s of bytes read.
double cpu_read_gbs(bool quick) {
  // 512 MiB (256 with --quick): several times a server's last-level cache.
  const int64_t bytes = (quick ? int64_t{256} : int64_t{512}) << 20;
  const int64_t words = bytes / int64_t{sizeof(uint64_t)};
  std::vector<uint64_t> buffer(static_cast<size_t>(words));
  for (int64_t i = 0; i < words; ++i) buffer[size_t(i)] = uint64_t(i) * 0x9E3779B97F4A7C15ull;
  const int threads = cpu_num_threads();
  std::vector<uint64_t> sums(static_cast<size_t>(threads));
  const double seconds = median_seconds(quick ? 3 : 5, [&] {
    std::vector<std::thread> team;
    for (int t = 0; t < threads; ++t) {
      team.emplace_back([&, t] {
        const int64_t begin = words * t / threads / 4 * 4, end = words * (t + 1) / threads / 4 * 4;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (int64_t i = begin; i < end; i += 4) {
          s0 += buffer[size_t(i)], s1 += buffer[size_t(i + 1)];
          s2 += buffer[size_t(i + 2)], s3 += buffer[size_t(i + 3)];
        }
        sums[size_t(t)] = s0 ^ s1 ^ s2 ^ s3;
      });
    }
    for (std::thread& member : team) member.join();
  });
  return double(bytes) / seconds / 1e9;
}

#if defined(MLAKIT_WITH_CUDA)
// GPU: device-to-device copy of 1 GiB (read + write counted), far beyond the L2.
double gpu_copy_gbs(Device device) {
  constexpr int64_t kBytes = int64_t{1} << 30;
  const Tensor src = Tensor::empty({kBytes}, DType::kU8, device);
  const Tensor dst = Tensor::empty({kBytes}, DType::kU8, device);
  const double seconds = median_seconds(5, [&] {
    check_cuda(cudaMemcpy(dst.view().data, src.view().data, kBytes, cudaMemcpyDeviceToDevice),
               "bench: device copy");
    synchronize(device);
  });
  return 2.0 * double(kBytes) / seconds / 1e9;
}
#endif

// ops::batched_matmul of two n x n matrices: the GEMM rate mlakit itself reaches on the device.
double gemm_gflops(Device device, DType dtype, int64_t n, int reps) {
  const Tensor a = Tensor::zeros({1, n, n}, dtype, device);
  const Tensor w = Tensor::zeros({1, n, n}, dtype, device);
  const Tensor c = Tensor::empty({1, n, n}, dtype, device);
  const double seconds = median_seconds(reps, [&] {
    ops::batched_matmul(a, w, c);
    synchronize(device);
  });
  return 2.0 * double(n) * double(n) * double(n) / seconds / 1e9;
}

}  // namespace

Ceilings measure_ceilings(Device device, bool quick) {
  Ceilings c;
  if (device.is_cuda()) {
#if defined(MLAKIT_WITH_CUDA)
    c.memory_gbs = gpu_copy_gbs(device);
    c.memory_method = "device-to-device copy of 1 GiB (read + write)";
#endif
    // bf16 8192^3: 1.1 TFLOP, long enough for the tensor cores' steady rate.
    c.gemm_gflops = gemm_gflops(device, DType::kBF16, 8192, 5);
    c.gemm_method = "batched_matmul bf16 8192^3";
  } else {
    c.memory_gbs = cpu_read_gbs(quick);
    c.memory_method = std::string("streaming read of ") + (quick ? "256" : "512") + " MiB, " +
                      std::to_string(cpu_num_threads()) + " threads";
    // f32 (the CPU GEMM's arithmetic) 1024^3 (768^3 with --quick): far above the tile sizes.
    const int64_t n = quick ? 768 : 1024;
    c.gemm_gflops = gemm_gflops(device, DType::kF32, n, quick ? 3 : 5);
    c.gemm_method = "batched_matmul f32 " + std::to_string(n) + "^3";
  }
  return c;
}

}  // namespace mlakit::cli
