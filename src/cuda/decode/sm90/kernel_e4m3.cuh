// The two products of the mma.sync decode kernel (kernel.cuh) over raw fp8_e4m3 tiles, for an fp8
// q (Config<rows, kFp8E4m3, RawE4m3Mma>) or a 16-bit q with 16 rows (RawE4m3Q16Mma: q in f16
// times a per-row power of two, prepare_raw_q, undone on the scores): the raw tile is read in
// place (e4m3_swizzled) and each warp converts the fragments it loads in registers (e4m3 -> f16 is
// exact), so no tile is converted in shared memory and no barrier waits for a conversion
// (docs/kernels/decode_sm90.md, "raw e4m3"). Also the 16-bit q preparation (q_row_factor,
// prepare_raw_q) that the raw fp8_ds_mla tiles share.
//   scores  S = q K^T in f16: ldmatrix of raw K rows hands lane (g, t) the bytes of dims 4 t ..
//           4 t + 3 of a 16-dim chunk of key g; converted, they are the B fragments b0 = dims (4 t,
//           4 t + 1), b1 = dims (4 t + 2, 4 t + 3), i.e. the MMA's k slots (2 t, 2 t + 1) and (2 t
//           + 8, 2 t + 9) hold those dims. q is stored in the same order (raw_e4m3_dim_order,
//           kernel_common.cuh), so the sums are over matching dims;
//   values  O += P V in f16: a transposed ldmatrix of 8 keys x 16 e4m3 columns gives lane (g, t)
//           the bytes V[2t][2g], V[2t][2g + 1], V[2t + 1][2g], V[2t + 1][2g + 1]; one byte permute
//           pairs them by column, and one conversion each gives the B fragments (keys 2t, 2t + 1)
//           of column 2g and of column 2g + 1. So an n8 MMA tile holds the even (or odd) columns
//           of a 16-column chunk, and a lane's two tiles of a chunk hold its 4 consecutive columns
//           16 c + 4 t .. 16 c + 4 t + 3 (value_pair_column).
// Each warp converts the keys of its scores and the 64 value columns it owns: 16 rows convert each
// K value once for the scores, 64 rows four times (four row groups share a key group).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/decode/sm90/kernel_common.cuh"
#include "cuda/decode/sm90/ptx.cuh"
#include "cuda/decode/sm90/traits.cuh"

namespace mlakit::cuda::decode_sm90 {

// 2^(14 - e) for the exponent e of `max_abs` (max_abs in [2^e, 2^(e+1))): the factor that puts a
// row's largest |q| in [2^14, 2^15). 1 for 0; a NaN or infinite max_abs gives a tiny factor,
// which leaves NaN and infinity as they are.
__device__ __forceinline__ float q_row_factor(float max_abs) {
  if (!(max_abs > 0.0f)) return 1.0f;  // 0 (or a NaN, which then stays NaN through the factor)
  const int e =
      min(max((static_cast<int>(__float_as_uint(max_abs) >> 23) & 0xff) - 127, -110), 127);
  return __uint_as_float(static_cast<uint32_t>(127 + 14 - e) << 23);
}

// The q tile of a 16-bit q over raw tiles (Cfg::kRawQ16), staged as fetched (operand layout,
// [16][576]) at `staging`, rewritten in place: the dims the raw e4m3 MMAs read (fp8_ds_mla: the 512
// NoPE dims; fp8_e4m3: all 576) to f16 x the row's factor in raw_e4m3_dim_order; fp8_ds_mla's rope
// units to the rope dtype. The factor puts the row's largest |value| among those dims in
// [2^14, 2^15) (a bf16 q may exceed f16's range). `factors` ([16] f32, shared) receives the rows'
// factors. Every thread of the CTA calls it; it ends with a barrier.
template <class Cfg>
__device__ __forceinline__ void prepare_raw_q(RuntimeDType q_dtype, uint8_t* staging,
                                              float* factors) {
  static_assert(Cfg::kRawQ16 && Cfg::kBlockM == 16, "16 rows of a 16-bit q over raw tiles");
  constexpr int kRawUnits = Cfg::kRawDsMla ? 64 : kRowChunks;  // 8-value units the MMAs read raw
  constexpr int kGroups = kRawUnits / 2;                       // 16-dim groups of them
  constexpr int kThreadsPerRow = kThreads / 16;                // 16
  const int t = static_cast<int>(threadIdx.x);
  auto to_floats = [&](uint4 v, float(&f)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const auto lo = static_cast<uint16_t>(w[i]), hi = static_cast<uint16_t>(w[i] >> 16);
      f[2 * i] = q_dtype == RuntimeDType::kBF16 ? __bfloat162float(__ushort_as_bfloat16(lo))
                                                : __half2float(__ushort_as_half(lo));
      f[2 * i + 1] = q_dtype == RuntimeDType::kBF16 ? __bfloat162float(__ushort_as_bfloat16(hi))
                                                    : __half2float(__ushort_as_half(hi));
    }
  };
  // 1. Each row's largest |value| among those dims: 16 threads per row, then the half-warp.
  {
    const int row = t / kThreadsPerRow, part = t % kThreadsPerRow;
    float max_abs = 0.0f;
#pragma unroll
    for (int unit = part; unit < kRawUnits; unit += kThreadsPerRow) {
      float f[8];
      to_floats(*reinterpret_cast<const uint4*>(staging + Cfg::operand_offset(row, unit)), f);
#pragma unroll
      for (int k = 0; k < 8; ++k) max_abs = fmaxf(max_abs, fabsf(f[k]));
    }
#pragma unroll
    for (int offset = kThreadsPerRow / 2; offset > 0; offset /= 2) {
      max_abs = fmaxf(max_abs, __shfl_xor_sync(0xffffffffu, max_abs, offset));
    }
    if (part == 0) factors[row] = q_row_factor(max_abs);
  }
  __syncthreads();  // the factors are visible, and every thread has read its units
  // 2. 16 rows x kGroups groups of 16 dims, two or three per thread; fp8_ds_mla's rope: 16 rows x
  // 8 units.
#pragma unroll
  for (int item = t; item < 16 * kGroups; item += kThreads) {
    const int row = item / kGroups, group = item % kGroups;
    uint8_t* lo_unit = staging + Cfg::operand_offset(row, 2 * group);
    uint8_t* hi_unit = staging + Cfg::operand_offset(row, 2 * group + 1);
    float f[16];
    to_floats(*reinterpret_cast<const uint4*>(lo_unit), *reinterpret_cast<float(*)[8]>(&f[0]));
    to_floats(*reinterpret_cast<const uint4*>(hi_unit), *reinterpret_cast<float(*)[8]>(&f[8]));
    const float factor = factors[row];
    auto pack = [&](int a) { return F16Mma::pack(f[a] * factor, f[a + 1] * factor); };
    // raw_e4m3_dim_order: lo holds dims 0 1 4 5 8 9 12 13, hi dims 2 3 6 7 10 11 14 15
    const uint4 lo = make_uint4(pack(0), pack(4), pack(8), pack(12));
    const uint4 hi = make_uint4(pack(2), pack(6), pack(10), pack(14));
    *reinterpret_cast<uint4*>(lo_unit) = lo;
    *reinterpret_cast<uint4*>(hi_unit) = hi;
  }
  if constexpr (Cfg::kRawDsMla) {
    using Rope = typename Cfg::Element::RopeMma;
    if (t < 16 * (kRowChunks - kRawUnits)) {
      const int row = t / (kRowChunks - kRawUnits), unit = kRawUnits + t % (kRowChunks - kRawUnits);
      auto* v = reinterpret_cast<uint4*>(staging + Cfg::operand_offset(row, unit));
      *v = q16x8_as<Rope>(*v, q_dtype);
    }
  }
  __syncthreads();  // the converted tile is complete
}

// The f16 B fragments (b0, b1) of one 16-dim chunk from a raw ldmatrix register (4 e4m3 dims).
__device__ __forceinline__ void e4m3_key_pairs(uint32_t v, uint32_t& b0, uint32_t& b1) {
  b0 = e4m3x2_to_f16x2(v, false);
  b1 = e4m3x2_to_f16x2(v, true);
}

// With q's A fragments in registers (16 rows): raw chunks [0, 4 kSteps) of the 8 keys at `key`
// (16 e4m3 dims each, one k16 step) against q's fragments of the same steps, step 4 kp + i into
// acc[chain(kp, i)][0]. ldmatrix.x4 gives chunks 4 kp + 0..3 of the same 8 keys. The steps run in
// kSteps / kStrides rounds; round r loads kp = r + l kSteps / kStrides for l < kStrides and issues
// their MMAs interleaved (i outer, l inner), so that when a chain is one stride of kp (fp8_ds_mla's
// scale groups), consecutive MMAs still feed different chains (kStrides 1: kp in order).
template <int kSteps, int kStrides, class Cfg, class QFrags, class Chain>
__device__ __forceinline__ void raw_e4m3_key_steps(
    const QFrags& q_frags, uint32_t k_base, int key, const Chain& chain,
    float (&acc)[Cfg::kScoreChains][Cfg::kScoreTiles][4]) {
  static_assert(kSteps % kStrides == 0, "whole rounds");
  constexpr int kRounds = kSteps / kStrides;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    uint32_t v[kStrides][4];
#pragma unroll
    for (int l = 0; l < kStrides; ++l) {
      ldmatrix_x4(v[l], k_base + Cfg::raw_offset(key, 4 * (r + l * kRounds) + (lane >> 3)));
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int l = 0; l < kStrides; ++l) {
        const int kp = r + l * kRounds;
        uint32_t b0, b1;
        e4m3_key_pairs(v[l][i], b0, b1);
        F16Mma::mma(acc[chain(kp, i)][0], q_frags[4 * kp + i], b0, b1);
      }
    }
  }
}

// acc[chain][n8 tile][4] += q rows of this warp's row group x keys of its key group: q in f16 in
// raw_e4m3_dim_order (A fragments in registers for 16 rows, else shared memory at q_base), K raw.
template <class Cfg, class QFrags>
__device__ __forceinline__ void compute_scores_raw_e4m3(
    const QFrags& q_frags, uint32_t q_base, uint32_t k_base, int row_group, int key_group,
    float (&acc)[Cfg::kScoreChains][Cfg::kScoreTiles][4]) {
  static_assert(Cfg::kRawE4m3, "raw e4m3 tiles");
  using Elem = typename Cfg::Element;
  const int lane = threadIdx.x & 31;
  if constexpr (Cfg::kQInRegisters) {
    // One n8 tile, all 36 chunks; step 4 kp + i in chain i (a conversion precedes each MMA).
    raw_e4m3_key_steps<kDimQK / 64, 1, Cfg>(
        q_frags, k_base, key_group * Cfg::kKeysPerWarp + (lane & 7),
        [](int, int i) { return i % Cfg::kScoreChains; }, acc);
  } else {
    // A from shared memory; ldmatrix.x4 gives chunk ks of 4 x 8 keys (the warp's 4 n8 tiles).
    static_assert(Cfg::kScoreTiles == 4, "one x4 load covers the warp's 32 keys");
    const int q_row = row_group * 16 + (lane & 15);
    const int key = key_group * Cfg::kKeysPerWarp + lane;
#pragma unroll 4
    for (int ks = 0; ks < kDimQK / 16; ++ks) {
      uint32_t a[4], v[4];
      ldmatrix_x4(a, q_base + Cfg::operand_offset(q_row, 2 * ks + (lane >> 4)));
      ldmatrix_x4(v, k_base + Cfg::raw_offset(key, ks));
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        uint32_t b0, b1;
        e4m3_key_pairs(v[nt], b0, b1);
        Elem::mma(acc[0][nt], a, b0, b1);
      }
    }
  }
}

// The f16 B fragments of the even and odd columns from one transposed-ldmatrix register `v` of 8
// keys x 16 e4m3 columns: even = keys (2t, 2t + 1) of column 2g, odd = the same of column 2g + 1.
__device__ __forceinline__ void e4m3_value_pairs(uint32_t v, uint32_t& even, uint32_t& odd) {
  // v's bytes: V[2t][2g], V[2t][2g + 1], V[2t + 1][2g], V[2t + 1][2g + 1] (lowest first).
  const uint32_t by_column = byte_perm(v, 0x3120);  // V[2t][2g], V[2t+1][2g], then column 2g + 1
  even = e4m3x2_to_f16x2(by_column, false);
  odd = e4m3x2_to_f16x2(by_column, true);
}

// o[m16 tile][n8 tile][4] += P (kBlockM x 64, shared, f16) x V columns [64 warp, 64 warp + 64) of
// the raw e4m3 tile at v_base. n8 tile 2 c + e holds columns 16 c + 2 j + e (j < 8) of the slab.
// scale_p(ks, a) may rewrite P's A fragments of k16 step ks first (raw fp8_ds_mla: the keys'
// value scales, kernel_ds_mla.cuh).
template <class Cfg, class ScaleP>
__device__ __forceinline__ void accumulate_values_raw_e4m3(
    uint32_t p_base, uint32_t v_base, int warp, float (&o)[Cfg::kRowTiles][Cfg::kColTiles][4],
    const ScaleP& scale_p) {
  static_assert((Cfg::kRawE4m3 || Cfg::kRawDsMla) && Cfg::kColTiles == 8,
                "4 chunks of 16 e4m3 columns per warp");
  using Elem = typename Cfg::Element;
  const int lane = threadIdx.x & 31;
  constexpr int kChunks = Cfg::kColsPerWarp / 16;  // 16-column chunks of the warp's slab
#pragma unroll
  for (int ks = 0; ks < kBlockN / 16; ++ks) {
    uint32_t a[Cfg::kRowTiles][4];
    load_p_fragments<Cfg>(p_base, ks, a);
    scale_p(ks, a);
    // Transposed loads: matrices = keys +0 / +8 of chunk c, then keys +0 / +8 of chunk c + 1.
    const int key = ks * 16 + (((lane >> 3) & 1) << 3) + (lane & 7);
#pragma unroll
    for (int cp = 0; cp < kChunks / 2; ++cp) {
      uint32_t v[4];
      ldmatrix_x4_trans(v, v_base + Cfg::raw_offset(key, warp * kChunks + 2 * cp + (lane >> 4)));
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c = 2 * cp + half;
        uint32_t even0, odd0, even1, odd1;  // keys +0 (b0) and +8 (b1) of the k16 step
        e4m3_value_pairs(v[2 * half], even0, odd0);
        e4m3_value_pairs(v[2 * half + 1], even1, odd1);
#pragma unroll
        for (int mt = 0; mt < Cfg::kRowTiles; ++mt) {
          Elem::mma(o[mt][2 * c], a[mt], even0, even1);
          Elem::mma(o[mt][2 * c + 1], a[mt], odd0, odd1);
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
