// sm90 decode for fp8_ds_mla caches with f16 MMAs (an f16 rope): mma.sync with 16 query rows per
// CTA (raw tiles for a 16-bit q, kernel_ds_mla.cuh; converted tiles otherwise), wgmma with 64
// (mma.sync with 64 where TMA cannot read the cache).
#include "cuda/decode/sm90/launch_kernel_wgmma.cuh"

namespace mlakit::cuda::decode_sm90 {

template void launch_decode_kernel<Config<16, CacheFormat::kFp8DsMla, F16Mma>>(
    const DecodeKernelParams&, dim3, cudaStream_t);
template void launch_decode_kernel<Config<16, CacheFormat::kFp8DsMla, RawDsMlaMma<F16Mma>>>(
    const DecodeKernelParams&, dim3, cudaStream_t);
template void launch_decode_kernel<Config<64, CacheFormat::kFp8DsMla, F16Mma>>(
    const DecodeKernelParams&, dim3, cudaStream_t);
template void launch_decode_wgmma_kernel<WgmmaConfig<F16Mma, CacheFormat::kFp8DsMla>>(
    const DecodeKernelParams&, dim3, cudaStream_t);

}  // namespace mlakit::cuda::decode_sm90
