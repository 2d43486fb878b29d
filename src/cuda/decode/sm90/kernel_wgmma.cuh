// The sm90 absorbed-MQA decode kernel with warpgroup MMAs (docs/kernels/decode_sm90.md, "wgmma
// path"): 64 query rows per CTA over a native 16-bit cache. Work split, copy, q staging, masking,
// online softmax and outputs are kernel.cuh's (kernel_common.cuh); the two products run on wgmma,
// which reads both operands from shared memory once per warpgroup instead of once per warp.
//
// CTA = 2 warpgroups (256 threads) computing its part's segments of the work plan one after
// another (kernel.cuh); per 64-key tile t of a segment:
//   copy    cp.async of tile t + 1 into the other stage, straight into the SW128 operand layout;
//   scores  S = q K^T: warpgroup g computes keys [32 g, 32 g + 32) of all 64 rows with 36 wgmma
//           m64n32k16 (q and K K-major in shared memory), f32 accumulators in registers;
//   softmax scale, mask, tile maxima of the two warpgroups exchanged through shared memory; both
//           derive the same new max; P (16-bit) into shared memory, K-major SW128;
//   values  O = O * alpha + P V: warpgroup g owns V columns [256 g, 256 g + 256), 4 wgmma
//           m64n256k16 with A = P and B = the tile's first 512 columns seen MN-major.
// Barriers per tile: (1) tile t landed, tile t - 1 and P no longer read; (2) maxima exchanged;
// (3) P complete. Every wgmma batch is waited for before the next barrier.
#pragma once

#include <cmath>
#include <cstdint>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <type_traits>

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
  // Both MMAs tile N over the two warpgroups: threads [128 g, 128 g + 128) own N block g.
  using Warpgroups = cute::Layout<cute::Shape<cute::_1, cute::Int<Cfg::kWarpgroups>, cute::_1>>;
  using MmaS = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<T, T, float,
                                 cute::Shape<Rows, cute::Int<Cfg::kKeysPerWarpgroup>, cute::_16>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::K>(),
      Warpgroups{}));
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

// One segment of the CTA's work (make_work_item), as in kernel.cuh's decode_segment. `smem`: the
// dynamic shared memory rounded up to kBaseAlignment.
template <class Cfg>
__device__ __forceinline__ void decode_segment_wgmma(const DecodeKernelParams& p, const WorkItem& w,
                                                     uint8_t* smem) {
  using namespace cute;
  using L = WgmmaLayouts<Cfg>;
  using T = typename L::T;
  const int tid = static_cast<int>(threadIdx.x);
  const int warpgroup = tid / 128;
  const bool quad_leader = (tid & 3) == 0;  // the 4 lanes of a quad hold the same two rows
  bool bad = w.bad_seq_len;

  float* row_max_part = reinterpret_cast<float*>(smem + Cfg::kRowMaxOffset);  // [2][64]
  float* row_sum_part = reinterpret_cast<float*>(smem + Cfg::kRowSumOffset);  // [2][64]
  auto stage = [&](int tile) {
    return smem + Cfg::kStageOffset + (tile % Cfg::kStages) * kTileBytes;
  };
  auto smem_t = [](uint8_t* bytes) { return make_smem_ptr(reinterpret_cast<T*>(bytes)); };

  typename L::MmaS mma_s;
  typename L::MmaO mma_o;
  const auto thr_s = mma_s.get_thread_slice(tid);
  const auto thr_o = mma_o.get_thread_slice(tid);
  const auto sP = make_tensor(smem_t(smem + Cfg::kPOffset), typename L::P{});  // (64, 64)
  const auto q_desc =  // (MMA, 1, 36 k blocks)
      thr_s.partition_fragment_A(make_tensor(smem_t(smem + Cfg::kQOffset), typename L::Operand{}));
  const auto p_desc = thr_o.partition_fragment_A(sP);  // (MMA, 1, 4 k blocks)
  auto acc_s = partition_fragment_C(mma_s, Shape<typename L::Rows, typename L::Keys>{});  // 16 f32
  auto acc_o = partition_fragment_C(mma_o, Shape<typename L::Rows, Int<kDimV>>{});        // 128 f32
  clear(acc_o);
  // Registers as (2 rows, columns), with the (row, column) each holds.
  auto s = rows_by_columns(acc_s);
  auto o = rows_by_columns(acc_o);
  const auto s_coord = rows_by_columns(
      thr_s.partition_C(make_identity_tensor(Shape<typename L::Rows, typename L::Keys>{})));
  const auto o_coord = rows_by_columns(
      thr_o.partition_C(make_identity_tensor(Shape<typename L::Rows, Int<kDimV>>{})));
  static_assert(decltype(size<0>(s))::value == 2 && decltype(size<0>(o))::value == 2,
                "each thread holds two rows of S and O");

  // The two rows this thread holds (the same in S and O: every m64nNk16 accumulator gives lane l
  // of warp v of a warpgroup rows 16 v + l / 4 and that + 8), and the end of the keys each sees.
  int local_row[2], row_end[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    local_row[h] = get<0>(s_coord(h, 0));
    const int row = w.row0 + local_row[h];
    row_end[h] =
        row < p.rows ? min(w.key_end, visible_end(w.seq_len, p.s_q, row / p.num_heads)) : w.key_end;
  }
  float m_run[2] = {-INFINITY, -INFINITY};  // running max of the row, log2 units
  float l_run[2] = {0.0f, 0.0f};            // this thread's share of the running sum

  int next_pages[Cfg::kLoadPasses] = {};  // page ids of the next tile to copy
  if (w.num_tiles > 0) {
    start_copies<Cfg>(p, w, stage, next_pages, bad);
    load_q_tile<Cfg>(p, w, smem + Cfg::kQOffset);  // read after the loop's first barrier
  }

  for (int t = 0; t < w.num_tiles; ++t) {
    cp_async_wait<Cfg::kTilesAhead - 1>();  // this thread's copies of tile t have landed
    fence_shared_for_wgmma();               // its copies and q stores become visible to wgmma
    __syncthreads();  // (1) everyone's have; tile t - 1 and P are no longer read by anyone
    continue_copies<Cfg>(p, w, t, stage, next_pages, bad);  // into stage (t + 1) % 2, now free

    // scores
    const auto k_desc =
        thr_s.partition_fragment_B(make_tensor(smem_t(stage(t)), typename L::Operand{}));
    warpgroup_gemm(mma_s, q_desc, k_desc, acc_s, false);

    // scale, mask, tile max of this warpgroup's keys per row
    const int tile_start = w.key_begin + t * kBlockN;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      CUTE_UNROLL
      for (int j = 0; j < size<1>(s); ++j) {
        const int pos = tile_start + get<1>(s_coord(h, j));
        const float v = pos < row_end[h] ? s(h, j) * p.score_scale_log2 : -INFINITY;
        s(h, j) = v;
        tile_max[h] = fmaxf(tile_max[h], v);
      }
      tile_max[h] = quad_max(tile_max[h]);
      if (quad_leader) row_max_part[warpgroup * Cfg::kBlockM + local_row[h]] = tile_max[h];
    }
    __syncthreads();  // (2) both warpgroups' maxima are visible

    // online softmax: new max, rescale of O, probabilities into P
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m_use;
      const float alpha = fold_tile_max<Cfg::kWarpgroups, Cfg::kBlockM>(row_max_part, local_row[h],
                                                                        m_run[h], l_run[h], m_use);
      CUTE_UNROLL
      for (int j = 0; j < size<1>(o); ++j) o(h, j) *= alpha;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(s); j += 2) {
        const float p0 = fast_exp2(s(h, j) - m_use), p1 = fast_exp2(s(h, j + 1) - m_use);
        l_run[h] += p0 + p1;
        *reinterpret_cast<uint32_t*>(&sP(local_row[h], get<1>(s_coord(h, j)))) =
            Cfg::Element::pack(p0, p1);
      }
    }
    fence_shared_for_wgmma();  // this thread's P stores become visible to wgmma
    __syncthreads();           // (3) P is complete

    // values
    const auto v_desc = thr_o.partition_fragment_B(make_tensor(smem_t(stage(t)), typename L::Vt{}));
    warpgroup_gemm(mma_o, p_desc, v_desc, acc_o, true);
  }
  cp_async_wait<0>();  // no copy may outlive the CTA (only empty groups remain, but be exact)

  // ---- epilogue: row sums across the quad and the two warpgroups, then rows and LSEs.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = quad_sum(l_run[h]);
    if (quad_leader) row_sum_part[warpgroup * Cfg::kBlockM + local_row[h]] = l;
  }
  bad = cta_saw_bad_index(p, bad);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = w.row0 + local_row[h];
    if (row >= p.rows) continue;
    float l = 0.0f;
#pragma unroll
    for (int g = 0; g < Cfg::kWarpgroups; ++g) l += row_sum_part[g * Cfg::kBlockM + local_row[h]];
    const RowSink sink = finish_row(p, w, row, l, m_run[h], bad, warpgroup == 0 && quad_leader);
    if (sink.base == nullptr) continue;
    CUTE_UNROLL
    for (int j = 0; j < size<1>(o); j += 2) {
      store_pair(sink.base, sink.offset + get<1>(o_coord(h, j)), sink.dtype, o(h, j) * sink.inv,
                 o(h, j + 1) * sink.inv);
    }
  }
}

template <class Cfg>
__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_sm90_wgmma_kernel(const __grid_constant__ DecodeKernelParams p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* const smem =
      smem_raw + (-static_cast<int>(smem_addr(smem_raw)) & (Cfg::kBaseAlignment - 1));
  const CtaWork work = cta_work<Cfg>(p);
  for (int segment = work.segment_begin; segment < work.segment_end; ++segment) {
    if (segment > work.segment_begin) __syncthreads();  // the last one is done with shared memory
    decode_segment_wgmma<Cfg>(p, make_work_item<Cfg>(p, work.row0, segment), smem);
  }
}

}  // namespace mlakit::cuda::decode_sm90
