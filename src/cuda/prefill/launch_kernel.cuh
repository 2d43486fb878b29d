// Grid, shared-memory attribute and launch of the prefill kernels for one input type; included
// only by instantiations/<dtype>.cu (one translation unit per input type builds in parallel).
// 16-byte aligned rows with contiguous dims (PrefillParams::vector_loads) run the wgmma kernel;
// any other layout runs the mma.sync kernel, which also takes element-strided rows.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/common/dispatch.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda/prefill/entry.cuh"
#include "cuda/prefill/kernel.cuh"
#include "cuda/prefill/wgmma_kernel.cuh"

namespace mlakit::cuda::prefill {

// Grid: x = query tiles of the longest request, y = heads, z = requests + 1 (the last z writes
// the rows past the last request). Blocks past their request's length exit at once; no host
// knowledge of the lengths is needed.
template <class Kernel>
void launch(Kernel kernel, const PrefillParams& p, int64_t heads, int block_rows, int threads,
            int smem_bytes, cudaStream_t stream) {
  const int64_t query_tiles = std::max<int64_t>(1, (p.max_seqlen_q + block_rows - 1) / block_rows);
  const dim3 grid(static_cast<unsigned>(query_tiles), static_cast<unsigned>(heads),
                  static_cast<unsigned>(p.batch + 1));
  // Above 48 KiB a block needs the opt-in limit (not a stream operation: graph-capture safe).
  set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), smem_bytes, kPrefillOp);
  kernel<<<grid, threads, smem_bytes, stream>>>(p);
  check_launch(kPrefillOp, "prefill_kernel");
}

template <class In>
void launch_prefill_kernel(const PrefillParams& p, int64_t heads, DType out_dtype,
                           cudaStream_t stream) {
  dispatch_float(kPrefillOp, out_dtype, [&](auto out_type) {
    using Out = decltype(out_type);
    if (p.vector_loads) {
      using W = wgmma::Traits<In>;
      launch(wgmma::prefill_kernel<In, Out>, p, heads, W::kBlockM, W::kThreads, W::kSmemBytes,
             stream);
    } else {
      launch(prefill_kernel<In, Out>, p, heads, kBlockM, kThreads,
             static_cast<int>(sizeof(SharedStorage)), stream);
    }
  });
}

}  // namespace mlakit::cuda::prefill
