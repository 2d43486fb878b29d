// The sm90 wgmma decode for an fp8 q over an fp8_e4m3 cache (docs/kernels/decode_sm90.md, "e4m3
// wgmma"): 64 query rows per CTA (WgmmaE4m3Config). Shares the work split, q tile, TMA producer
// and epilogue with kernel_wgmma.cuh; the products differ:
//   scores  S = q K^T on e4m3 wgmma (m64n64k32, exact products) straight from the raw tile, which
//           TMA lands K-major with the 64-byte swizzle (cache_tensor_map.hpp); the tensor cores'
//           sums of 64 dims at a time are added in f32 (kScoreBlocksPerSum);
//   values  O += P V in f16: wgmma reads B only K-major for e4m3, and V^T is the raw tile read
//           MN-major, so the copy warpgroup converts V (512 of the 576 columns) once per tile into
//           a 16-bit tile that both warpgroups read, as the 16-bit kernel reads its stage.
// Per tile t (raw stage t % 3, P stage t % 2, one converted V):
//   score warpgroup  waits for tile t; S; softmax; P_t and alpha_t; P_READY(t); waits V_READY;
//                    O[:, 0:256] += P_t V_t; V_DONE;
//   copy warpgroup   waits for tile t and V_DONE (the last V is read); converts V_t (zero past
//                    the segment's end); V_READY; waits P_READY(t) (so S_t and every conversion
//                    read of stage t are done: its first thread refills the stage with tile t + 3);
//                    O[:, 256:512] += P_t V_t.
// So the copy warpgroup's conversion of V_{t+1} runs beside the score warpgroup's S_{t+1}.
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "cuda/decode/sm90/kernel_wgmma.cuh"

namespace mlakit::cuda::decode_sm90 {

inline constexpr int kVReady = 6;  // named barriers of the e4m3 kernel (ids after kernel_wgmma's)
inline constexpr int kVDone = 7;
// e4m3 wgmma keeps its sums with a short mantissa (about 14 bits on H100/H200, DeepSeek-V3's
// report), so the scores are summed in f32 over groups of k blocks, each a fresh wgmma batch.
// Measured LSE errors (a 1000-key request, q_scale 2, k_scale 3): 7.6e-3 with one batch of 18
// blocks, 1.4e-3 with groups of 4 (the test's bound there: 9.4e-4); groups of 2 (64 dims).
inline constexpr int kScoreBlocksPerSum = 2;

// c = a b over k blocks [k_begin, k_end) of the fragments, one wgmma batch, c overwritten.
template <class TiledMma, class FragA, class FragB, class FragC>
__device__ __forceinline__ void gemm_k_blocks(TiledMma& mma, const FragA& a, const FragB& b,
                                              FragC& c, int k_begin, int k_end) {
  using namespace cute;
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = k_begin; k < k_end; ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(c);
}

// raw [64 keys][576] e4m3 (SW64) -> v16 [64 keys][512] f16 (SW128), keys >= valid_keys zero (their
// cache slots may hold anything; P = 0 would still turn a NaN into NaN). Run by the 128 threads of
// the copy warpgroup (`vt` < 128): thread vt converts raw chunks [16 (vt / 64), + 16) of key vt %
// 64, so a warp's loads and stores touch one chunk of 32 consecutive keys (conflict-free in both
// swizzles).
template <class Cfg>
__device__ __forceinline__ void convert_values_e4m3(const uint8_t* raw, uint8_t* v16,
                                                    int valid_keys, int vt) {
  constexpr int kValueChunks = kDimV / 16;  // raw 16-byte chunks of a key's values
  constexpr int kChunksPerThread = kValueChunks / 2;
  const int key = vt % kBlockN, first = (vt / kBlockN) * kChunksPerThread;
  const bool valid = key < valid_keys;
#pragma unroll
  for (int j = 0; j < kChunksPerThread; ++j) {
    const int c = first + j;
    uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
    if (valid) {
      const uint4 in = *reinterpret_cast<const uint4*>(raw + Cfg::operand_offset(key, c));
      auto pair = [](uint32_t word, int half) {
        return e4m3x2_to_f16x2(static_cast<uint16_t>(word >> (16 * half)));
      };
      lo = make_uint4(pair(in.x, 0), pair(in.x, 1), pair(in.y, 0), pair(in.y, 1));
      hi = make_uint4(pair(in.z, 0), pair(in.z, 1), pair(in.w, 0), pair(in.w, 1));
    }
    *reinterpret_cast<uint4*>(v16 + Cfg::v16_offset(key, 2 * c)) = lo;
    *reinterpret_cast<uint4*>(v16 + Cfg::v16_offset(key, 2 * c + 1)) = hi;
  }
}

template <class Cfg>
__device__ __forceinline__ void decode_segment_wgmma_e4m3(const DecodeKernelParams& p,
                                                          const CUtensorMap& cache_map,
                                                          const WorkItem& w, uint8_t* smem,
                                                          uint32_t& full_phase) {
  using namespace cute;
  using L = WgmmaLayouts<Cfg>;  // f16: P, V^T and the value MMA
  using T8 = cutlass::float_e4m3_t;
  // q or a raw K tile, (64 rows, 576 e4m3 columns), as sw64_k_offset spells out.
  using Operand8 =
      decltype(tile_to_shape(GMMA::Layout_K_SW64_Atom<T8>{}, Shape<Int<kBlockN>, Int<kDimQK>>{}));
  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<T8, T8, float, Shape<typename L::Rows, typename L::Keys, _32>,
                           GMMA::Major::K, GMMA::Major::K>()));
  const int tid = static_cast<int>(threadIdx.x);
  const bool scorer = tid / kWarpgroupThreads == kScoreWarpgroup;
  const bool quad_leader = (tid & 3) == 0;  // the 4 lanes of a quad hold the same two rows
  bool bad = w.bad_seq_len;

  float* alpha_of = reinterpret_cast<float*>(smem + Cfg::kAlphaOffset);  // [kPStages][64]
  float* row_sum = reinterpret_cast<float*>(smem + Cfg::kRowSumOffset);  // [64]
  float* row_max = reinterpret_cast<float*>(smem + Cfg::kRowMaxOffset);  // [64]
  uint8_t* const v16 = smem + Cfg::kV16Offset;
  auto stage = [&](int tile) {
    return smem + Cfg::kStageOffset + (tile % Cfg::kStages) * Cfg::kRawTileBytes;
  };
  auto p_tile = [&](int tile) {
    return smem + Cfg::kPOffset + (tile % Cfg::kPStages) * Cfg::kPBytes;
  };
  auto smem_h = [](uint8_t* bytes) {
    return make_smem_ptr(reinterpret_cast<typename L::T*>(bytes));
  };
  auto smem_8 = [](uint8_t* bytes) { return make_smem_ptr(reinterpret_cast<T8*>(bytes)); };
  const uint32_t full_barrier = smem_addr(smem + Cfg::kFullBarrierOffset);  // + 8 * stage
  // Both warpgroups wait for every raw tile (scores and conversion); each thread keeps the parity.
  auto wait_tile = [&](int tile) {
    const int st = tile % Cfg::kStages;
    mbarrier_wait(full_barrier + 8 * st, (full_phase >> st) & 1u);
    full_phase ^= 1u << st;
  };

  typename L::MmaO mma_o;
  const auto thr_o = mma_o.get_thread_slice(tid);
  auto acc_o = partition_fragment_C(mma_o, Shape<typename L::Rows, Int<kDimV>>{});  // 128 f32
  clear(acc_o);
  auto o = rows_by_columns(acc_o);
  const auto o_coord = rows_by_columns(
      thr_o.partition_C(make_identity_tensor(Shape<typename L::Rows, Int<kDimV>>{})));
  const int local_row[2] = {get<0>(o_coord(0, 0)), get<0>(o_coord(1, 0))};

  auto accumulate_values = [&](int t, const float(&alpha)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      CUTE_UNROLL
      for (int j = 0; j < size<1>(o); ++j) o(h, j) *= alpha[h];
    }
    const auto p_desc = thr_o.partition_fragment_A(make_tensor(smem_h(p_tile(t)), typename L::P{}));
    const auto v_desc = thr_o.partition_fragment_B(make_tensor(smem_h(v16), typename L::Vt{}));
    warpgroup_gemm(mma_o, p_desc, v_desc, acc_o, true);
  };

  using Tma = TileTma<Cfg::kStages, Cfg::kRawTileBytes, kSwizzle64Bytes>;
  const bool producer = tid == kCopyWarpgroup * kWarpgroupThreads;
  int next_pages[kMaxPagesPerTile];  // producer: page ids of the next tile to copy
  const int box_slots = Tma::box_slots(p), boxes = kBlockN / box_slots;
  auto issue_tile = [&](int tile) {
    Tma::issue(p, w, cache_map, smem + Cfg::kStageOffset, full_barrier, tile, box_slots, boxes,
               next_pages, bad);
  };
  if (w.num_tiles > 0) {
    if (producer) {
      Tma::lookup(p, w, 0, box_slots, boxes, next_pages);
      for (int t = 0; t < Cfg::kStages && t < w.num_tiles; ++t) issue_tile(t);
    }
    load_q_tile<Cfg>(p, w, smem + Cfg::kQOffset);  // e4m3 bytes as stored (kQRaw)
    fence_shared_for_wgmma();
  }
  __syncthreads();  // q is complete

  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.0f, 0.0f};
  if (scorer) {
    MmaS mma_s;
    const auto thr_s = mma_s.get_thread_slice(tid);
    const auto q_desc =  // (MMA, 1, 18 k blocks)
        thr_s.partition_fragment_A(make_tensor(smem_8(smem + Cfg::kQOffset), Operand8{}));
    auto acc_s = partition_fragment_C(mma_s, Shape<typename L::Rows, typename L::Keys>{});  // 32
    auto acc_part = partition_fragment_C(mma_s, Shape<typename L::Rows, typename L::Keys>{});
    auto s = rows_by_columns(acc_s);
    const auto s_coord = rows_by_columns(
        thr_s.partition_C(make_identity_tensor(Shape<typename L::Rows, typename L::Keys>{})));
    int row_end[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = w.row0 + local_row[h];
      row_end[h] = row < p.rows
                       ? min(w.key_end,
                             visible_end(w.seq_len, p.s_q, fast_divmod(row, p.heads_div).quotient))
                       : w.key_end;
    }
    for (int t = 0; t < w.num_tiles; ++t) {
      wait_tile(t);
      const int tile_start = w.key_begin + t * kBlockN;
      const auto k_desc = thr_s.partition_fragment_B(make_tensor(smem_8(stage(t)), Operand8{}));
      constexpr int kBlocks = decltype(size<2>(q_desc))::value;  // 18 k blocks of 32
      gemm_k_blocks(mma_s, q_desc, k_desc, acc_s, 0, kScoreBlocksPerSum);
      CUTE_UNROLL
      for (int k = kScoreBlocksPerSum; k < kBlocks; k += kScoreBlocksPerSum) {
        const int k_end = k + kScoreBlocksPerSum < kBlocks ? k + kScoreBlocksPerSum : kBlocks;
        gemm_k_blocks(mma_s, q_desc, k_desc, acc_part, k, k_end);
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) acc_s(i) += acc_part(i);
      }

      const auto sP = make_tensor(smem_h(p_tile(t)), typename L::P{});
      float* alpha_t = alpha_of + (t % Cfg::kPStages) * Cfg::kBlockM;
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
        CUTE_UNROLL
        for (int j = 0; j < size<1>(s); ++j) {
          const int pos = tile_start + get<1>(s_coord(h, j));
          const float v = pos < row_end[h] ? s(h, j) * p.score_scale_log2 : -INFINITY;
          s(h, j) = v;
          tile_max = fmaxf(tile_max, v);
        }
        tile_max = quad_max(tile_max);
        float m_use;
        alpha[h] = fold_tile_max<1, 1>(&tile_max, 0, m_run[h], l_run[h], m_use);
        if (quad_leader) alpha_t[local_row[h]] = alpha[h];
        CUTE_UNROLL
        for (int j = 0; j < size<1>(s); j += 2) {
          const float p0 = fast_exp2(s(h, j) - m_use), p1 = fast_exp2(s(h, j + 1) - m_use);
          l_run[h] += p0 + p1;
          *reinterpret_cast<uint32_t*>(&sP(local_row[h], get<1>(s_coord(h, j)))) =
              Cfg::Element::pack(p0, p1);
        }
      }
      fence_shared_for_wgmma();  // this thread's P stores become visible to wgmma
      named_barrier_arrive(kPReady + t % Cfg::kPStages, kThreads);
      named_barrier_sync(kVReady, kThreads);  // V_t is converted
      accumulate_values(t, alpha);
      named_barrier_arrive(kVDone, kThreads);  // this warpgroup no longer reads V_t
    }
  } else {
    const int vt = tid - kWarpgroupThreads;
    for (int t = 0; t < w.num_tiles; ++t) {
      wait_tile(t);
      if (t > 0) named_barrier_sync(kVDone, kThreads);  // V_{t-1} is no longer read
      convert_values_e4m3<Cfg>(stage(t), v16, w.cta_end - (w.key_begin + t * kBlockN), vt);
      fence_shared_for_wgmma();  // the converted V becomes visible to wgmma
      named_barrier_arrive(kVReady, kThreads);
      named_barrier_sync(kPReady + t % Cfg::kPStages, kThreads);  // P_t, alpha_t; S_t is done
      if (producer && t + Cfg::kStages < w.num_tiles) issue_tile(t + Cfg::kStages);
      const float* alpha_t = alpha_of + (t % Cfg::kPStages) * Cfg::kBlockM;
      accumulate_values(t, {alpha_t[local_row[0]], alpha_t[local_row[1]]});
    }
    if (w.num_tiles > 0) named_barrier_sync(kVDone, kThreads);  // pairs the last V_DONE arrival
  }
  finish_rows_wgmma(p, w, bad, scorer, l_run, m_run, local_row, row_sum, row_max, o, o_coord);
}

}  // namespace mlakit::cuda::decode_sm90
