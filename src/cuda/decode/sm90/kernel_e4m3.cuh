// The two products of the mma.sync decode kernel (kernel.cuh) for an fp8 q over an fp8_e4m3 cache
// (Config<rows, kFp8E4m3, E4m3Mma>): the tile is read as raw e4m3 bytes in place, nothing is
// converted in shared memory (docs/kernels/decode_sm90.md, "e4m3 scores").
//   scores  S = q K^T on the m16n8k32 e4m3 MMA: ldmatrix hands each lane 4 consecutive bytes of a
//           row, which is exactly the e4m3 A / B fragment (k = 4 t .. 4 t + 3), so q and K go to
//           the tensor cores as stored (half the MMAs of the 16-bit path);
//   values  O += P V in f16: a transposed ldmatrix of 8 keys x 16 e4m3 columns gives lane (g, t)
//           the bytes V[2t][2g], V[2t][2g + 1], V[2t + 1][2g], V[2t + 1][2g + 1]; one byte permute
//           pairs them by column, and one conversion each gives the f16 B fragments (keys 2t, 2t +
//           1) of column 2g and of column 2g + 1. So an n8 MMA tile holds the even (or odd) columns
//           of a 16-column chunk, and a lane's two tiles of a chunk hold its 4 consecutive columns
//           16 c + 4 t .. 16 c + 4 t + 3 (value_pair_column).
// Each warp converts only the 64 columns it owns, each value once per tile.
#pragma once

#include <cstdint>

#include "cuda/decode/sm90/ptx.cuh"
#include "cuda/decode/sm90/traits.cuh"

namespace mlakit::cuda::decode_sm90 {

// acc[chain][n8 tile][4] += q rows of this warp's row group x keys of its key group, over the raw
// e4m3 q (registers for 16 rows, else shared memory at q_base) and K tile (k_base).
template <class Cfg, class QFrags>
__device__ __forceinline__ void compute_scores_e4m3(
    const QFrags& q_frags, uint32_t q_base, uint32_t k_base, int row_group, int key_group,
    float (&acc)[Cfg::kScoreChains][Cfg::kScoreTiles][4]) {
  static_assert(Cfg::kE4m3Scores, "raw e4m3 operands");
  const int lane = threadIdx.x & 31;
  if constexpr (Cfg::kQInRegisters) {
    // One n8 tile: ldmatrix.x4 gives the B fragments of two k32 steps (matrices = chunks 4 kp +
    // 0..3 of the same 8 keys; chunk pairs are a k32 step's b0, b1).
    const int key = key_group * Cfg::kKeysPerWarp + (lane & 7);
#pragma unroll
    for (int kp = 0; kp < Cfg::kQSteps / 2; ++kp) {
      uint32_t b[4];
      ldmatrix_x4(b, k_base + Cfg::operand_offset(key, 4 * kp + (lane >> 3)));
      E4m3Mma::mma_e4m3(acc[0][0], q_frags[2 * kp], b[0], b[1]);
      E4m3Mma::mma_e4m3(acc[1][0], q_frags[2 * kp + 1], b[2], b[3]);
    }
  } else {
    // A from shared memory (matrices = rows +0 / +8 of chunk 2 ks, then of chunk 2 ks + 1);
    // ldmatrix.x4 gives the B fragments of two n8 tiles of one k32 step (matrices = keys +0
    // chunks 2 ks, 2 ks + 1, then keys +8).
    const int q_row = row_group * 16 + (lane & 15);
    const int key_in_pair = ((lane >> 4) << 3) + (lane & 7);
#pragma unroll 2
    for (int ks = 0; ks < Cfg::kQSteps; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, q_base + Cfg::operand_offset(q_row, 2 * ks + (lane >> 4)));
#pragma unroll
      for (int np = 0; np < Cfg::kScoreTiles / 2; ++np) {
        const int key = key_group * Cfg::kKeysPerWarp + np * 16 + key_in_pair;
        uint32_t b[4];
        ldmatrix_x4(b, k_base + Cfg::operand_offset(key, 2 * ks + ((lane >> 3) & 1)));
        E4m3Mma::mma_e4m3(acc[0][2 * np], a, b[0], b[1]);
        E4m3Mma::mma_e4m3(acc[0][2 * np + 1], a, b[2], b[3]);
      }
    }
  }
}

// The f16 B fragments of the even and odd columns from one transposed-ldmatrix register `v` of 8
// keys x 16 e4m3 columns: even = keys (2t, 2t + 1) of column 2g, odd = the same of column 2g + 1.
__device__ __forceinline__ void e4m3_value_pairs(uint32_t v, uint32_t& even, uint32_t& odd) {
  // v's bytes: V[2t][2g], V[2t][2g + 1], V[2t + 1][2g], V[2t + 1][2g + 1] (lowest first).
  const uint32_t by_column = byte_perm(v, 0x3120);  // V[2t][2g], V[2t+1][2g], then column 2g + 1
  even = e4m3x2_to_f16x2(static_cast<uint16_t>(by_column));
  odd = e4m3x2_to_f16x2(static_cast<uint16_t>(by_column >> 16));
}

// o[m16 tile][n8 tile][4] += P (kBlockM x 64, shared, f16) x V columns [64 warp, 64 warp + 64) of
// the raw e4m3 tile at v_base. n8 tile 2 c + e holds columns 16 c + 2 j + e (j < 8) of the slab.
template <class Cfg>
__device__ __forceinline__ void accumulate_values_e4m3(
    uint32_t p_base, uint32_t v_base, int warp, float (&o)[Cfg::kRowTiles][Cfg::kColTiles][4]) {
  static_assert(Cfg::kE4m3Scores && Cfg::kColTiles == 8, "4 chunks of 16 e4m3 columns per warp");
  const int lane = threadIdx.x & 31;
  constexpr int kChunks = Cfg::kColsPerWarp / 16;  // 16-column chunks of the warp's slab
#pragma unroll
  for (int ks = 0; ks < kBlockN / 16; ++ks) {
    uint32_t a[Cfg::kRowTiles][4];
#pragma unroll
    for (int mt = 0; mt < Cfg::kRowTiles; ++mt) {
      ldmatrix_x4(a[mt],
                  p_base + swizzled<kPRowBytes>(mt * 16 + (lane & 15), 2 * ks + (lane >> 4)));
    }
    // Transposed loads: matrices = keys +0 / +8 of chunk c, then keys +0 / +8 of chunk c + 1.
    const int key = ks * 16 + (((lane >> 3) & 1) << 3) + (lane & 7);
#pragma unroll
    for (int cp = 0; cp < kChunks / 2; ++cp) {
      uint32_t v[4];
      ldmatrix_x4_trans(v,
                        v_base + Cfg::operand_offset(key, warp * kChunks + 2 * cp + (lane >> 4)));
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = 2 * cp + half;
        uint32_t even0, odd0, even1, odd1;  // keys +0 (b0) and +8 (b1) of the k16 step
        e4m3_value_pairs(v[2 * half], even0, odd0);
        e4m3_value_pairs(v[2 * half + 1], even1, odd1);
#pragma unroll
        for (int mt = 0; mt < Cfg::kRowTiles; ++mt) {
          E4m3Mma::mma(o[mt][2 * c], a[mt], even0, even1);
          E4m3Mma::mma(o[mt][2 * c + 1], a[mt], odd0, odd1);
        }
      }
    }
  }
}

// The column (in the warp's 64-column slab) of the pair (x, y) = (o[mt][2 c][2 h + i],
// o[mt][2 c + 1][2 h + i]) of lane t (= lane % 4): columns 16 c + 4 t + 2 i and that + 1.
__device__ __forceinline__ int value_pair_column(int c, int i, int t) {
  return 16 * c + 4 * t + 2 * i;
}

}  // namespace mlakit::cuda::decode_sm90
