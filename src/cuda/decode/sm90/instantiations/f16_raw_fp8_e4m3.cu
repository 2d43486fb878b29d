// sm90 decode over raw fp8_e4m3 tiles: f16 MMAs on the raw tiles, converted per warp in registers
// (kernel_e4m3.cuh), for an fp8 q with 16 and 64 query rows per CTA and a 16-bit q with 16.
#include "cuda/decode/sm90/launch_kernel.cuh"

namespace mlakit::cuda::decode_sm90 {

template void launch_decode_kernel<Config<16, CacheFormat::kFp8E4m3, RawE4m3Mma>>(
    const DecodeKernelParams&, dim3, cudaStream_t);
template void launch_decode_kernel<Config<64, CacheFormat::kFp8E4m3, RawE4m3Mma>>(
    const DecodeKernelParams&, dim3, cudaStream_t);
template void launch_decode_kernel<Config<16, CacheFormat::kFp8E4m3, RawE4m3Q16Mma>>(
    const DecodeKernelParams&, dim3, cudaStream_t);

}  // namespace mlakit::cuda::decode_sm90
