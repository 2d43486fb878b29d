// Device side of programmatic dependent launch (launch.cuh's launch_kernel_overlapped). Host
// compilations of kernel sources (the decode emulation test) see no-ops.
#pragma once

namespace mlakit::cuda {

// Waits until the grids this one depends on have completed and their memory writes are visible.
// A kernel launched overlapped calls it before its first global-memory access, read or write.
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the stream's next overlapped kernel launch now; its CTAs take SMs as they free up and wait
// in wait_for_prior_grids() for this grid to complete.
__device__ __forceinline__ void allow_next_grid_launch() {
#if defined(__CUDA_ARCH__)
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

}  // namespace mlakit::cuda
