// prefill_kernel for bf16 q/k/v (every out dtype).
#include "cuda/prefill/launch_kernel.cuh"

namespace mlakit::cuda::prefill {
template void launch_prefill_kernel<BF16>(const PrefillParams&, DType, cudaStream_t);
}  // namespace mlakit::cuda::prefill
