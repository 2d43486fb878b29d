// ops::abs_max on the GPU: a grid-stride walk over the strided view, a warp max, and one atomicMax
// per warp on the bits of |x| (non-negative floats, NaN included, order like their bit patterns,
// so a NaN wins as it should). abs_max reads the result back (synchronizes); dynamic_fp8_scale
// turns it into scaled_fp8_quant's dynamic scale on the device.
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

// result = bits of max |x| (0 first, then the reduction), enqueued on `s`; `op` names the caller
// in errors.
void launch_abs_max_bits(const char* op, const TensorView& x, unsigned int* result,
                         cudaStream_t s) {
  AbsMaxParams p{};
  p.data = static_cast<const char*>(x.data);
  p.ndim = x.ndim;
  for (int d = 0; d < x.ndim; ++d) {
    p.shape[d] = x.shape[d];
    p.strides[d] = x.strides[d];
  }
  p.numel = x.numel();
  p.result = result;
  check_cuda(cudaMemsetAsync(result, 0, sizeof(unsigned int), s), op, "cudaMemsetAsync");
  if (p.numel == 0) return;
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
  check_launch(op, "abs_max_kernel");
}

// *scale holds the bits of max |x|; it becomes max |x| / 448 (448: largest finite e4m3 value).
__global__ void amax_to_fp8_scale_kernel(float* scale) { *scale = __fdiv_rn(*scale, 448.0f); }

}  // namespace

float abs_max(const TensorView& x, Stream stream) {
  DeviceGuard guard(x.device, kOp);
  unsigned int* result = nullptr;
  const cudaStream_t s = as_cuda_stream(stream);
  check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&result), sizeof(unsigned int), s), kOp,
             "cudaMallocAsync");
  launch_abs_max_bits(kOp, x, result, s);
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

void dynamic_fp8_scale(const TensorView& x, float* scale, Stream stream) {
  constexpr const char* kQuantOp = "dynamic_scaled_fp8_quant";
  DeviceGuard guard(x.device, kQuantOp);
  const cudaStream_t s = as_cuda_stream(stream);
  static_assert(sizeof(float) == sizeof(unsigned int), "the scale holds the amax bits first");
  launch_abs_max_bits(kQuantOp, x, reinterpret_cast<unsigned int*>(scale), s);
  amax_to_fp8_scale_kernel<<<1, 1, 0, s>>>(scale);
  check_launch(kQuantOp, "amax_to_fp8_scale_kernel");
}

}  // namespace mlakit::cuda
