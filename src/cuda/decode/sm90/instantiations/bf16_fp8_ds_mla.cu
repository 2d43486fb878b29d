// sm90 decode for fp8_ds_mla caches with bf16 MMAs, 16 and 64 query rows per CTA.
#include "cuda/decode/sm90/launch_kernel.cuh"

namespace mlakit::cuda::decode_sm90 {

template void launch_decode_kernel<Config<16, CacheFormat::kFp8DsMla, Bf16Mma>>(
    const DecodeKernelParams&, dim3, cudaStream_t);
template void launch_decode_kernel<Config<64, CacheFormat::kFp8DsMla, Bf16Mma>>(
    const DecodeKernelParams&, dim3, cudaStream_t);

}  // namespace mlakit::cuda::decode_sm90
