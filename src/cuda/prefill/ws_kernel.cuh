// Device code of the warp-specialized prefill kernel (sm_90a; docs/kernels/prefill_sm90.md,
// "The warp-specialized kernel").
//
// Block = (128 query rows, p.heads_per_block heads, request), the heads one after the other
// (items), three warpgroups:
//   producer   (threads 0-127, 40 registers) its first thread issues every copy by TMA: per item
//              the Q tile [128, 192] (once the consumers are done with the previous item's), then
//              per key tile of 128 K [128, k_nope 128 | k_pe 64] and V [128, 128] into a ring of
//              kStages (2) stages that runs on across items, each stage announced on a `full`
//              mbarrier (transaction bytes) and refilled once both consumers released it on its
//              `empty` mbarrier; so the next item's Q and first tiles land while the consumers
//              finish the current one (its last P V and its epilogue);
//   consumers  (threads 128-383, 232 registers) 64 query rows each, per tile: S = Q K^T (wgmma
//              m64n128k16), online softmax on S's registers, O += P V (P from registers), then
//              release the stage. No CTA barrier per tile: a consumer waits only for its tile.
//              Tile t's S and tile t-1's P V are issued as two wgmma batches at once, so the
//              softmax of tile t overlaps P V (O is rescaled once P V has landed). The two
//              consumers take turns issuing (ping-pong), one's softmax beside the other's MMAs.
// Keys past the request in the last tile come from the next request or TMA's zero fill: their
// scores are masked, and their V rows are zeroed (0 * NaN would poison P V).
#pragma once

#include <cute/tensor.hpp>

#include "cuda/common/mbarrier.cuh"
#include "cuda/common/named_barrier.cuh"
#include "cuda/common/registers.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/prefill/online_softmax.cuh"
#include "cuda/prefill/params.cuh"
#include "cuda/prefill/ptx.cuh"
#include "cuda/prefill/request.cuh"
#include "cuda/prefill/wgmma_traits.cuh"

namespace mlakit::cuda::prefill::ws {

using namespace cute;

// The consumers' MMAs, layouts and shared storage come from wgmma::Traits with 2 warpgroups (128
// rows) and 128-key tiles (2 stages of K/V fit beside Q; the producer needs no deeper ring, since
// TMA keeps no thread waiting); one producer warpgroup more.
template <class In>
struct Traits : wgmma::Traits<In, 2, 128> {
  using Base = wgmma::Traits<In, 2, 128>;
  static constexpr int kConsumerThreads = Base::kThreads;              // 256
  static constexpr int kThreads = kConsumerThreads + 128;              // + the producer
  static constexpr int kConsumerWarps = kConsumerThreads / 32;         // 8
  static constexpr int kKStageBytes = Base::kBlockN * kHeadDimQK * 2;  // 48 KiB
  static constexpr int kVStageBytes = Base::kBlockN * kHeadDimV * 2;   // 32 KiB
  static constexpr int kColumnBlockValues = 64;                        // one 128-byte span
  // 65536 / 384 -> 168 registers per thread at launch; the producer keeps 40 (coordinates and
  // barrier addresses), the consumers take 232 (2 x 232 + 40 = 3 x 168).
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
  // K and V of a stage have their own barriers: K is done with after S = Q K^T, V only after the
  // next tile's S (P V runs one tile behind), so each is refilled as soon as it is free.
  struct Barriers {
    uint64_t k_full[Base::kStages];   // the stage's K has landed (producer + transaction bytes)
    uint64_t v_full[Base::kStages];   // the stage's V has landed
    uint64_t k_empty[Base::kStages];  // every consumer warp is done with the stage's K
    uint64_t v_empty[Base::kStages];  // ... with the stage's V
    uint64_t q_full;                  // the Q tile has landed
    uint64_t q_empty;                 // every consumer warp is done with the item's Q
  };
  static constexpr int kSmemBytes = Base::kSmemBytes + static_cast<int>(sizeof(Barriers));
  static_assert(kSmemBytes <= 227 * 1024, "one block must fit sm_90's 227 KiB opt-in limit");
  static_assert(2 * kConsumerRegisters + kProducerRegisters <= 3 * (65536 / kThreads / 8 * 8),
                "setmaxnreg: the warpgroups' registers fit the launch's pool");
};

template <class In, class Out, class T = Traits<In>>
__global__ void __launch_bounds__(T::kThreads, 1)
    prefill_ws_kernel(const __grid_constant__ PrefillParams p,
                      const __grid_constant__ CUtensorMap q_map,
                      const __grid_constant__ CUtensorMap k_nope_map,
                      const __grid_constant__ CUtensorMap k_pe_map,
                      const __grid_constant__ CUtensorMap v_map) {
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kStages = T::kStages;
  constexpr int kScoreTiles = kBlockN / 8;  // n8 tiles of S per thread row pair
  constexpr int kOutTiles = kHeadDimV / 8;  // n8 tiles of O
  constexpr int kSwizzleBytes = 128;        // one column block row

  extern __shared__ char smem_raw[];
  auto* storage = reinterpret_cast<typename T::SharedStorage*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) / 1024 * 1024);
  auto* bars = reinterpret_cast<typename T::Barriers*>(storage + 1);
  auto sQ = make_tensor(make_smem_ptr(storage->q.data()), typename T::SmemLayoutQ{});
  auto sK = make_tensor(make_smem_ptr(storage->k.data()), typename T::SmemLayoutK{});
  auto sV = make_tensor(make_smem_ptr(storage->v.data()), typename T::SmemLayoutV{});
  auto sVt = make_tensor(make_smem_ptr(storage->v.data()), typename T::SmemLayoutVt{});

  // Every item but the first finds its Q and first tiles loaded during the previous item's end,
  // and the block's start (barriers, request lookup) is paid once per block. The items have the
  // same key tiles (same rows, same request), so the blocks' work stays as even as with one head.
  const int head0 = blockIdx.y * p.heads_per_block, b = blockIdx.z;
  const int items = min(p.heads_per_block, p.heads - head0);  // heads [head0, head0 + items)
  Request r;
  if (!resolve_request<Out>(p, head0, items, b, r)) return;
  // Reversed: the blocks launched first hold the last rows, which see the most keys (causal).
  const int row0 = (gridDim.x - 1 - blockIdx.x) * kBlockM;
  if (row0 >= r.sq) return;
  const int rows_valid = min(kBlockM, r.sq - row0);
  const KeyRange keys = key_range(r, p.causal, row0, rows_valid);
  const int key_tiles = (keys.block_keys + kBlockN - 1) / kBlockN;

  auto bar = [](uint64_t& m) { return smem_address(&m); };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(bar(bars->k_full[s]), 1);                   // the producer
      mbarrier_init(bar(bars->v_full[s]), 1);                   // the producer
      mbarrier_init(bar(bars->k_empty[s]), T::kConsumerWarps);  // lane 0 of every consumer warp
      mbarrier_init(bar(bars->v_empty[s]), T::kConsumerWarps);
    }
    mbarrier_init(bar(bars->q_full), 1);
    mbarrier_init(bar(bars->q_empty), T::kConsumerWarps);
  }
  fence_mbarrier_init();  // the initialized mbarriers become visible to the TMA unit
  __syncthreads();        // the last CTA barrier: the roles part here

  if (threadIdx.x < 128) {  // the producer warpgroup
    warpgroup_release_registers<T::kProducerRegisters>();
    if (threadIdx.x != 0 || key_tiles == 0) return;
    // `blocks` boxes of 64 columns x `rows` rows (of `head`, from `row`), one after the other at
    // dst: the swizzled column blocks of a tile, each rows x 128 bytes.
    auto load_column_blocks = [&](uint32_t dst, const CUtensorMap& map, uint32_t full, int blocks,
                                  int rows, int head_coord, int row) {
      for (int kb = 0; kb < blocks; ++kb) {
        tma_load_3d(dst + kb * rows * kSwizzleBytes, &map, full, kb * T::kColumnBlockValues,
                    head_coord, row);
      }
    };
    constexpr int kBlocksQ = kHeadDimQK / T::kColumnBlockValues;  // 3
    constexpr int kBlocksNope = kNope / T::kColumnBlockValues;    // 2
    constexpr int kBlocksV = kHeadDimV / T::kColumnBlockValues;   // 2
    const uint32_t k_dst = smem_address(storage->k.data()), v_dst = smem_address(storage->v.data());
    // g counts the ring's tiles across items: K of ring tile g waits for S of ring tile
    // g - kStages, V for P V of ring tile g - kStages; item i's Q for the consumers' last S of
    // item i - 1.
    for (int item = 0, g = 0; item < items; ++item) {
      const int head = head0 + item;
      if (item > 0) mbarrier_wait(bar(bars->q_empty), (item - 1) & 1);
      mbarrier_arrive_expect_tx(bar(bars->q_full), T::kQBytes);
      load_column_blocks(smem_address(storage->q.data()), q_map, bar(bars->q_full), kBlocksQ,
                         kBlockM, head, static_cast<int>(r.q_begin + row0));
      for (int t = 0; t < key_tiles; ++t, ++g) {
        const int stage = g % kStages, key0 = static_cast<int>(r.k_begin) + t * kBlockN;
        const uint32_t empty_parity = ((g / kStages) - 1) & 1;
        if (g >= kStages) mbarrier_wait(bar(bars->k_empty[stage]), empty_parity);
        const uint32_t k_full = bar(bars->k_full[stage]);
        mbarrier_arrive_expect_tx(k_full, T::kKStageBytes);
        const uint32_t k_stage = k_dst + stage * T::kKStageBytes;
        load_column_blocks(k_stage, k_nope_map, k_full, kBlocksNope, kBlockN, head, key0);
        // k_pe, shared by the heads, after k_nope's column blocks.
        load_column_blocks(k_stage + kBlocksNope * kBlockN * kSwizzleBytes, k_pe_map, k_full, 1,
                           kBlockN, 0, key0);
        if (g >= kStages) mbarrier_wait(bar(bars->v_empty[stage]), empty_parity);
        const uint32_t v_full = bar(bars->v_full[stage]);
        mbarrier_arrive_expect_tx(v_full, T::kVStageBytes);
        load_column_blocks(v_dst + stage * T::kVStageBytes, v_map, v_full, kBlocksV, kBlockN, head,
                           key0);
      }
    }
    return;
  }

  warpgroup_claim_registers<T::kConsumerRegisters>();
  const int ct = static_cast<int>(threadIdx.x) - 128;  // 0..255: the consumers' thread index
  typename T::MmaQK mma_qk;
  typename T::MmaPV mma_pv;
  // The shared-memory operands' descriptors depend only on the warpgroup: taken for its first
  // thread, broadcast from lane 0, ptxas sees them warp-uniform and keeps them in uniform
  // registers (no R2UR before each wgmma).
  const int warpgroup_first = __shfl_sync(0xffffffffu, ct & ~127, 0);
  auto operands_qk = mma_qk.get_thread_slice(warpgroup_first);
  auto operands_pv = mma_pv.get_thread_slice(warpgroup_first);
  auto tSrQ = operands_qk.partition_fragment_A(sQ);   // descriptors (MMA, MMA_M, MMA_K)
  auto tSrK = operands_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stage)
  auto tOrV = operands_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage)
  auto tSrS = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
  auto tOrO = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kHeadDimV>>{});
  static_assert(size(tSrS) == kScoreTiles * 4 && size(tOrO) == kOutTiles * 4,
                "one warpgroup's m64 accumulators: 4 values per n8 tile per thread");
  auto tOrP = make_tensor<Element>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBlockN / 16>>>{});
  auto score = [&](int j, int i) -> float& { return tSrS(4 * j + i); };
  auto out = [&](int j, int i) -> float& { return tOrO(4 * j + i); };

  const int lane = ct % 32;
  const int thread_row = row0 + (ct / 128) * 64 + (ct % 128) / 32 * 16 + lane / 4;
  RowState rows;
  // Tile t's V rows past the request hold the next request's values or TMA's zeros: zero them,
  // since their P = 0 would still turn a NaN there into NaN rows. Only the last tile can have
  // such rows; both consumers zero half, then both wait.
  auto zero_values_past_request = [&](int t, int stage) {
    const int valid = r.sk - t * kBlockN;  // keys of the request in this tile
    if (valid >= kBlockN) return;
    auto v_tile = sV(_, _, stage);
    for (int i = ct; i < (kBlockN - valid) * kHeadDimV; i += T::kConsumerThreads) {
      v_tile(valid + i / kHeadDimV, i % kHeadDimV) = Element(0.0f);
    }
    fence_shared_for_wgmma();
    named_barrier_sync(1, T::kConsumerThreads);
  };
  auto release = [&](uint64_t& empty) {  // this warp is done with a stage's K or V
    __syncwarp();
    if (lane == 0) mbarrier_arrive(bar(empty));
  };
  // Probabilities of tile t in S (raw scores on entry); rescale: O's factors (softmax_scores).
  auto tile_softmax = [&](int t, float(&rescale)[2]) {
    const int key0 = t * kBlockN;
    const bool masked = key0 + kBlockN > keys.first_row_keys;
    int key_limit[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      key_limit[h] = row_key_limit(r, keys, p.causal, thread_row + 8 * h, key0);
    }
    softmax_scores<kScoreTiles>(score, p.scale_log2, masked, key_limit, lane, rows, rescale);
  };
  auto scores_to_p = [&] {
#pragma unroll
    for (int i = 0; i < size(tOrP); ++i) tOrP(i) = static_cast<Element>(tSrS(i));
  };
  // g: the ring's tile count (across items) of the item's tile t; both return the stage.
  auto wait_keys = [&](int g) {
    const int stage = g % kStages;
    mbarrier_wait(bar(bars->k_full[stage]), (g / kStages) & 1);
    return stage;
  };
  auto wait_values = [&](int g, int t) {
    const int stage = g % kStages;
    mbarrier_wait(bar(bars->v_full[stage]), (g / kStages) & 1);
    zero_values_past_request(t, stage);
    return stage;
  };
  // Ping-pong: the consumers take turns issuing their MMAs (group 0 first), so that one's
  // softmax runs while the other's MMAs occupy the tensor cores. Named barrier 2 + g is group
  // g's turn: it waits there, issues, and passes the turn by arriving at the other's.
  const int group = ct / 128;
  constexpr int kTurnBarrier = 2;  // 1 is the V zeroing's
  auto wait_turn = [&] { named_barrier_sync(kTurnBarrier + group, T::kConsumerThreads); };
  auto pass_turn = [&] { named_barrier_arrive(kTurnBarrier + 1 - group, T::kConsumerThreads); };
  // The items (heads) one after the other; the ring's tile count runs on across them.
  for (int item = 0, g0 = 0; item < items; ++item, g0 += key_tiles) {
    const int head = head0 + item;
    rows = RowState{};
    clear(tOrO);
    if (key_tiles > 0) {
      // Tile 0: S alone (O is still 0: no rescale).
      if (group == 1) pass_turn();
      mbarrier_wait(bar(bars->q_full), item & 1);
      const int stage = wait_keys(g0);
      wait_turn();
      warpgroup_gemm_issue(mma_qk, tSrQ, tSrK(_, _, _, stage), tSrS, false);
      pass_turn();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      release(bars->k_empty[stage]);
      float rescale[2];
      tile_softmax(0, rescale);
      scores_to_p();
    }
    // Intra-warpgroup overlap: tile t's S = Q K^T and tile t-1's O += P V are issued together;
    // the softmax of tile t runs while P V still does, and O is rescaled once P V has landed. The
    // body has no branch around a wgmma or a wait (ptxas, unable to pair such branches,
    // serializes every wgmma of the kernel).
    for (int t = 1; t < key_tiles; ++t) {
      const int stage = wait_keys(g0 + t), previous = wait_values(g0 + t - 1, t - 1);
      wait_turn();
      warpgroup_gemm_issue(mma_qk, tSrQ, tSrK(_, _, _, stage), tSrS, false);
      warpgroup_gemm_issue<true>(mma_pv, tOrP, tOrV(_, _, _, previous), tOrO, true);
      pass_turn();
      warpgroup_wait<1>();  // batches complete in order: S has landed, P V may still run
      warpgroup_fence_operand(tSrS);
      release(bars->k_empty[stage]);
      float rescale[2];
      tile_softmax(t, rescale);
      warpgroup_wait<0>();  // tile t-1's P V has landed: O and P are free
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
      release(bars->v_empty[previous]);
      rescale_out<kOutTiles>(out, rescale);
      scores_to_p();
    }
    if (key_tiles > 0) {
      release(bars->q_empty);  // every S of the item is done: the next item's Q may come in
      const int last = wait_values(g0 + key_tiles - 1, key_tiles - 1);
      wait_turn();
      warpgroup_gemm_issue<true>(mma_pv, tOrP, tOrV(_, _, _, last), tOrO, true);
      // Group 1's last turn of an item passes to no one (its next item's start passes it): no
      // arrival outlives the block.
      if (group == 0) pass_turn();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
      release(bars->v_empty[last]);
    }
    store_rows<Out, kOutTiles>(p, r, head, thread_row, lane, rows, out);
  }
}

}  // namespace mlakit::cuda::prefill::ws
