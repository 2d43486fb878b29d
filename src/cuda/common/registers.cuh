// Register reallocation between the warpgroups of a warp-specialized sm_90a kernel (PTX
// setmaxnreg): a warpgroup with little to hold gives registers back to the pool so that the MMA
// warpgroups can raise their limit above the launch's (65536 / threads per CTA). Every warp of a
// warpgroup executes the same call; `kRegisters` is a multiple of 8 in [24, 256].
#pragma once

namespace mlakit::cuda {

template <int kRegisters>
__device__ __forceinline__ void warpgroup_release_registers() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg range");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

template <int kRegisters>
__device__ __forceinline__ void warpgroup_claim_registers() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg range");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace mlakit::cuda
