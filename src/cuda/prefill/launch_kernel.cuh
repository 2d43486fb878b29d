// Grid, shared-memory attribute and launch of the prefill kernel for one input type; included
// only by instantiations/<dtype>.cu (one translation unit per input type builds in parallel).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/common/dispatch.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda/prefill/entry.cuh"
#include "cuda/prefill/kernel.cuh"

namespace mlakit::cuda::prefill {

// Grid: x = query tiles of the longest request, y = heads, z = requests + 1 (the last z writes
// the rows past the last request). Blocks past their request's length exit at once; no host
// knowledge of the lengths is needed.
template <class In>
void launch_prefill_kernel(const PrefillParams& p, int64_t heads, DType out_dtype,
                           cudaStream_t stream) {
  const int64_t query_tiles = std::max<int64_t>(1, (p.max_seqlen_q + kBlockM - 1) / kBlockM);
  const dim3 grid(static_cast<unsigned>(query_tiles), static_cast<unsigned>(heads),
                  static_cast<unsigned>(p.batch + 1));
  constexpr int kSmemBytes = sizeof(SharedStorage);
  dispatch_float(kPrefillOp, out_dtype, [&](auto out_type) {
    const auto kernel = prefill_kernel<In, decltype(out_type)>;
    // Above 48 KiB a block needs the opt-in limit (not a stream operation: graph-capture safe).
    check_cuda(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
        kPrefillOp, "cudaFuncSetAttribute(prefill_kernel)");
    kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
    check_launch(kPrefillOp, "prefill_kernel");
  });
}

}  // namespace mlakit::cuda::prefill
