// Launch of the split-combine kernel of the sm90 decode (combine.cuh), overlapped with the decode
// kernel before it (launch.cuh).
#include "cuda/common/launch.cuh"
#include "cuda/decode/sm90/combine.cuh"
#include "cuda/decode/sm90/combine_kernel.cuh"

namespace mlakit::cuda::decode_sm90 {

void launch_combine_kernel(const CombineParams& params, bool by_warps, dim3 grid,
                           cudaStream_t stream) {
  if (by_warps) {
    launch_kernel_overlapped("mla_decode", "mla_decode_combine_warp_kernel",
                             &mla_decode_combine_warp_kernel, grid, dim3(kCombineThreads), 0,
                             stream, params);
  } else {
    launch_kernel_overlapped("mla_decode", "mla_decode_combine_kernel", &mla_decode_combine_kernel,
                             grid, dim3(kCombineThreads), 0, stream, params);
  }
}

}  // namespace mlakit::cuda::decode_sm90
