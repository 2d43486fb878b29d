// Grid, shared-memory attribute and launch of the prefill kernels for one input type; included
// only by instantiations/<dtype>.cu (one translation unit per input type builds in parallel).
// 16-byte aligned rows with contiguous dims (PrefillParams::vector_loads) run the warp-specialized
// TMA kernel when TMA can describe every tensor; any other layout runs the mma.sync kernel, which
// also takes element-strided rows.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <optional>

#include "cuda/common/dispatch.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda/common/tensor_map.hpp"
#include "cuda/prefill/entry.cuh"
#include "cuda/prefill/kernel.cuh"
#include "cuda/prefill/ws_kernel.cuh"

namespace mlakit::cuda::prefill {

// Blocks of block_rows query rows that the longest request needs (at least one).
inline int64_t query_tiles(const PrefillParams& p, int block_rows) {
  return std::max<int64_t>(1, (p.max_seqlen_q + block_rows - 1) / block_rows);
}

// Grid: x = query tiles of the longest request, y = groups of p.heads_per_block heads, z =
// requests + 1 (the last z writes the rows past the last request). Blocks past their request's
// length exit at once; no host knowledge of the lengths is needed.
// `extra`: the kernel's arguments after p.
template <class Kernel, class... Extra>
void launch(Kernel kernel, const char* name, const PrefillParams& p, int block_rows, int threads,
            int smem_bytes, cudaStream_t stream, const Extra&... extra) {
  const int64_t head_groups = (p.heads + p.heads_per_block - 1) / p.heads_per_block;
  const dim3 grid(static_cast<unsigned>(query_tiles(p, block_rows)),
                  static_cast<unsigned>(head_groups), static_cast<unsigned>(p.batch + 1));
  // Above 48 KiB a block needs the opt-in limit (not a stream operation: graph-capture safe).
  set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), smem_bytes, kPrefillOp);
  kernel<<<grid, threads, smem_bytes, stream>>>(p, extra...);
  check_launch(kPrefillOp, name);
}

// The warp-specialized kernel's four TMA maps (ws_kernel.cuh): q [T, N, 192] in boxes of 64 dims x
// 1 head x 128 tokens, k_nope and v [S, N, 128] and k_pe [S, 64] (as [S, 1, 64]) in boxes of 64
// dims x 128 keys (ws::Traits' kBlockM / kBlockN), all 128-byte swizzled (the wgmma operand
// layout). nullopt when a tensor is empty or the driver refuses a description (strides that are not
// multiples of 16 bytes, say).
struct PrefillTensorMaps {
  CUtensorMap q, k_nope, k_pe, v;
};

inline std::optional<PrefillTensorMaps> make_prefill_tensor_maps(const PrefillParams& p) {
  if (p.tokens <= 0 || p.keys <= 0 || p.heads <= 0) return std::nullopt;
  constexpr cuuint64_t kBytes = 2;                          // 16-bit q / k / v values
  constexpr cuuint32_t kBoxValues = 64;                     // one 128-byte swizzle span
  constexpr cuuint32_t kQRows = ws::Traits<BF16>::kBlockM;  // the same for f16
  constexpr cuuint32_t kKeys = ws::Traits<BF16>::kBlockN;
  const auto n = static_cast<cuuint64_t>(p.heads);
  auto map3 = [](const void* base, cuuint64_t width, cuuint64_t mid, cuuint64_t rows,
                 cuuint64_t mid_stride, cuuint64_t row_stride, cuuint32_t box_rows) {
    const cuuint64_t dims[3] = {width, mid, rows};
    const cuuint64_t strides[2] = {mid_stride * kBytes, row_stride * kBytes};
    const cuuint32_t box[3] = {kBoxValues, 1, box_rows};
    CUtensorMap map;
    return encode_tiled_tensor_map(kPrefillOp, map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, base, dims,
                                   strides, box, CU_TENSOR_MAP_SWIZZLE_128B) == CUDA_SUCCESS
               ? std::optional<CUtensorMap>(map)
               : std::nullopt;
  };
  const auto tokens = static_cast<cuuint64_t>(p.tokens), keys = static_cast<cuuint64_t>(p.keys);
  const auto q = map3(p.q, kHeadDimQK, n, tokens, p.q_stride[1], p.q_stride[0], kQRows);
  const auto k_nope = map3(p.k_nope, kNope, n, keys, p.k_nope_stride[1], p.k_nope_stride[0], kKeys);
  const auto k_pe = map3(p.k_pe, kRope, 1, keys, p.k_pe_stride[0], p.k_pe_stride[0], kKeys);
  const auto v = map3(p.v, kHeadDimV, n, keys, p.v_stride[1], p.v_stride[0], kKeys);
  if (!q || !k_nope || !k_pe || !v) return std::nullopt;
  return PrefillTensorMaps{*q, *k_nope, *k_pe, *v};
}

// Heads per block of the warp-specialized kernel: the most of {4, 2} for which the grid keeps at
// least 3.5 blocks per SM per head of a block, when no request has more than kGroupedHeadsMaxKeys
// keys; else one. A block of short requests has 1-8 key tiles of 128, so its fixed cost (start,
// first loads, epilogue) is a large share of it, and the heads after the first find their Q and
// first tiles loaded; but fewer, longer blocks make the grid's last wave coarser. Measured on an
// H100 (bench/results/2026-12-07-h100-prefill-heads-sweep.md; times against one head per block):
// 4 heads h128 64 x 256 -19 %, 32 x 512 -14 %, 16 x 1024 -7 % (4,096 blocks), but +3 % with
// 1,024 blocks (h32 16 x 1024, h128 4 x 1024); 2 heads h16 64 x 256 -8 %, 16 x 1024 -1 %
// (1,024 blocks), +8 % for 4 heads there (512 blocks); 8 heads never the best; at 2048 keys 2
// heads +11 % (h16) and -2 % (h128), so longer requests keep one.
constexpr int64_t kGroupedHeadsMaxKeys = 1024;
inline int ws_heads_per_block(const PrefillParams& p, int query_rows_per_block) {
  if (p.max_seqlen_k > kGroupedHeadsMaxKeys) return 1;
  // 2 x blocks >= 7 x heads x SMs: 3.5 blocks per SM per head (2 heads: 924 blocks on 132 SMs,
  // which h16 16 x 1024's 1,024 pass; 4 heads: 1,848, which 1,024 do not).
  const int64_t sms = multiprocessor_count(kPrefillOp);
  for (const int heads : {4, 2}) {
    const int64_t blocks =
        query_tiles(p, query_rows_per_block) * ((p.heads + heads - 1) / heads) * p.batch;
    if (heads <= p.heads && 2 * blocks >= 7 * heads * sms) return heads;
  }
  return 1;
}

template <class In>
void launch_prefill_kernel(const PrefillParams& p, DType out_dtype, cudaStream_t stream) {
  dispatch_float(kPrefillOp, out_dtype, [&](auto out_type) {
    using Out = decltype(out_type);
    const std::optional<PrefillTensorMaps> maps =
        p.vector_loads ? make_prefill_tensor_maps(p) : std::nullopt;
    if (maps) {
      using W = ws::Traits<In>;
      PrefillParams wp = p;
      wp.heads_per_block =
          p.heads_per_block > 0 ? p.heads_per_block : ws_heads_per_block(p, W::kBlockM);
      launch(ws::prefill_ws_kernel<In, Out>, "prefill_ws_kernel", wp, W::kBlockM, W::kThreads,
             W::kSmemBytes, stream, maps->q, maps->k_nope, maps->k_pe, maps->v);
    } else {
      PrefillParams mp = p;
      mp.heads_per_block = 1;  // the mma.sync kernel: one head per block
      launch(prefill_kernel<In, Out>, "prefill_kernel", mp, kBlockM, kThreads,
             static_cast<int>(sizeof(SharedStorage)), stream);
    }
  });
}

}  // namespace mlakit::cuda::prefill
