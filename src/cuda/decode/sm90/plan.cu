// Launch of the plan kernel of the sm90 decode (plan.cuh), overlapped with the stream's previous
// kernel (launch.cuh).
#include "cuda/common/launch.cuh"
#include "cuda/decode/sm90/plan.cuh"
#include "cuda/decode/sm90/plan_kernel.cuh"

namespace mlakit::cuda::decode_sm90 {

void launch_plan_kernel(const PlanParams& params, cudaStream_t stream) {
  launch_kernel_overlapped("mla_decode", "mla_decode_plan_kernel", &mla_decode_plan_kernel, dim3(1),
                           dim3(kPlanThreads), 0, stream, params);
}

}  // namespace mlakit::cuda::decode_sm90
