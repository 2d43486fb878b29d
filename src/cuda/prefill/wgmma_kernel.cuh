// Device code of the wgmma prefill kernel (sm_90a; docs/kernels/prefill_cuda.md).
//
// Block = (192 query rows, head, request), three warpgroups of 64 rows each (wgmma_traits.cuh:
// more rows per K/V tile means less L2 traffic per FLOP). The Q tile [192, 192] and, per key tile
// of 64, K [64, k_nope 128 | k_pe 64] and V [64, 128] are copied with cp.async into
// 128-byte-swizzled shared memory, kStages - 1 tiles ahead of the one computed. Per tile each
// warpgroup runs
//   S = Q K^T   wgmma m64n64k16, both operands from shared memory, f32 accumulators;
//   softmax     online, in log2 units, on S's registers (online_softmax.cuh);
//   O += P V    wgmma m64n128k16 (k = 64 keys), P from registers (rounded to the input type), V
//               from shared memory read as (dims, keys).
// Causal: key tiles wholly above the block's diagonal are skipped, tiles crossing it are masked
// (bottom-right alignment). Takes 16-byte aligned rows with contiguous dims (PrefillParams::
// vector_loads); other layouts run the mma.sync kernel (kernel.cuh).
#pragma once

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/tensor.hpp>

#include "cuda/prefill/online_softmax.cuh"
#include "cuda/prefill/params.cuh"
#include "cuda/prefill/ptx.cuh"
#include "cuda/prefill/request.cuh"
#include "cuda/prefill/wgmma_traits.cuh"

namespace mlakit::cuda::prefill::wgmma {

// kRows rows of kWidth elements into a swizzled tile as 16-byte chunks (8 elements) spread over
// kThreads threads; rows >= rows_valid are zero-filled (src not read). row_src(row) is the row's
// first element in global memory. A zero-filled chunk still names a source address: row 0's when
// there is one (written memory of the same tensor, so that initcheck, which does not honour the
// zero source size, has nothing to report), else any_global.
template <int kThreads, int kRows, int kWidth, class Tile, class RowSrc>
__device__ __forceinline__ void copy_rows(Tile&& tile, int rows_valid, RowSrc&& row_src,
                                          const void* any_global) {
  constexpr int kChunksPerRow = kWidth / kChunk;
  constexpr int kChunks = kRows * kChunksPerRow;
  const void* unread = rows_valid > 0 ? static_cast<const void*>(row_src(0)) : any_global;
#pragma unroll
  for (int i = 0; i < (kChunks + kThreads - 1) / kThreads; ++i) {
    const int c = i * kThreads + threadIdx.x;
    if (kChunks % kThreads != 0 && c >= kChunks) break;
    const int row = c / kChunksPerRow, col = (c % kChunksPerRow) * kChunk;
    const bool valid = row < rows_valid;
    cp_async_16(&tile(row, col), valid ? static_cast<const void*>(row_src(row) + col) : unread,
                valid ? 16 : 0);
  }
}

template <class In, class Out, class T = Traits<In>>
__global__ void __launch_bounds__(T::kThreads, 1)
    prefill_kernel(const __grid_constant__ PrefillParams p) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kThreads = T::kThreads;
  constexpr int kScoreTiles = kBlockN / 8;  // n8 tiles of S per thread row pair
  constexpr int kOutTiles = kHeadDimV / 8;  // n8 tiles of O

  extern __shared__ char smem_raw[];
  auto* storage = reinterpret_cast<typename T::SharedStorage*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) / 1024 * 1024);
  auto sQ = make_tensor(make_smem_ptr(storage->q.data()), typename T::SmemLayoutQ{});
  auto sK = make_tensor(make_smem_ptr(storage->k.data()), typename T::SmemLayoutK{});
  auto sV = make_tensor(make_smem_ptr(storage->v.data()), typename T::SmemLayoutV{});
  auto sVt = make_tensor(make_smem_ptr(storage->v.data()), typename T::SmemLayoutVt{});

  const int head = blockIdx.y, b = blockIdx.z;
  Request r;
  if (!resolve_request<Out>(p, head, b, r)) return;
  // First query row of the block within the request. Reversed: the blocks launched first hold
  // the last rows, which see the most keys under the causal mask (shorter tail of the grid).
  const int row0 = (gridDim.x - 1 - blockIdx.x) * kBlockM;
  if (row0 >= r.sq) return;
  const int rows_valid = min(kBlockM, r.sq - row0);
  const KeyRange keys = key_range(r, p.causal, row0, rows_valid);
  const int key_tiles = (keys.block_keys + kBlockN - 1) / kBlockN;

  const auto* q = static_cast<const Element*>(p.q);
  const auto* k_nope = static_cast<const Element*>(p.k_nope);
  const auto* k_pe = static_cast<const Element*>(p.k_pe);
  const auto* v = static_cast<const Element*>(p.v);
  // Tile t's K rows / V rows into `stage` (keys past the request are zero: 0 * NaN is NaN).
  auto load_tile = [&](int t, int stage) {
    const int64_t key0 = r.k_begin + int64_t{t} * kBlockN;
    const int valid = min(kBlockN, r.sk - t * kBlockN);
    auto k_tile = sK(_, _, stage);
    copy_rows<kThreads, kBlockN, kNope>(
        k_tile, valid,
        [&](int row) {
          return k_nope + (key0 + row) * p.k_nope_stride[0] + head * p.k_nope_stride[1];
        },
        p.k_nope);
    copy_rows<kThreads, kBlockN, kRope>(
        [&](int row, int col) -> Element& { return k_tile(row, kNope + col); }, valid,
        [&](int row) { return k_pe + (key0 + row) * p.k_pe_stride[0]; }, p.k_pe);
    copy_rows<kThreads, kBlockN, kHeadDimV>(
        sV(_, _, stage), valid,
        [&](int row) { return v + (key0 + row) * p.v_stride[0] + head * p.v_stride[1]; }, p.v);
  };
  // Prologue: Q and the first kStages - 1 tiles, one commit group per tile (Q rides with tile 0).
  if (key_tiles > 0) {
    copy_rows<kThreads, kBlockM, kHeadDimQK>(
        sQ, rows_valid,
        [&](int row) {
          return q + (r.q_begin + row0 + row) * p.q_stride[0] + head * p.q_stride[1];
        },
        p.q);
  }
#pragma unroll
  for (int t = 0; t < T::kStages - 1; ++t) {
    if (t < key_tiles) load_tile(t, t);
    cp_async_commit();
  }

  typename T::MmaQK mma_qk;
  typename T::MmaPV mma_pv;
  auto thread_qk = mma_qk.get_thread_slice(threadIdx.x);
  auto thread_pv = mma_pv.get_thread_slice(threadIdx.x);
  auto tSrQ = thread_qk.partition_fragment_A(sQ);   // descriptors (MMA, MMA_M, MMA_K)
  auto tSrK = thread_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stage)
  auto tOrV = thread_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage)
  auto tSrS = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
  auto tOrO = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kHeadDimV>>{});
  static_assert(size(tSrS) == kScoreTiles * 4 && size(tOrO) == kOutTiles * 4,
                "one warpgroup's m64 accumulators: 4 values per n8 tile per thread");
  // P as the A operand of O += P V: per k-step of 16 keys, S's values of n8 tiles 2k and 2k + 1
  // in the same order (the wgmma accumulator and register-A layouts coincide for 16-bit A).
  auto tOrP = make_tensor<Element>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBlockN / 16>>>{});
  clear(tOrO);
  auto score = [&](int j, int i) -> float& { return tSrS(4 * j + i); };
  auto out = [&](int j, int i) -> float& { return tOrO(4 * j + i); };

  const int lane = threadIdx.x % 32;
  // The thread's first row in the request: warpgroup slab, warp's 16 rows, lane's row.
  const int thread_row = row0 + (threadIdx.x / 128) * 64 + (threadIdx.x % 128) / 32 * 16 + lane / 4;
  RowState rows;
  for (int t = 0; t < key_tiles; ++t) {
    const int stage = t % T::kStages;
    cp_async_wait<T::kStages - 2>();  // tile t (and Q) landed: only newer groups may be pending
    fence_shared_for_wgmma();
    // Everyone's copies of tile t are visible, and everyone is done with tile t - 1, whose stage
    // the copy below reuses.
    __syncthreads();
    const int next = t + T::kStages - 1;
    if (next < key_tiles) load_tile(next, next % T::kStages);
    cp_async_commit();  // possibly empty: keeps one group per tile for the wait above

    warpgroup_gemm(mma_qk, tSrQ, tSrK(_, _, _, stage), tSrS, false);
    const int key0 = t * kBlockN;
    // Masked when some key of the tile is past the first row's limit (causal) or past sk.
    const bool masked = key0 + kBlockN > keys.first_row_keys;
    int key_limit[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      key_limit[h] = row_key_limit(r, keys, p.causal, thread_row + 8 * h, key0);
    }
    softmax_tile<kScoreTiles, kOutTiles>(score, p.scale_log2, masked, key_limit, lane, rows, out);
#pragma unroll
    for (int i = 0; i < size(tOrP); ++i) tOrP(i) = static_cast<Element>(tSrS(i));
    warpgroup_gemm<true>(mma_pv, tOrP, tOrV(_, _, _, stage), tOrO, true);
  }
  cp_async_wait<0>();  // only empty groups can remain; none may outlive the block
  store_rows<Out, kOutTiles>(p, r, head, thread_row, lane, rows, out);
}

}  // namespace mlakit::cuda::prefill::wgmma
