// The sm90 absorbed-MQA decode kernel with mma.sync (docs/kernels/decode_sm90.md): every
// configuration except 64 rows over a cache TMA can read (any format), which kernel_wgmma.cuh
// serves.
//
// One CTA = (part, tile of kBlockM query rows). It computes its part's segments of the work plan
// (work_plan.hpp, written by the plan kernel) one after another; a segment is a range of 64-key
// tiles of one request. Per 64-key tile:
//   copy    cp.async of the 64 cache entries (page ids from the block table) into a ring stage,
//           kTilesAhead tiles ahead, or for raw fp8_ds_mla tiles one bulk copy per run of a page's
//           slots onto the stage's mbarrier; keys past the chunk are zero-filled, never read;
//   convert (fp8 formats) raw entries -> a 16-bit tile in shared memory; not for an fp8 q over
//           fp8_e4m3, nor a 16-bit q with 16 rows over either fp8 format, whose raw tiles each
//           warp converts in registers (kernel_e4m3.cuh, kernel_ds_mla.cuh);
//   scores  S = q K^T with mma.sync m16n8k16 (f32 accumulators), every row reading the same tile;
//   softmax online, per row, in log2 units; the tile max is exchanged between the warps that share
//           a row through shared memory; P (16-bit) goes to shared memory;
//   values  O = O * alpha + P V, V = the tile's first 512 columns (read once: warp w owns 64
//           columns of every row).
// The epilogue writes normalized O and the LSE to out / lse (the request's only segment) or to the
// segment's partial slot. A block id outside [0, num_blocks) or a seq_len outside [0, max_seq_len]
// turns the segment's rows into NaN (nothing is read out of bounds; the host cannot check
// device-resident indices).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/grid_dependency.cuh"
#include "cuda/decode/sm90/kernel_common.cuh"
#include "cuda/decode/sm90/kernel_ds_mla.cuh"
#include "cuda/decode/sm90/kernel_e4m3.cuh"
#include "cuda/decode/sm90/params.cuh"
#include "cuda/decode/sm90/ptx.cuh"
#include "cuda/decode/sm90/traits.cuh"

namespace mlakit::cuda::decode_sm90 {

// ---- fp8 -> 16-bit conversion of a landed raw tile ----------------------------------------------

// raw [64][kRawEntry] -> conv [64][1152] swizzled. Thread t converts key t / 4: raw 16-byte chunks
// t % 4 + 4 j (16 e4m3 values -> converted chunks 2 c and 2 c + 1). A fixed key per thread keeps
// the addresses at a base plus immediates (a unit-per-thread mapping spent more integer
// instructions on u / 72, u % 72 and the swizzle than on the conversion: docs/perf-notes.md), and
// the 4 threads of a key read 64 contiguous bytes (conflict-free 128-bit loads for fp8_e4m3's
// 576-byte rows).
template <class Cfg>
__device__ __forceinline__ void convert_tile(const uint8_t* raw, uint8_t* conv) {
  using Elem = typename Cfg::Element;
  constexpr int kThreadsPerKey = kThreads / kBlockN;
  static_assert(kThreadsPerKey == 4, "the chunk mapping below is written for 4 threads per key");
  const int key = static_cast<int>(threadIdx.x) / kThreadsPerKey;
  const int lane = static_cast<int>(threadIdx.x) % kThreadsPerKey;
  const uint8_t* entry = raw + key * Cfg::kRawEntry;
  // Converted chunk 8 j + i (i < 8) of this key sits at 128 j + ((i ^ (key % 8)) << 4): the low
  // three bits of a chunk index are the swizzled ones (swizzled<kRowBytes>).
  uint8_t* row = conv + key * kRowBytes;
  auto chunk_at = [&](int j, int i) { return row + 128 * j + ((i ^ (key & 7)) << 4); };
  if constexpr (Cfg::kFormat == CacheFormat::kFp8E4m3) {
    // 576 e4m3 = 36 raw chunks = 9 per thread; k_scale applies to the scores and the output.
#pragma unroll
    for (int j = 0; j < 9; ++j) {
      const uint4 in = *reinterpret_cast<const uint4*>(entry + 16 * (lane + 4 * j));
      *reinterpret_cast<uint4*>(chunk_at(j, 2 * lane)) = convert_e4m3x8<Elem, true>(in.x, in.y, 1);
      *reinterpret_cast<uint4*>(chunk_at(j, 2 * lane + 1)) =
          convert_e4m3x8<Elem, true>(in.z, in.w, 1);
    }
  } else {
    // fp8_ds_mla: bytes [0, 512) e4m3 NoPE (32 raw chunks, 8 per thread), [512, 528) four f32
    // scales (one per 128 values: raw chunks 8 s .. 8 s + 7, i.e. j / 2), [528, 656) the 64 rope
    // values already in the MMA element type (8 chunks, 2 per thread, copied).
    constexpr int kScaleOffset = 512, kRopeOffset = 528;
    const float4 scales = *reinterpret_cast<const float4*>(entry + kScaleOffset);
    const float scale[4] = {scales.x, scales.y, scales.z, scales.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint4 in = *reinterpret_cast<const uint4*>(entry + 16 * (lane + 4 * j));
      *reinterpret_cast<uint4*>(chunk_at(j, 2 * lane)) =
          convert_e4m3x8<Elem, false>(in.x, in.y, scale[j / 2]);
      *reinterpret_cast<uint4*>(chunk_at(j, 2 * lane + 1)) =
          convert_e4m3x8<Elem, false>(in.z, in.w, scale[j / 2]);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {  // rope chunk r = lane + 4 j -> converted chunk 64 + r
      const int r = lane + 4 * j;
      *reinterpret_cast<uint4*>(chunk_at(8, r)) =
          *reinterpret_cast<const uint4*>(entry + kRopeOffset + 16 * r);
    }
  }
}

// ---- scores ------------------------------------------------------------------------------------

// acc[chain][n8 tile][4] += q rows of this warp's row group x keys of its key group.
template <class Cfg, class QFrags>
__device__ __forceinline__ void compute_scores(
    const QFrags& q_frags, uint32_t q_base, uint32_t k_base, int row_group, int key_group,
    float (&acc)[Cfg::kScoreChains][Cfg::kScoreTiles][4]) {
  using Elem = typename Cfg::Element;
  const int lane = threadIdx.x & 31;
  if constexpr (Cfg::kQInRegisters) {
    // One n8 tile: ldmatrix.x4 gives the B fragments of two k16 steps (matrices = dims +0, +8,
    // +16, +24 of the same 8 keys).
    const int key = key_group * Cfg::kKeysPerWarp + (lane & 7);
#pragma unroll
    for (int kp = 0; kp < kDimQK / 32; ++kp) {
      uint32_t b[4];
      ldmatrix_x4(b, k_base + swizzled<kRowBytes>(key, 4 * kp + (lane >> 3)));
      Elem::mma(acc[0][0], q_frags[2 * kp], b[0], b[1]);
      Elem::mma(acc[1][0], q_frags[2 * kp + 1], b[2], b[3]);
    }
  } else {
    // A from shared memory; ldmatrix.x4 gives the B fragments of two n8 tiles of one k16 step
    // (matrices = keys +0 dims +0, keys +0 dims +8, keys +8 dims +0, keys +8 dims +8).
    const int q_row = row_group * 16 + (lane & 15);
    const int key_in_pair = ((lane >> 4) << 3) + (lane & 7);
#pragma unroll 4
    for (int ks = 0; ks < kDimQK / 16; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, q_base + swizzled<kRowBytes>(q_row, 2 * ks + (lane >> 4)));
#pragma unroll
      for (int np = 0; np < Cfg::kScoreTiles / 2; ++np) {
        const int key = key_group * Cfg::kKeysPerWarp + np * 16 + key_in_pair;
        uint32_t b[4];
        ldmatrix_x4(b, k_base + swizzled<kRowBytes>(key, 2 * ks + ((lane >> 3) & 1)));
        Elem::mma(acc[0][2 * np], a, b[0], b[1]);
        Elem::mma(acc[0][2 * np + 1], a, b[2], b[3]);
      }
    }
  }
}

// ---- values ------------------------------------------------------------------------------------

// o[m16 tile][n8 tile][4] += P (kBlockM x 64, shared) x V columns [64 warp, 64 warp + 64).
template <class Cfg>
__device__ __forceinline__ void accumulate_values(uint32_t p_base, uint32_t v_base, int warp,
                                                  float (&o)[Cfg::kRowTiles][Cfg::kColTiles][4]) {
  using Elem = typename Cfg::Element;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int ks = 0; ks < kBlockN / 16; ++ks) {
    uint32_t a[Cfg::kRowTiles][4];
    load_p_fragments<Cfg>(p_base, ks, a);
    // Transposed loads: matrices = keys +0 / +8 of columns +0, then keys +0 / +8 of columns +8.
    const int key = ks * 16 + (((lane >> 3) & 1) << 3) + (lane & 7);
#pragma unroll
    for (int np = 0; np < Cfg::kColTiles / 2; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_base + swizzled<kRowBytes>(key, warp * (Cfg::kColsPerWarp / 8) +
                                                                 2 * np + (lane >> 4)));
#pragma unroll
      for (int mt = 0; mt < Cfg::kRowTiles; ++mt) {
        Elem::mma(o[mt][2 * np], a[mt], b[0], b[1]);
        Elem::mma(o[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// ---- the kernel --------------------------------------------------------------------------------

// One segment of the CTA's work (make_work_item), from its first copy to its rows in out / lse or
// in its partial slot. Starts with O, the running max and the row sums cleared. `ring_phases`
// carries the ring stages' mbarrier parities from segment to segment (bulk copies).
template <class Cfg>
__device__ __forceinline__ void decode_segment(const DecodeKernelParams& p, const WorkItem& w,
                                               uint8_t* smem, uint32_t& ring_phases) {
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, tq = lane & 3;  // MMA fragment row (0..7) and column pair (0..3)
  const int row_group = warp / Cfg::kKeyGroups, key_group = warp % Cfg::kKeyGroups;
  bool bad = w.bad_seq_len;

  float* row_max_part = reinterpret_cast<float*>(smem + Cfg::kRowMaxOffset);  // [kKeyGroups][M]
  float* row_sum_part = reinterpret_cast<float*>(smem + Cfg::kRowSumOffset);  // [kKeyGroups][M]
  float* alpha_s = reinterpret_cast<float*>(smem + Cfg::kAlphaOffset);        // [M]
  float* max_final = reinterpret_cast<float*>(smem + Cfg::kMaxFinalOffset);   // [M]
  auto raw_stage = [&](int tile) { return smem + Cfg::raw_stage_offset(tile); };

  // The two rows (g, g + 8 of the row group) this thread's score fragments hold, and the end of
  // the keys each sees (bottom-right causal within the split).
  int score_row[2], row_end[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    score_row[h] = row_group * 16 + g + 8 * h;
    const int row = w.row0 + score_row[h];
    row_end[h] =
        row < p.rows
            ? min(w.key_end, visible_end(w.seq_len, p.s_q, fast_divmod(row, p.heads_div).quotient))
            : w.key_end;
  }

  float o[Cfg::kRowTiles][Cfg::kColTiles][4];
#pragma unroll
  for (int mt = 0; mt < Cfg::kRowTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < Cfg::kColTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max of the row, log2 units
  float l_run[2] = {0.0f, 0.0f};            // this thread's share of the running sum

  uint32_t q_frags[Cfg::kQInRegisters ? kDimQK / 16 : 1][4];
  // A 16-bit q over raw tiles: the rows' q factors undone on the scores; raw fp8_ds_mla tiles: O's
  // unit (the last tile's value-scale bound m; 0 before the first tile).
  float q_row_unscale[2] = {1.0f, 1.0f};
  float o_unit = 0.0f;
  int next_pages[Cfg::kLoadPasses] = {};  // page ids of the next tile to copy
  if (w.num_tiles > 0) {
    if constexpr (Cfg::kQInRegisters) {
      // q's loads go out before the tiles' copies, so its bytes do not queue behind the copies of
      // every CTA's first tiles (16 rows: the whole tile is one batch).
      static_assert(QTile<Cfg>::kBatch == QTile<Cfg>::kPerThread, "one batch holds q");
      // raw tiles: the launcher checked that q is fetchable
      const bool fetched = Cfg::kRawE4m3 || Cfg::kRawDsMla || q_fetchable(p);
      uint4 q_raw[QTile<Cfg>::kBatch];
      if (fetched) fetch_q_batch<Cfg>(p, w, 0, q_raw);
      start_copies<Cfg>(p, w, smem, next_pages, bad);
      // Stage q where no copy is in flight (the conversion buffer, or the ring stage the first
      // in-loop copy fills), then move it into A fragments.
      uint8_t* staging = Cfg::kConvert ? smem + Cfg::kConvOffset : raw_stage(Cfg::kStages - 1);
      if (fetched) {
        store_q_batch<Cfg>(p, 0, q_raw, staging);
      } else if constexpr (!Cfg::kRawE4m3 && !Cfg::kRawDsMla) {
        load_q_tile_slow<Cfg>(p, w, staging);
      }
      __syncthreads();
      if constexpr (Cfg::kRawQ16) {  // the raw dims to f16 x the row's factor, in raw order
        prepare_raw_q<Cfg>(p.q_dtype, staging, alpha_s);
#pragma unroll
        for (int h = 0; h < 2; ++h) q_row_unscale[h] = 1.0f / alpha_s[score_row[h]];
      }
#pragma unroll
      for (int ks = 0; ks < kDimQK / 16; ++ks) {
        ldmatrix_x4(q_frags[ks],
                    smem_addr(staging) + Cfg::operand_offset(lane & 15, 2 * ks + (lane >> 4)));
      }
      // The staging stage's next tile arrives by bulk copy, after q's stores to the same bytes.
      if constexpr (Cfg::kBulkCopies) fence_stores_before_bulk_copies();
    } else {
      start_copies<Cfg>(p, w, smem, next_pages, bad);
      load_q_tile<Cfg>(p, w, smem + Cfg::kQOffset);  // read after the loop's first barrier
    }
  }

  const float score_scale_log2 = score_factor<Cfg>(p, w);
  for (int t = 0; t < w.num_tiles; ++t) {
    wait_tile_copies<Cfg>(smem, t, ring_phases);  // tile t landed (cp.async: this thread's part)
    __syncthreads();  // everyone's have; tile t - 1 is no longer read by anyone
    uint8_t* tile_data;
    if constexpr (Cfg::kConvert) {
      tile_data = smem + Cfg::kConvOffset;
      convert_tile<Cfg>(raw_stage(t), tile_data);
      __syncthreads();  // the converted tile is complete; raw stage t is free
    } else {
      tile_data = raw_stage(t);
    }
    // Native: stage (t - 1) % kStages is free since the barrier above; converted: stage t % kStages
    // since the conversion. Both equal (t + kTilesAhead) % kStages.
    continue_copies<Cfg>(p, w, t, smem, next_pages, bad);

    // scores
    float acc[Cfg::kScoreChains][Cfg::kScoreTiles][4];
#pragma unroll
    for (int c = 0; c < Cfg::kScoreChains; ++c)
#pragma unroll
      for (int nt = 0; nt < Cfg::kScoreTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[c][nt][e] = 0.0f;
    float4 key_scales[2];  // raw fp8_ds_mla: the scales of this thread's two score keys
    if constexpr (Cfg::kRawDsMla) {
      compute_scores_raw_ds_mla<Cfg>(q_frags, smem_addr(tile_data), key_group, acc);
      load_score_key_scales<Cfg>(tile_data, key_group, tq, key_scales);
    } else if constexpr (Cfg::kRawE4m3) {
      compute_scores_raw_e4m3<Cfg>(q_frags, smem_addr(smem + Cfg::kQOffset), smem_addr(tile_data),
                                   row_group, key_group, acc);
    } else {
      compute_scores<Cfg>(q_frags, smem_addr(smem + Cfg::kQOffset), smem_addr(tile_data), row_group,
                          key_group, acc);
    }

    // scale, mask, tile max of this warp's keys per row
    const int tile_start = w.key_begin + t * kBlockN;
    float s[Cfg::kScoreTiles][4];
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < Cfg::kScoreTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = acc[0][nt][e];
        if constexpr (Cfg::kRawDsMla) {
          v = ds_mla_score<Cfg>(acc, key_scales, q_row_unscale[e >> 1], e);
        } else {
#pragma unroll
          for (int c = 1; c < Cfg::kScoreChains; ++c) v += acc[c][nt][e];
          if constexpr (Cfg::kRawQ16) v *= q_row_unscale[e >> 1];
        }
        const int pos = tile_start + key_group * Cfg::kKeysPerWarp + nt * 8 + 2 * tq + (e & 1);
        v = pos < row_end[e >> 1] ? v * score_scale_log2 : -INFINITY;
        s[nt][e] = v;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], v);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = quad_max(tile_max[h]);
      if (tq == 0) row_max_part[key_group * Cfg::kBlockM + score_row[h]] = tile_max[h];
    }
    __syncthreads();  // the key groups' maxima are visible

    // online softmax: new max, rescale factor, probabilities into P
    uint8_t* p_tile = smem + Cfg::kPOffset;
    float m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float alpha = fold_tile_max<Cfg::kKeyGroups, Cfg::kBlockM>(
          row_max_part, score_row[h], m_run[h], l_run[h], m_use[h]);
      if (key_group == 0 && tq == 0) alpha_s[score_row[h]] = alpha;
    }
#pragma unroll
    for (int nt = 0; nt < Cfg::kScoreTiles; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float p0 = fast_exp2(s[nt][2 * h] - m_use[h]);
        const float p1 = fast_exp2(s[nt][2 * h + 1] - m_use[h]);
        l_run[h] += p0 + p1;
        const int key = key_group * Cfg::kKeysPerWarp + nt * 8 + 2 * tq;
        const int row = score_row[h];
        *reinterpret_cast<uint32_t*>(p_tile + swizzled<kPRowBytes>(row, key >> 3) + (key & 7) * 2) =
            Cfg::Element::pack(p0, p1);
      }
    }
    __syncthreads();  // P and alpha are visible

    // values
    uint32_t value_pairs[Cfg::kRawDsMla ? kBlockN / 16 : 1][2];
    float unit_ratio = 1.0f;  // raw fp8_ds_mla: O from the previous tile's unit to this one's
    if constexpr (Cfg::kRawDsMla) {
      const float m = ds_mla_value_scales<Cfg>(tile_data, warp, value_pairs);
      if (o_unit > 0.0f) unit_ratio = o_unit / m;
      o_unit = m;
    }
#pragma unroll
    for (int mt = 0; mt < Cfg::kRowTiles; ++mt) {
      const float a0 = alpha_s[mt * 16 + g] * unit_ratio,
                  a1 = alpha_s[mt * 16 + g + 8] * unit_ratio;
#pragma unroll
      for (int nt = 0; nt < Cfg::kColTiles; ++nt) {
        o[mt][nt][0] *= a0;
        o[mt][nt][1] *= a0;
        o[mt][nt][2] *= a1;
        o[mt][nt][3] *= a1;
      }
    }
    if constexpr (Cfg::kRawDsMla) {
      accumulate_values_raw_ds_mla<Cfg>(smem_addr(p_tile), smem_addr(tile_data), warp, value_pairs,
                                        o);
    } else if constexpr (Cfg::kRawE4m3) {
      accumulate_values_raw_e4m3<Cfg>(smem_addr(p_tile), smem_addr(tile_data), warp, o,
                                      [](int, uint32_t(&)[Cfg::kRowTiles][4]) {});
    } else {
      accumulate_values<Cfg>(smem_addr(p_tile), smem_addr(tile_data), warp, o);
    }
  }
  cp_async_wait<0>();  // no copy may outlive the CTA (only empty groups remain, but be exact)

  // ---- epilogue: row sums across lanes and key groups, then normalized rows and LSEs.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = quad_sum(l_run[h]);
    if (tq == 0) row_sum_part[key_group * Cfg::kBlockM + score_row[h]] = l;
    if (tq == 0 && key_group == 0) max_final[score_row[h]] = m_run[h];
  }
  bad = cta_saw_bad_index(p, bad);
  const RequestScales scales = epilogue_scales(p, w);
  bad = bad || scales.bad;

#pragma unroll
  for (int mt = 0; mt < Cfg::kRowTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int local_row = mt * 16 + g + 8 * h;
      const int row = w.row0 + local_row;
      if (row >= p.rows) continue;
      float l = 0.0f;
#pragma unroll
      for (int k = 0; k < Cfg::kKeyGroups; ++k) l += row_sum_part[k * Cfg::kBlockM + local_row];
      const RowSink sink =
          finish_row(p, w, row, l, max_final[local_row], bad, scales.value, warp == 0 && tq == 0);
      if (sink.base == nullptr) continue;
      with_pair_store(sink.dtype, [&](auto store) {
        const int64_t slab = sink.offset + warp * Cfg::kColsPerWarp;
        if constexpr (Cfg::kRawE4m3 || Cfg::kRawDsMla) {  // n8 tiles 2 c, 2 c + 1: even / odd
          // raw fp8_ds_mla: O is in units of the last tile's value-scale bound
          const float inv = Cfg::kRawDsMla && o_unit > 0.0f ? sink.inv * o_unit : sink.inv;
#pragma unroll
          for (int c = 0; c < Cfg::kColTiles / 2; ++c) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              store(sink.base, slab + value_pair_column(c, i, tq), o[mt][2 * c][2 * h + i] * inv,
                    o[mt][2 * c + 1][2 * h + i] * inv);
            }
          }
        } else {
#pragma unroll
          for (int nt = 0; nt < Cfg::kColTiles; ++nt) {
            store(sink.base, slab + nt * 8 + 2 * tq, o[mt][nt][2 * h] * sink.inv,
                  o[mt][nt][2 * h + 1] * sink.inv);
          }
        }
      });
    }
  }
}

template <class Cfg>
__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_sm90_kernel(const __grid_constant__ DecodeKernelParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  wait_for_prior_grids();
  allow_next_grid_launch();
  if constexpr (Cfg::kBulkCopies) {
    if (threadIdx.x == 0) {
      for (int stage = 0; stage < Cfg::kStages; ++stage) {  // one arrival per warp per tile
        mbarrier_init(smem_addr(smem + Cfg::stage_barrier_offset(stage)), kWarps);
      }
      fence_mbarrier_init();
    }
    __syncthreads();
  }
  uint32_t ring_phases = 0;  // bit s: the parity of stage s's next mbarrier phase
  const CtaWork work = cta_work<Cfg>(p);
  for (int segment = work.segment_begin; segment < work.segment_end; ++segment) {
    if (segment > work.segment_begin) __syncthreads();  // the last one is done with shared memory
    decode_segment<Cfg>(p, make_work_item<Cfg>(p, work.row0, segment), smem, ring_phases);
  }
}

}  // namespace mlakit::cuda::decode_sm90
