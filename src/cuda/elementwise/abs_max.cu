// ops::abs_max on the GPU: a grid-stride walk over the strided view, a warp max, and one atomicMax
// per warp on the bits of |x| (non-negative floats, NaN included, order like their bit patterns,
// so a NaN wins as it should). Reads the result back: synchronizes.
#include <cstdint>

#include "core/check.hpp"
#include "cuda/common/elements.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda/elementwise/launch.hpp"

namespace mlakit::cuda {

namespace {

constexpr const char* kOp = "abs_max";
// Threads per block: a memory-bound walk; 256 keeps 8 blocks per SM resident.
constexpr int kThreads = 256;

struct AbsMaxParams {
  const char* data;
  int ndim;
  int64_t shape[kMaxDims];
  int64_t strides[kMaxDims];  // elements
  int64_t numel;
  unsigned int* result;  // bits of the running max |x|
};

template <class Elem>
__global__ void abs_max_kernel(const __grid_constant__ AbsMaxParams p) {
  const auto* base = reinterpret_cast<const typename Elem::Storage*>(p.data);
  unsigned int most = 0;  // +0.0f
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.numel;
       i += stride) {
    int64_t linear = i, offset = 0;
    for (int d = p.ndim - 1; d >= 0; --d) {
      offset += (linear % p.shape[d]) * p.strides[d];
      linear /= p.shape[d];
    }
    most = max(most, __float_as_uint(fabsf(Elem::load(base[offset]))));
  }
  for (int lanes = 16; lanes > 0; lanes >>= 1) {
    most = max(most, __shfl_xor_sync(0xffffffffu, most, lanes));
  }
  if ((threadIdx.x & 31) == 0) atomicMax(p.result, most);
}

}  // namespace

float abs_max(const TensorView& x, Stream stream) {
  DeviceGuard guard(x.device, kOp);
  AbsMaxParams p{};
  p.data = static_cast<const char*>(x.data);
  p.ndim = x.ndim;
  for (int d = 0; d < x.ndim; ++d) {
    p.shape[d] = x.shape[d];
    p.strides[d] = x.strides[d];
  }
  p.numel = x.numel();
  unsigned int* result = nullptr;
  const cudaStream_t s = as_cuda_stream(stream);
  check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&result), sizeof(unsigned int), s), kOp,
             "cudaMallocAsync");
  check_cuda(cudaMemsetAsync(result, 0, sizeof(unsigned int), s), kOp, "cudaMemsetAsync");
  p.result = result;
  if (p.numel > 0) {
    const auto blocks = static_cast<unsigned>(grid_blocks(p.numel, kThreads));
    switch (x.dtype) {
      case DType::kF32:
        abs_max_kernel<F32><<<blocks, kThreads, 0, s>>>(p);
        break;
      case DType::kF16:
        abs_max_kernel<F16><<<blocks, kThreads, 0, s>>>(p);
        break;
      default:
        abs_max_kernel<BF16><<<blocks, kThreads, 0, s>>>(p);
        break;
    }
    check_launch(kOp, "abs_max_kernel");
  }
  unsigned int bits = 0;
  check_cuda(cudaMemcpyAsync(&bits, result, sizeof(bits), cudaMemcpyDeviceToHost, s), kOp,
             "cudaMemcpyAsync");
  check_cuda(cudaFreeAsync(result, s), kOp, "cudaFreeAsync");
  check_cuda(cudaStreamSynchronize(s), kOp, "cudaStreamSynchronize");
  float value = 0.0f;
  static_assert(sizeof(value) == sizeof(bits), "f32 bits");
  __builtin_memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace mlakit::cuda
