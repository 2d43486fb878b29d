// Pieces shared by the sm_90a warpgroup-MMA kernels written with CuTe (decode and prefill).
#pragma once

#include <cutlass/numeric_types.h>

#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>
#include <type_traits>

namespace mlakit::cuda {

// The CuTe type of a 16-bit MMA input: bfloat16 (kBf16) or half.
template <bool kBf16>
using CuteHalf = std::conditional_t<kBf16, cutlass::bfloat16_t, cutlass::half_t>;

// Orders this thread's earlier generic-proxy writes to shared memory (stores, landed cp.async
// copies) before later async-proxy reads (wgmma operands); a barrier then publishes them.
__device__ __forceinline__ void fence_shared_for_wgmma() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Issues C = A B (accumulate: C += A B) over every k-block of the fragments as one wgmma batch of
// the warpgroup, and returns at once: C's registers (and A's, when kARegisters: A is a register
// fragment, else shared-memory descriptors) belong to the MMAs until a warpgroup_wait that
// covers this batch, followed by warpgroup_fence_operand on them.
template <bool kARegisters = false, class TiledMma, class FragA, class FragB, class FragC>
__device__ __forceinline__ void warpgroup_gemm_issue(TiledMma& mma, FragA& a, const FragB& b,
                                                     FragC& c, bool accumulate) {
  using namespace cute;
  if constexpr (kARegisters) warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = accumulate ? GMMA::ScaleOut::One : GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// warpgroup_gemm_issue, then waits: returns when the results are in C's registers.
template <bool kARegisters = false, class TiledMma, class FragA, class FragB, class FragC>
__device__ __forceinline__ void warpgroup_gemm(TiledMma& mma, FragA& a, const FragB& b, FragC& c,
                                               bool accumulate) {
  using namespace cute;
  warpgroup_gemm_issue<kARegisters>(mma, a, b, c, accumulate);
  warpgroup_wait<0>();
  warpgroup_fence_operand(c);
  if constexpr (kARegisters) warpgroup_fence_operand(a);
}

}  // namespace mlakit::cuda
