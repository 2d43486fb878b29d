// The sm90 absorbed-MQA decode kernel with warpgroup MMAs (docs/kernels/decode_sm90.md, "wgmma
// path"): 64 query rows per CTA over a native 16-bit, an fp8_e4m3 or an fp8_ds_mla cache. Work
// split, copy, q staging, masking and outputs are kernel_common.cuh's; the two products run on
// wgmma.
//
// CTA = 2 warpgroups with their own jobs (3 over fp8 caches), computing its part's segments of the
// work plan one after another; per 64-key tile t of a segment (stage t % 2):
//   copy warpgroup   its first thread issues the TMA copies (cache_tensor_map.hpp), two tiles
//                    ahead: tile t + 2 goes into stage t % 2 as soon as both warpgroups are done
//                    with tile t, each 128-byte column block announced on its own mbarrier
//                    (nobody waits for the copies but the score warpgroup, when it needs them);
//                    at a segment's start also the q tile, by TMA where q needs no conversion;
//   convert warpgroup  (fp8 caches) TMA lands the tile's raw e4m3 column blocks in the stage's
//                    last 36 KiB (fp8_e4m3; fp8_ds_mla: its 8 NoPE blocks in [32, 64) KiB, their
//                    scales in a ring beside the stages, the rope straight into block 8 in E); it
//                    converts them to the MMA element type (exact; fp8_ds_mla e4m3 * scale,
//                    rounded) in place, in the phases of traits_wgmma.cuh's schedule (which makes
//                    it safe), announced on a second mbarrier per block;
//   score warpgroup  zeroes the values of keys past the segment's end (last tile); S = q K_t^T
//                    with 36 wgmma m64n64k16 (the whole tile: q is read once per tile), in
//                    batches of kScoreBatchBlocks column blocks, each issued once its blocks'
//                    mbarriers complete; scale, mask, row max within the quad, online softmax; P
//                    (16-bit) over the stage's rope columns, which the values never read, and
//                    alpha (O's rescale) per row; signals P_READY(t);
//   values           each warpgroup O_g = O_g * alpha + P V_t[:, 256 g : 256 g + 256] (4 wgmma
//                    m64n256k16); the score warpgroup then signals STAGE_FREE(t).
// So the score warpgroup's scores of tile t + 1 run beside the copy warpgroup's values of tile t.
// Named barriers per stage (256 threads; bar.arrive by the score side, bar.sync by the copy side):
// P_READY, STAGE_FREE. A barrier of stage s is reused two tiles later; in between, the score
// warpgroup waits for tile t + 2, which the copy warpgroup issues only after its syncs of tile t,
// so no arrival runs a phase ahead; the same holds for the mbarriers and the alphas.
#pragma once

#include <cmath>
#include <cstdint>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <type_traits>

#include "cuda/common/grid_dependency.cuh"
#include "cuda/common/mbarrier.cuh"
#include "cuda/common/named_barrier.cuh"
#include "cuda/common/registers.cuh"
#include "cuda/common/shared_memory.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/decode/sm90/kernel_common.cuh"
#include "cuda/decode/sm90/params.cuh"
#include "cuda/decode/sm90/ptx.cuh"
#include "cuda/decode/sm90/traits.cuh"
#include "cuda/decode/sm90/traits_wgmma.cuh"

namespace mlakit::cuda::decode_sm90 {

// CuTe's description of WgmmaConfig's operand tiles and of the two tiled MMAs.
template <class Cfg>
struct WgmmaLayouts {
  using T = CuteHalf<std::is_same_v<typename Cfg::Element, Bf16Mma>>;
  using Rows = cute::Int<Cfg::kBlockM>;
  using Keys = cute::Int<kBlockN>;
  // q or K tile, (64 rows, 576 columns): the layout sw128_k_offset (traits_wgmma.cuh) spells out.
  using Operand = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<T>{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kDimQK>>{}));
  // P, (64 rows, 64 keys): one column block of the same layout.
  using P = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<T>{},
                                         cute::Shape<Rows, Keys>{}));
  // V^T, (512 dims, 64 keys): element (d, k) is K tile element (k, d) (the domain index of
  // (k, d) in Operand is k + 64 d), i.e. the K tile's first 512 columns read MN-major.
  using Vt =
      decltype(cute::composition(Operand{}, cute::make_layout(cute::Shape<cute::Int<kDimV>, Keys>{},
                                                              cute::Stride<Keys, cute::_1>{})));
  // S = q K^T: the score warpgroup computes all 64 keys of all 64 rows (wgmma m64n64k16).
  using MmaS = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<T, T, float, cute::Shape<Rows, Keys, cute::_16>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::K>()));
  // O += P V tiles N over the two warpgroups: threads [128 g, 128 g + 128) own columns block g.
  using Warpgroups = cute::Layout<cute::Shape<cute::_1, cute::Int<Cfg::kWarpgroups>, cute::_1>>;
  using MmaO = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<T, T, float,
                                 cute::Shape<Rows, cute::Int<Cfg::kColsPerWarpgroup>, cute::_16>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      Warpgroups{}));
};

// An accumulator partition ((2 columns, 2 rows, N / 8), MMA_M, MMA_N) seen as (rows, columns):
// rows ((2), MMA_M), columns ((2, N / 8), MMA_N). Columns 2i and 2i + 1 are adjacent.
template <class Frag>
__device__ __forceinline__ auto rows_by_columns(Frag&& t) {
  using namespace cute;
  const auto l = t.layout();
  static_assert(decltype(rank(l))::value == 3 && decltype(rank<0>(l))::value == 3,
                "a wgmma accumulator partition");
  return make_tensor(t.data(), make_layout(make_layout(get<0, 1>(l), get<1>(l)),
                                           make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l))));
}

// The named barriers of stage `stage` (see the top of the file); ids from 1 (0 is __syncthreads').
enum DecodeBarrier : int { kPReady = 1, kStageFree = 3 };
inline constexpr int kScoresZeroed = 5;  // the score warpgroup alone (128 threads)
inline constexpr int kRawBlockRead = 6;  // the convert warpgroup alone: a raw block has been read
// The two MMA warpgroups (kThreads), where a segment needs all of them (q staged, row statistics
// published, staged rows complete, the previous segment done with shared memory). The convert
// warpgroup of fp8 caches never joins: its only inputs are tiles whose TMA completions it waits
// for, issued after those barriers.
inline constexpr int kMmaBarrier = 7;
__device__ __forceinline__ void mma_barrier() { named_barrier_sync(kMmaBarrier, kThreads); }
// mma_barrier that returns the or of both warpgroups' `predicate`s.
__device__ __forceinline__ bool mma_barrier_or(bool predicate) {
  return named_barrier_or(kMmaBarrier, kThreads, predicate);
}
// Pages a 64-key tile spans at most: block_size 8 (cache_tensor_map.hpp).
inline constexpr int kMaxPagesPerTile = kBlockN / kMinBoxSlots;
// k-blocks of a wgmma m64n64k16 (16 columns) per 128-byte column block (64 columns).
inline constexpr int kKBlocksPerColumnBlock = kSwizzleBytes / 2 / 16;
// Column blocks per wgmma batch of the scores: each batch starts when its blocks have landed.
// Measured (H100, 2026-12-06): 3 beat 1 and 5 (bench/results/2026-12-06-h100-decode-sbatch-ab.md).
inline constexpr int kScoreBatchBlocks = 3;

// The TMA map of column block `block` of a tile: the cache's one map, or fp8_ds_mla's NoPE map for
// the 8 converted blocks and its rope map for block 8.
template <class Cfg>
__device__ __forceinline__ const CUtensorMap* block_map(const typename Cfg::CacheMaps& maps,
                                                        int block) {
  if constexpr (Cfg::kScaledTiles) {
    return block < Cfg::kConvertedBlocks ? &maps.nope : &maps.rope;
  } else {
    return &maps;
  }
}

// Zeroes the values (the first 512 columns) of keys [valid_keys, 64) of a stage; run by the 128
// threads of the score warpgroup (`tid` < 128).
template <class Cfg>
__device__ __forceinline__ void zero_values_past(uint8_t* stage, int valid_keys, int tid) {
  constexpr int kValueChunks = kDimV * 2 / 16;  // 16-byte chunks of a key's values
  const int units = (kBlockN - valid_keys) * kValueChunks;
  for (int u = tid; u < units; u += kWarpgroupThreads) {
    const int key = valid_keys + u / kValueChunks, chunk = u % kValueChunks;
    *reinterpret_cast<uint4*>(stage + Cfg::operand_offset(key, chunk)) = make_uint4(0, 0, 0, 0);
  }
}
__device__ __forceinline__ void barrier_arrive(DecodeBarrier b, int stage) {
  named_barrier_arrive(b + stage, kThreads);
}
__device__ __forceinline__ void barrier_sync(DecodeBarrier b, int stage) {
  named_barrier_sync(b + stage, kThreads);
}

// One segment of the CTA's work (make_work_item), as in kernel.cuh's decode_segment. `smem`: the
// dynamic shared memory rounded up to kBaseAlignment. `full_phase`: bit s is the parity of the
// next phase of stage s's mbarrier, `q_phase` that of the q tile's (score warpgroup; kept across
// segments).
template <class Cfg>
__device__ __forceinline__ void decode_segment_wgmma(const DecodeKernelParams& p,
                                                     const typename Cfg::CacheMaps& cache_maps,
                                                     const CUtensorMap& q_map, const WorkItem& w,
                                                     uint8_t* smem, uint32_t& full_phase,
                                                     uint32_t& q_phase) {
  using namespace cute;
  using L = WgmmaLayouts<Cfg>;
  using T = typename L::T;
  const int tid = static_cast<int>(threadIdx.x);
  const bool scorer = tid / kWarpgroupThreads == kScoreWarpgroup;
  const bool quad_leader = (tid & 3) == 0;  // the 4 lanes of a quad hold the same two rows
  bool bad = w.bad_seq_len;

  float* alpha_of = reinterpret_cast<float*>(smem + Cfg::kAlphaOffset);  // [kStages][64]
  float* row_sum = reinterpret_cast<float*>(smem + Cfg::kRowSumOffset);  // [64]
  float* row_max = reinterpret_cast<float*>(smem + Cfg::kRowMaxOffset);  // [64]
  auto stage = [&](int tile) {
    return smem + Cfg::kStageOffset + (tile % Cfg::kStages) * kTileBytes;
  };
  // The same for whole warps: the stage index broadcast from lane 0, so that ptxas sees it
  // warp-uniform and keeps the wgmma descriptors derived from it in uniform registers.
  auto warp_stage = [&](int tile) {
    const int st = __shfl_sync(0xffffffffu, tile % Cfg::kStages, 0);
    return smem + Cfg::kStageOffset + st * kTileBytes;
  };
  auto smem_t = [](uint8_t* bytes) { return make_smem_ptr(reinterpret_cast<T*>(bytes)); };
  // The mbarrier of column block `block` of stage `st`.
  const uint32_t full_barriers = smem_addr(smem + Cfg::kFullBarrierOffset);
  auto full_barrier = [&](int st, int block) {
    return full_barriers + 8 * (st * Cfg::kColumnBlocks + block);
  };
  // The mbarrier of column block `block` of stage `st` that the scores wait for: the landed block
  // (native; fp8_ds_mla's rope block 8) or its converted one (fp8).
  const uint32_t converted_barriers = smem_addr(smem + Cfg::kConvertedBarrierOffset);
  auto ready_barrier = [&](int st, int block) {
    return (block < Cfg::kConvertedBlocks ? converted_barriers : full_barriers) +
           8 * (st * Cfg::kColumnBlocks + block);
  };

  typename L::MmaO mma_o;
  const auto thr_o = mma_o.get_thread_slice(tid);
  auto acc_o = partition_fragment_C(mma_o, Shape<typename L::Rows, Int<kDimV>>{});  // 128 f32
  clear(acc_o);
  // O's registers as (2 rows, columns), with the (row, column) each holds. Every m64nNk16
  // accumulator gives lane l of warp v of a warpgroup rows 16 v + l / 4 and that + 8, so S (the
  // score warpgroup's) and O hold the same two rows per thread.
  auto o = rows_by_columns(acc_o);
  const auto o_coord = rows_by_columns(
      thr_o.partition_C(make_identity_tensor(Shape<typename L::Rows, Int<kDimV>>{})));
  static_assert(decltype(size<0>(o))::value == 2, "each thread holds two rows of O");
  const int local_row[2] = {get<0>(o_coord(0, 0)), get<0>(o_coord(1, 0))};

  // O = O * alpha + P_t V_t over this warpgroup's columns; alpha[h]: the rescale of row h.
  auto accumulate_values = [&](int t, const float(&alpha)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      CUTE_UNROLL
      for (int j = 0; j < size<1>(o); ++j) o(h, j) *= alpha[h];
    }
    const auto p_desc = thr_o.partition_fragment_A(  // (MMA, 1, 4 k blocks)
        make_tensor(smem_t(warp_stage(t) + Cfg::kPInStageOffset), typename L::P{}));
    const auto v_desc =
        thr_o.partition_fragment_B(make_tensor(smem_t(warp_stage(t)), typename L::Vt{}));
    warpgroup_gemm(mma_o, p_desc, v_desc, acc_o, true);
  };

  // The copy warpgroup's first thread issues the TMA copies (cache_tensor_map.hpp): per page of a
  // tile, one box of `box_slots` keys per 128-byte column block.
  const bool producer = tid == kCopyWarpgroup * kWarpgroupThreads;
  const int box_slots = p.block_size < kBlockN ? p.block_size : kBlockN;
  const int boxes = kBlockN / box_slots;  // pages per tile
  int next_pages[kMaxPagesPerTile];       // producer: page ids of the next tile to copy
  auto lookup_tile_pages = [&](int tile) {
    for (int i = 0; i < boxes; ++i) {
      const int pos = w.key_begin + tile * kBlockN + i * box_slots;
      next_pages[i] = pos < w.cta_end ? p.block_table[w.batch_index * p.block_table_stride_batch +
                                                      fast_divmod(pos, p.block_size_div).quotient *
                                                          p.block_table_stride_col]
                                      : -1;
    }
  };
  // Producer: announces tile `tile`'s bytes on its stage's mbarriers and issues its boxes, then
  // looks up the page ids of the tile after it. Pages past cta_end are not read; a block id
  // outside the cache sets `bad` and is not read either (the CTA's rows become NaN).
  const uint32_t scale_ring = smem_addr(smem + Cfg::kScaleOffset);  // fp8_ds_mla
  auto issue_tile = [&](int tile) {
    const int st = tile % Cfg::kStages;
    const uint32_t dst = smem_addr(stage(tile));
    uint32_t slots = 0;  // keys the tile's boxes copy (box_slots per page read)
    for (int i = 0; i < boxes; ++i) {
      const int pos = w.key_begin + tile * kBlockN + i * box_slots;
      const int page = next_pages[i];
      if (pos >= w.cta_end) continue;
      if (page < 0 || page >= p.num_blocks) {
        bad = true;
        next_pages[i] = -1;
        continue;
      }
      slots += box_slots;
    }
    // Each column block's mbarrier counts its keys' bytes there (fp8: 64 raw bytes a key;
    // native, fp8_ds_mla's rope: 128), block 0's also the fp8_ds_mla scales (16 bytes a key).
#pragma unroll
    for (int b = 0; b < Cfg::kColumnBlocks; ++b) {
      const uint32_t key_bytes = Cfg::landed_key_bytes(b) + (b == 0 ? Cfg::kScaleKeyBytes : 0);
      mbarrier_arrive_expect_tx(full_barrier(st, b), slots * key_bytes);
    }
    // Every box of the tile starts at the same slot of its page: with one page per tile
    // (block_size >= 64) trivially, and with several (block_size < 64 divides 64) each box is a
    // whole page's worth of keys further on. Pages outer, column blocks inner and unrolled: the
    // page ids stay in registers (blocks outer reloaded them from local memory per block).
    const int slot = fast_divmod(w.key_begin + tile * kBlockN, p.block_size_div).remainder;
    for (int i = 0; i < boxes; ++i) {
      if (next_pages[i] < 0) continue;
      if constexpr (Cfg::kScaledTiles) {  // the page's keys' 4 scales, rows of 16 bytes
        tma_load_3d(scale_ring + st * Cfg::kScaleStageBytes + i * box_slots * Cfg::kScaleKeyBytes,
                    &cache_maps.scales, full_barrier(st, 0), 0, slot, next_pages[i]);
      }
#pragma unroll
      for (int b = 0; b < Cfg::kColumnBlocks; ++b) {
        // (block row + page keys) x key bytes: ptxas gives the native kernel 245 registers for
        // this form, 254 for block offset + page keys x key bytes.
        tma_load_3d(dst + (Cfg::landed_block_row(b) + i * box_slots) * Cfg::landed_key_bytes(b),
                    block_map<Cfg>(cache_maps, b), full_barrier(st, b), Cfg::landed_block_column(b),
                    slot, next_pages[i]);
      }
    }
    if (tile + 1 < w.num_tiles) lookup_tile_pages(tile + 1);
  };
  // q: by TMA, the CTA's 64 rows (rows r = j N + n from row0, whole heads) as 9 boxes of 64
  // columns on the q mbarrier, issued first (the scores need it before any tile); else by the
  // threads, converted to the MMA element type.
  const uint32_t q_barrier = smem_addr(smem + Cfg::kQBarrierOffset);
  if (w.num_tiles > 0) {
    if (producer) {
      if (p.q_by_tma) {
        const DivMod jn = fast_divmod(w.row0, p.heads_div);  // first row: (query, head)
        mbarrier_arrive_expect_tx(q_barrier, Cfg::kQBytes);
#pragma unroll
        for (int b = 0; b < Cfg::kColumnBlocks; ++b) {
          tma_load_4d(smem_addr(smem + Cfg::kQOffset) + b * Cfg::kBlockM * kSwizzleBytes, &q_map,
                      q_barrier, b * (kSwizzleBytes / 2), jn.remainder, jn.quotient, w.batch_index);
        }
      }
      lookup_tile_pages(0);
      for (int t = 0; t < Cfg::kStages && t < w.num_tiles; ++t) issue_tile(t);
    }
    if (!p.q_by_tma) {
      load_q_tile<Cfg>(p, w, smem + Cfg::kQOffset);  // by the 2 MMA warpgroups (kThreads)
      fence_shared_for_wgmma();  // this thread's q stores become visible to wgmma
    }
  }
  mma_barrier();  // q is complete (thread loads) or on its way (TMA)

  float m_run[2] = {-INFINITY, -INFINITY};  // score warpgroup: running max of the row, log2 units
  float l_run[2] = {0.0f, 0.0f};            // score warpgroup: this thread's share of the row sum
  if (scorer) {
    typename L::MmaS mma_s;
    const auto thr_s = mma_s.get_thread_slice(tid);
    const auto q_desc =  // (MMA, 1, 36 k blocks)
        thr_s.partition_fragment_A(
            make_tensor(smem_t(smem + Cfg::kQOffset), typename L::Operand{}));
    auto acc_s = partition_fragment_C(mma_s, Shape<typename L::Rows, typename L::Keys>{});  // 32
    auto s = rows_by_columns(acc_s);
    const auto s_coord = rows_by_columns(
        thr_s.partition_C(make_identity_tensor(Shape<typename L::Rows, typename L::Keys>{})));
    int row_end[2];  // the end of the keys each of the thread's rows sees
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = w.row0 + local_row[h];
      row_end[h] = row < p.rows
                       ? min(w.key_end,
                             visible_end(w.seq_len, p.s_q, fast_divmod(row, p.heads_div).quotient))
                       : w.key_end;
    }

    const float score_scale_log2 = score_factor<Cfg>(p, w);
    if (p.q_by_tma && w.num_tiles > 0) {
      mbarrier_wait(q_barrier, q_phase);  // the q tile has landed
      q_phase ^= 1u;
    }
    for (int t = 0; t < w.num_tiles; ++t) {
      const int st = t % Cfg::kStages;
      const uint32_t parity = (full_phase >> st) & 1u;  // of this use of stage st's mbarriers
      full_phase ^= 1u << st;
      const int tile_start = w.key_begin + t * kBlockN;
      const int valid_keys = w.cta_end - tile_start;
      if (valid_keys < kBlockN) {
        // The tile's last keys were not copied or hold whatever the cache has past the end
        // (NaN-poisoned slots, say): zero their values, which P = 0 would still turn into NaN.
        // Their scores are masked by selection. The whole score warpgroup then sees the zeros.
        for (int b = 0; b < Cfg::kColumnBlocks; ++b) mbarrier_wait(ready_barrier(st, b), parity);
        zero_values_past<Cfg>(stage(t), valid_keys, tid);
        fence_shared_for_wgmma();
        named_barrier_sync(kScoresZeroed, kWarpgroupThreads);
      }
      const auto k_desc =
          thr_s.partition_fragment_B(make_tensor(smem_t(warp_stage(t)), typename L::Operand{}));
      // S = q K_t^T, in batches of kScoreBatchBlocks column blocks as they land: per batch the
      // waits for its blocks, a fence, its MMAs and a commit (the MMAs of earlier batches stay in
      // flight); then one wait for all.
      warpgroup_fence_operand(acc_s);
      mma_s.accumulate_ = GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int b0 = 0; b0 < Cfg::kColumnBlocks; b0 += kScoreBatchBlocks) {
        constexpr int kLast = Cfg::kColumnBlocks;
        CUTE_UNROLL
        for (int b = b0; b < b0 + kScoreBatchBlocks && b < kLast; ++b) {
          mbarrier_wait(ready_barrier(st, b), parity);
        }
        warpgroup_arrive();
        CUTE_UNROLL
        for (int k = b0 * kKBlocksPerColumnBlock;
             k < (b0 + kScoreBatchBlocks) * kKBlocksPerColumnBlock &&
             k < kLast * kKBlocksPerColumnBlock;
             ++k) {
          cute::gemm(mma_s, q_desc(_, _, k), k_desc(_, _, k), acc_s);
          mma_s.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_s);

      // scale, mask, row max, online softmax; P over the stage's rope columns
      const auto sP = make_tensor(smem_t(warp_stage(t) + Cfg::kPInStageOffset), typename L::P{});
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // The max over the raw scores (the factor is > 0: the same key wins), the factor in the
        // exponent's FFMA: one multiply per score fewer on this warpgroup's serial chain.
        float tile_max = -INFINITY;
        CUTE_UNROLL
        for (int j = 0; j < size<1>(s); ++j) {
          const int pos = tile_start + get<1>(s_coord(h, j));
          if (pos >= row_end[h]) s(h, j) = -INFINITY;
          tile_max = fmaxf(tile_max, s(h, j));
        }
        tile_max = quad_max(tile_max) * score_scale_log2;
        float m_use;
        alpha[h] = fold_tile_max<1, 1>(&tile_max, 0, m_run[h], l_run[h], m_use);
        if (quad_leader) alpha_of[st * Cfg::kBlockM + local_row[h]] = alpha[h];
        CUTE_UNROLL
        for (int j = 0; j < size<1>(s); j += 2) {
          const float p0 = fast_exp2(fmaf(s(h, j), score_scale_log2, -m_use));
          const float p1 = fast_exp2(fmaf(s(h, j + 1), score_scale_log2, -m_use));
          l_run[h] += p0 + p1;
          *reinterpret_cast<uint32_t*>(&sP(local_row[h], get<1>(s_coord(h, j)))) =
              Cfg::Element::pack(p0, p1);
        }
      }
      fence_shared_for_wgmma();  // this thread's P stores become visible to wgmma
      barrier_arrive(kPReady, st);
      accumulate_values(t, alpha);
      barrier_arrive(kStageFree, st);
    }
  } else {
    for (int t = 0; t < w.num_tiles; ++t) {
      const int st = t % Cfg::kStages;
      barrier_sync(kPReady, st);  // P_t and alpha_t are written (and tile t has landed)
      const float* alpha_t = alpha_of + st * Cfg::kBlockM;
      accumulate_values(t, {alpha_t[local_row[0]], alpha_t[local_row[1]]});
      barrier_sync(kStageFree, st);  // the score warpgroup is done with stage st
      if (producer && t + Cfg::kStages < w.num_tiles) issue_tile(t + Cfg::kStages);
    }
  }

  // ---- epilogue: the score warpgroup's row sums and maxima, then rows and LSEs.
  if (scorer) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float l = quad_sum(l_run[h]);
      if (quad_leader) {
        row_sum[local_row[h]] = l;
        row_max[local_row[h]] = m_run[h];
      }
    }
  }
  bad = report_bad_index(p, mma_barrier_or(bad));  // also publishes row_sum and row_max
  const RequestScales scales = epilogue_scales(p, w);
  bad = bad || scales.bad;
  // Every row the segment writes is staged in shared memory in its destination's dtype (a partial
  // row's partial_dtype, out's for the request's only segment) and written by one bulk copy per row
  // (out rows are 16-byte aligned: launch.cu): per-thread 4- or 8-byte stores from all CTAs at
  // once throttled the load/store unit (ncu, B4 s_kv 32768). 16-bit rows are staged over the q
  // tile, which the scores no longer read, so that the next segment's tiles may land in the stages
  // while the bulk copies read; f32 rows need the stages' room.
  const RuntimeDType staged_dtype = w.slot >= 0 ? p.partial_dtype : p.out_dtype;
  const int value_bytes = staged_dtype == RuntimeDType::kF32 ? 4 : 2;
  const int staged_stride = Cfg::staged_row_bytes(value_bytes);
  uint8_t* const staged_rows =  // [64][staged_stride]
      smem + (value_bytes == 2 ? Cfg::kQOffset : Cfg::kStageOffset);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = w.row0 + local_row[h];
    if (row >= p.rows) continue;
    const RowSink sink = finish_row(p, w, row, row_sum[local_row[h]], row_max[local_row[h]], bad,
                                    scales.value, scorer && quad_leader);
    if (sink.base == nullptr) continue;
    uint8_t* const staged_row = staged_rows + local_row[h] * staged_stride;
    with_pair_store(sink.dtype, [&](auto store) {
      CUTE_UNROLL
      for (int j = 0; j < size<1>(o); j += 2) {
        store(staged_row, get<1>(o_coord(h, j)), o(h, j) * sink.inv, o(h, j + 1) * sink.inv);
      }
    });
  }
  fence_shared_for_wgmma();  // the staged rows become visible to the bulk copies
  mma_barrier();
  const int row = w.row0 + tid;
  if (tid < Cfg::kBlockM && row < p.rows && (w.slot < 0 || row_has_values(row_sum[tid], bad))) {
    const RowDestination d = row_destination(p, w, row);
    bulk_store(static_cast<uint8_t*>(d.base) + d.offset * value_bytes,
               smem_addr(staged_rows + tid * staged_stride), kDimV * value_bytes);
    bulk_commit();
    bulk_wait_read();  // the staged rows' room is free again for the next segment
  }
}

// The convert warpgroup's part of a segment (fp8 caches): per tile, raw e4m3 -> the MMA element
// type in place, in the phases of traits_wgmma.cuh's schedule. It waits for nothing but the
// tiles' TMA completions: a tile is issued into a stage only once the MMA warpgroups are done
// with the stage's previous tile (and with the staged rows of a segment's end). Thread c of the
// warpgroup handles the 16-byte raw units u = c and c + 128 of each block (key u / 4, values
// 16 (u % 4) .. + 15 of the block: a warp's reads are 512 contiguous bytes) and writes them as the
// 16-bit chunks 2 (u % 4) and 2 (u % 4) + 1 of the key's row (every 8 lanes of a store meet 8
// distinct bank groups). fp8_ds_mla: each value times its key's scale of the block's 128 values
// (scale b / 2, read from the stage's scale ring, which block 0's mbarrier covers: a thread reads
// block 0 before any other), rounded to E as convert_tile does (convert_e4m3x8); its rope block
// is not touched. Each phase ends with a fence, and every thread arrives on the converted
// mbarriers of the blocks written (2.8 % faster than __syncwarp and one arrival per warp:
// bench/results/2026-12-06-h100-check-fp8.md).
template <class Cfg>
__device__ __forceinline__ void convert_segment(const WorkItem& w, uint8_t* smem,
                                                uint32_t& full_phase) {
  using Elem = typename Cfg::Element;
  constexpr int kUnitsPerKey = Cfg::kRawBlockBytes / kBlockN / 16;       // 16-byte raw units: 4
  constexpr int kPasses = Cfg::kRawBlockBytes / 16 / kWarpgroupThreads;  // units per thread: 2
  const int c = static_cast<int>(threadIdx.x) - kConvertWarpgroup * kWarpgroupThreads;
  const uint32_t full_barriers = smem_addr(smem + Cfg::kFullBarrierOffset);
  const uint32_t converted_barriers = smem_addr(smem + Cfg::kConvertedBarrierOffset);
  const uint32_t stages = smem_addr(smem + Cfg::kStageOffset);
  // This thread's raw unit c of a block, and its two 16-bit chunks in block 0 (key c / 4): the
  // other pass and blocks are constant offsets away.
  const uint32_t raw_unit = Cfg::kRawOffsetInStage + c * 16;
  const int key = c / kUnitsPerKey, chunk = 2 * (c % kUnitsPerKey);
  const uint32_t converted_chunk[2] = {Cfg::operand_offset(key, chunk),
                                       Cfg::operand_offset(key, chunk + 1)};
  constexpr int kPassKeys = kWarpgroupThreads / kUnitsPerKey;  // keys a pass covers: 32
  static_assert(kPassKeys % kSwizzleRows == 0,
                "a pass moves whole swizzle patterns, so its chunks keep their swizzle");
  // fp8_ds_mla: the scales of key c / 4 in stage 0's scale ring ([64 keys][4] f32)
  const uint32_t key_scales = smem_addr(smem + Cfg::kScaleOffset) + key * Cfg::kScaleKeyBytes;
  for (int t = 0; t < w.num_tiles; ++t) {
    const int st = t % Cfg::kStages;
    const uint32_t parity = (full_phase >> st) & 1u;
    full_phase ^= 1u << st;
    const uint32_t stage = stages + st * kTileBytes;
    const uint32_t scales = key_scales + st * Cfg::kScaleStageBytes;  // fp8_ds_mla
    auto read_block = [&](int b, uint4(&raw)[kPasses]) {
      mbarrier_wait(full_barriers + 8 * (st * Cfg::kColumnBlocks + b), parity);
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        raw[i] =
            ld_shared_v4(stage + raw_unit + b * Cfg::kRawBlockBytes + i * kWarpgroupThreads * 16);
      }
    };
    auto write_block = [&](int b, const uint4(&raw)[kPasses]) {
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        // pass i: key + 32 i, i.e. 32 rows (4 whole swizzle patterns) further
        const uint32_t block =
            stage + b * Cfg::kConvertedBlockBytes + i * kPassKeys * kSwizzleBytes;
        if constexpr (Cfg::kScaledTiles) {
          // the key's scale of the block's 128 values (entry scale b / 2)
          const float scale =
              ld_shared_f32(scales + i * kPassKeys * Cfg::kScaleKeyBytes +
                            b / Cfg::kBlocksPerScale * static_cast<int>(sizeof(float)));
          st_shared_v4(block + converted_chunk[0],
                       convert_e4m3x8<Elem, false>(raw[i].x, raw[i].y, scale));
          st_shared_v4(block + converted_chunk[1],
                       convert_e4m3x8<Elem, false>(raw[i].z, raw[i].w, scale));
          continue;
        }
        const uint32_t words[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
        uint32_t e[8];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          e[2 * k] = Elem::from_e4m3x2(words[k], false);
          e[2 * k + 1] = Elem::from_e4m3x2(words[k], true);
        }
        st_shared_v4(block + converted_chunk[0], make_uint4(e[0], e[1], e[2], e[3]));
        st_shared_v4(block + converted_chunk[1], make_uint4(e[4], e[5], e[6], e[7]));
      }
    };
    uint4 held[Cfg::kHeldBlocks][kPasses];
#pragma unroll
    for (int phase = 0; phase < Cfg::kConvertPhases; ++phase) {
      // every thread has read the raw blocks this phase overwrites
      if (phase > 0) named_barrier_sync(kRawBlockRead, kWarpgroupThreads);
#pragma unroll
      for (int b = 0; b < Cfg::kConvertedBlocks; ++b) {  // blocks read in an earlier phase
        if (Cfg::converted_write_phase(b) == phase && Cfg::raw_read_phase(b) < phase) {
          write_block(b, held[Cfg::held_slot(b)]);
        }
      }
#pragma unroll
      for (int b = 0; b < Cfg::kConvertedBlocks; ++b) {  // blocks read and written now
        if (Cfg::raw_read_phase(b) == phase && Cfg::converted_write_phase(b) == phase) {
          uint4 raw[kPasses];
          read_block(b, raw);
          write_block(b, raw);
        }
      }
#pragma unroll
      for (int b = 0; b < Cfg::kConvertedBlocks; ++b) {  // blocks read now, written later
        if (Cfg::raw_read_phase(b) == phase && Cfg::converted_write_phase(b) > phase) {
          read_block(b, held[Cfg::held_slot(b)]);
        }
      }
      fence_shared_for_wgmma();  // this thread's 16-bit values become visible to wgmma
#pragma unroll
      for (int b = 0; b < Cfg::kConvertedBlocks; ++b) {
        if (Cfg::converted_write_phase(b) == phase) {
          mbarrier_arrive(converted_barriers + 8 * (st * Cfg::kColumnBlocks + b));
        }
      }
    }
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kLaunchThreads, 1)
    mla_decode_sm90_wgmma_kernel(const __grid_constant__ DecodeKernelParams p,
                                 const __grid_constant__ typename Cfg::CacheMaps cache_maps,
                                 const __grid_constant__ CUtensorMap q_map) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* const smem =
      smem_raw + (-static_cast<int>(smem_addr(smem_raw)) & (Cfg::kBaseAlignment - 1));
  wait_for_prior_grids();
  allow_next_grid_launch();
  const CtaWork work = cta_work<Cfg>(p);
  if (threadIdx.x == 0) {
    for (int i = 0; i < Cfg::kStages * Cfg::kColumnBlocks; ++i) {
      mbarrier_init(smem_addr(smem + Cfg::kFullBarrierOffset + 8 * i), 1);  // the producer
    }
    mbarrier_init(smem_addr(smem + Cfg::kQBarrierOffset), 1);  // the producer
    if constexpr (Cfg::kConvert) {
      for (int i = 0; i < Cfg::kStages * Cfg::kColumnBlocks; ++i) {
        // every thread of the convert warpgroup (fp8_ds_mla's block 8 ones stay unused)
        mbarrier_init(smem_addr(smem + Cfg::kConvertedBarrierOffset + 8 * i), kWarpgroupThreads);
      }
    }
  }
  fence_mbarrier_init();  // the initialized mbarriers become visible to the TMA unit
  __syncthreads();
  uint32_t full_phase = 0, q_phase = 0;
  if constexpr (Cfg::kConvert) {
    if (threadIdx.x >= kThreads) {  // the convert warpgroup
      warpgroup_release_registers<Cfg::kConvertRegisters>();
      for (int segment = work.segment_begin; segment < work.segment_end; ++segment) {
        convert_segment<Cfg>(make_work_item<Cfg>(p, work.row0, segment), smem, full_phase);
      }
      return;
    }
    warpgroup_claim_registers<Cfg::kMmaRegisters>();
  }
  for (int segment = work.segment_begin; segment < work.segment_end; ++segment) {
    if (segment > work.segment_begin) mma_barrier();  // the last one is done with shared memory
    decode_segment_wgmma<Cfg>(p, cache_maps, q_map, make_work_item<Cfg>(p, work.row0, segment),
                              smem, full_phase, q_phase);
  }
  bulk_wait();  // this thread's bulk stores of staged rows, if any, have completed
}

}  // namespace mlakit::cuda::decode_sm90
