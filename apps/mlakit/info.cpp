#include "info.hpp"

#include <fstream>
#include <string>
#include <thread>

#include "mlakit/threads.hpp"
#include "presets.hpp"

#if defined(MLAKIT_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace mlakit::cli {

namespace {

// The "model name" line of /proc/cpuinfo (Linux), or "unknown".
std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "unknown" : line.substr(start);
  }
  return "unknown";
}

void print_gpus(std::ostream& os) {
#if defined(MLAKIT_WITH_CUDA)
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    os << "gpu:      none (" << (status != cudaSuccess ? cudaGetErrorString(status) : "no device")
       << ")\n";
    return;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    const double gib = 1024.0 * 1024.0 * 1024.0;  // bytes per GiB
    os << "gpu:      cuda:" << i << " " << prop.name << ", sm_" << prop.major << prop.minor << ", "
       << prop.multiProcessorCount << " SMs, " << static_cast<double>(prop.totalGlobalMem) / gib
       << " GiB\n";
  }
#else
  os << "gpu:      none (built without CUDA)\n";
#endif
}

}  // namespace

void print_info(std::ostream& os) {
#if defined(MLAKIT_WITH_CUDA)
  const bool with_cuda = true;
#else
  const bool with_cuda = false;
#endif
  os << "mlakit " << MLAKIT_VERSION << "\n";
  os << "build:    CUDA " << (with_cuda ? "on" : "off")
     << ", CPU GEMM OpenBLAS (OpenMP build, one thread per call), " << mlakit::cpu_num_threads()
     << " CPU threads (mlakit's pool)\n";
  os << "backends: cpu" << (with_cuda ? ", cuda" : "") << "\n";
  os << "cpu:      " << cpu_model() << ", " << std::thread::hardware_concurrency() << " cores\n";
  print_gpus(os);
  os << "presets: ";
  for (const ModelPreset& p : model_presets()) {
    os << " " << p.name << " (" << p.dims.num_heads << " heads, scale " << p.scale << ")";
  }
  os << "\n";
}

}  // namespace mlakit::cli
