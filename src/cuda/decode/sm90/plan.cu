// Launch of the plan kernel of the sm90 decode (plan.cuh).
#include "cuda/decode/sm90/plan.cuh"
#include "cuda/decode/sm90/plan_kernel.cuh"

namespace mlakit::cuda::decode_sm90 {

void launch_plan_kernel(const PlanParams& params, cudaStream_t stream) {
  mla_decode_plan_kernel<<<1, kPlanThreads, 0, stream>>>(params);
}

}  // namespace mlakit::cuda::decode_sm90
