// Compile-time shape of the consumers of the warp-specialized prefill kernel (sm_90a,
// ws_kernel.cuh): tiles, the CuTe MMAs and the shared-memory layouts the warpgroup MMAs read
// through their descriptors.
#pragma once

#include <cutlass/numeric_types.h>

#include <algorithm>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>
#include <type_traits>

#include "cuda/common/elements.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/prefill/traits.cuh"

namespace mlakit::cuda::prefill::wgmma {

using namespace cute;

// kWarpGroups_: query rows of a block in units of one wgmma M of 64 rows (one warpgroup each).
// More rows share each K / V tile (less L2 traffic per FLOP) but take shared memory from the
// copy pipeline and registers from every thread. kBlockN_: keys per tile; larger tiles halve the
// per-key part of the softmax that runs once per tile (row maxima, O rescaled) but leave room
// for fewer stages (docs/perf-notes.md, "Prefill: warp specialization").
template <class In, int kWarpGroups_, int kBlockN_>
struct Traits {
  using Element = CuteHalf<std::is_same_v<In, BF16>>;
  static constexpr int kWarpGroups = kWarpGroups_;
  static constexpr int kBlockM = 64 * kWarpGroups;
  static constexpr int kThreads = 128 * kWarpGroups;  // 128 threads per warpgroup
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kTileBytes = kBlockN * (kHeadDimQK + kHeadDimV) * 2;
  static constexpr int kQBytes = kBlockM * kHeadDimQK * 2;
  // K/V tiles in shared memory: as many as fit beside Q (227 KiB opt-in limit, 1 KiB for the
  // alignment), at most 4 (3 tiles in flight already cover the L2 latency).
  static constexpr int kStages = std::min(4, (227 * 1024 - 1024 - kQBytes) / kTileBytes);
  static_assert(kStages >= 2, "a copy must be in flight while a tile is computed");

  using AtomLayout = Layout<Shape<Int<kWarpGroups>, _1, _1>>;  // warpgroups stacked along M
  // S = Q K^T: A = Q, B = K, both K-major (head dims contiguous) in shared memory.
  using MmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDimQK>>>(),
      AtomLayout{}));
  // O += P V: A = P from registers (S's accumulator layout is the A fragment layout), B = V seen
  // as (dims, keys): dims contiguous, i.e. MN-major.
  using MmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float,
                           Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      AtomLayout{}));

  // 8 rows x 64 elements (128 bytes) with the 128-byte swizzle: conflict-free for the wgmma
  // operand reads, and what TMA writes with CU_TENSOR_MAP_SWIZZLE_128B.
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDimQK>>{}));
  using SmemLayoutK =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDimQK>, Int<kStages>>{}));
  using SmemLayoutV =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDimV>, Int<kStages>>{}));
  // The same bytes as (dims, keys, stage): the B operand of O += P V.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{}, make_ordered_layout(Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{},
                                         Step<_2, _1, _3>{})));

  // 1024-byte alignment: a 128-byte-swizzle atom (8 rows x 128 bytes) must start on one.
  struct SharedStorage {
    array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
  };
  // Dynamic shared memory is only 16-byte aligned: room to round the base up to 1024.
  static constexpr int kSmemBytes = sizeof(SharedStorage) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "one block must fit sm_90's 227 KiB opt-in limit");
};

}  // namespace mlakit::cuda::prefill::wgmma
