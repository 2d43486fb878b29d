// The sm90 absorbed-MQA decode kernel (docs/kernels/decode_sm90.md).
//
// One CTA = (request b, split k, tile of kBlockM query rows). Its keys are the k-th chunk of
// round_up(ceil(seq_lens[b] / S), 64) keys, computed here from the device seq_len. Per 64-key tile:
//   copy    cp.async of the 64 cache entries (page ids from the block table) into a ring stage,
//           kTilesAhead tiles ahead; keys past the chunk are zero-filled, never read;
//   convert (fp8 formats) raw entries -> a 16-bit tile in shared memory;
//   scores  S = q K^T with mma.sync m16n8k16 (f32 accumulators), every row reading the same tile;
//   softmax online, per row, in log2 units; the tile max is exchanged between the warps that share
//           a row through shared memory; P (16-bit) goes to shared memory;
//   values  O = O * alpha + P V, V = the tile's first 512 columns (read once: warp w owns 64
//           columns of every row).
// The epilogue writes normalized O and the LSE to out / lse (S = 1) or to the split partials.
// A block id outside [0, num_blocks) or a seq_len outside [0, max_seq_len] turns the rows of the
// CTA into NaN (nothing is read out of bounds; the host cannot check device-resident indices).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda/decode/sm90/params.cuh"
#include "cuda/decode/sm90/ptx.cuh"
#include "cuda/decode/sm90/traits.cuh"

namespace mlakit::cuda::decode_sm90 {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Keys query j (of s_q) may see: [0, visible_end) with bottom-right causal alignment.
__device__ __forceinline__ int visible_end(int seq_len, int s_q, int j) {
  return min(max(seq_len - s_q + j + 1, 0), seq_len);
}

// The keys one CTA works on and its place in the batch.
struct WorkItem {
  int batch_index, split, row0;
  int key_begin;  // first key of the split
  int key_end;    // end of the split (<= seq_len)
  int cta_end;    // min(key_end, keys the CTA's last row sees): keys past it are never loaded
  int num_tiles;
  int seq_len;
  bool bad_seq_len;
};

template <class Cfg>
__device__ __forceinline__ WorkItem make_work_item(const DecodeKernelParams& p) {
  WorkItem w;
  int cta = static_cast<int>(blockIdx.x);
  w.row0 = (cta % p.row_tiles) * Cfg::kBlockM;
  cta /= p.row_tiles;
  w.split = cta % p.num_splits;
  w.batch_index = cta / p.num_splits;
  const int raw_len = p.seq_lens[w.batch_index * p.seq_lens_stride];
  w.bad_seq_len = raw_len < 0 || raw_len > p.max_seq_len;
  w.seq_len = w.bad_seq_len ? 0 : raw_len;
  const int per_split = (w.seq_len + p.num_splits - 1) / p.num_splits;
  const int chunk = (per_split + kBlockN - 1) / kBlockN * kBlockN;
  // split * chunk < 2^31: chunk <= seq_len / S + 64 and the host caps max_seq_len at 2^31 - 2^14.
  w.key_begin = min(w.split * chunk, w.seq_len);
  w.key_end = min(w.key_begin + chunk, w.seq_len);
  const int last_row = min(w.row0 + Cfg::kBlockM, p.rows) - 1;
  w.cta_end = min(w.key_end, visible_end(w.seq_len, p.s_q, last_row / p.num_heads));
  w.num_tiles = w.cta_end > w.key_begin ? (w.cta_end - w.key_begin + kBlockN - 1) / kBlockN : 0;
  return w;
}

// ---- q
// -------------------------------------------------------------------------------------------

// Eight consecutive q values starting at element `offset`, converted to the MMA element type.
template <class Elem>
__device__ __forceinline__ uint4 load_q8(const DecodeKernelParams& p, int64_t offset) {
  float f[8] = {};
  switch (p.q_dtype) {
    case RuntimeDType::kBF16:
    case RuntimeDType::kF16: {
      const uint16_t* src = static_cast<const uint16_t*>(p.q) + offset;
      uint16_t h[8];
      if (p.q_rows_16b_aligned) {
        const uint4 v = *reinterpret_cast<const uint4*>(src);
        memcpy(h, &v, sizeof(h));
      } else {
        for (int i = 0; i < 8; ++i) h[i] = src[i];
      }
      for (int i = 0; i < 8; ++i) {
        f[i] = p.q_dtype == RuntimeDType::kBF16 ? __bfloat162float(__ushort_as_bfloat16(h[i]))
                                                : __half2float(__ushort_as_half(h[i]));
      }
      break;
    }
    case RuntimeDType::kF32: {
      const float* src = static_cast<const float*>(p.q) + offset;
      for (int i = 0; i < 8; ++i) f[i] = src[i];
      break;
    }
    case RuntimeDType::kFp8E4m3: {
      const uint8_t* src = static_cast<const uint8_t*>(p.q) + offset;
      for (int i = 0; i < 8; i += 2) {
        const uint16_t two = static_cast<uint16_t>(src[i] | (src[i + 1] << 8));
        const float2 v = f16x2_to_float2(e4m3x2_to_f16x2(two));
        f[i] = v.x;
        f[i + 1] = v.y;
      }
      break;
    }
  }
  return make_uint4(Elem::pack(f[0], f[1]), Elem::pack(f[2], f[3]), Elem::pack(f[4], f[5]),
                    Elem::pack(f[6], f[7]));
}

// q rows [row0, row0 + kBlockM) of request b -> dst [kBlockM][1152] (swizzled), zero past `rows`.
template <class Cfg>
__device__ __forceinline__ void load_q_tile(const DecodeKernelParams& p, const WorkItem& w,
                                            uint8_t* dst) {
  constexpr int kUnits = Cfg::kBlockM * kRowChunks;  // 8 elements (16 bytes converted) each
  for (int u = threadIdx.x; u < kUnits; u += kThreads) {
    const int r = u / kRowChunks, c = u % kRowChunks;
    const int row = w.row0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < p.rows) {
      const int j = row / p.num_heads, n = row % p.num_heads;
      const int64_t offset =
          w.batch_index * p.q_stride_batch + j * p.q_stride_query + n * p.q_stride_head + c * 8;
      v = load_q8<typename Cfg::Element>(p, offset);
    }
    *reinterpret_cast<uint4*>(dst + swizzled<kRowBytes>(r, c)) = v;
  }
}

// ---- copy of one key tile ----------------------------------------------------------------------

template <class Cfg>
__device__ __forceinline__ int key_of_pass(int pass) {
  return static_cast<int>(threadIdx.x) / Cfg::kThreadsPerKey + pass * Cfg::kKeysPerPass;
}

// Page ids of this thread's keys of tile `tile` (-1 past cta_end: the table is not read there).
template <class Cfg>
__device__ __forceinline__ void lookup_pages(const DecodeKernelParams& p, const WorkItem& w,
                                             int tile, int (&pages)[Cfg::kLoadPasses]) {
#pragma unroll
  for (int pass = 0; pass < Cfg::kLoadPasses; ++pass) {
    const int pos = w.key_begin + tile * kBlockN + key_of_pass<Cfg>(pass);
    pages[pass] = pos < w.cta_end ? p.block_table[w.batch_index * p.block_table_stride_batch +
                                                  (pos / p.block_size) * p.block_table_stride_col]
                                  : -1;
  }
}

// Byte offset of chunk c of key `key` in a raw stage: native tiles are the MMA operand and use the
// swizzled layout; fp8 stages are plain rows that only the conversion reads.
template <class Cfg>
__device__ __forceinline__ uint32_t raw_offset(int key, int c) {
  if constexpr (Cfg::kConvert) {
    return static_cast<uint32_t>(key * Cfg::kRawEntry + c * 16);
  } else {
    return swizzled<kRowBytes>(key, c);
  }
}

// Issues (does not wait for) the copies of tile `tile` into `stage`. Sets `bad` on a block id
// outside the cache; that key is zero-filled instead.
template <class Cfg>
__device__ __forceinline__ void copy_tile(const DecodeKernelParams& p, const WorkItem& w, int tile,
                                          const int (&pages)[Cfg::kLoadPasses], uint8_t* stage,
                                          bool& bad) {
  const uint32_t base = smem_addr(stage);
  const int lane_chunk = static_cast<int>(threadIdx.x) % Cfg::kThreadsPerKey;
#pragma unroll
  for (int pass = 0; pass < Cfg::kLoadPasses; ++pass) {
    const int key = key_of_pass<Cfg>(pass);
    const int pos = w.key_begin + tile * kBlockN + key;
    const int page = pages[pass];
    bool valid = pos < w.cta_end;
    if (valid && (page < 0 || page >= p.num_blocks)) {
      bad = true;
      valid = false;
    }
    const uint8_t* src = valid ? p.cache + page * p.cache_stride_block_bytes +
                                     (pos % p.block_size) * p.cache_stride_slot_bytes
                               : p.cache;
#pragma unroll
    for (int step = 0; step < Cfg::kChunkSteps; ++step) {
      const int c = lane_chunk + step * Cfg::kThreadsPerKey;
      if (Cfg::kRawChunks % Cfg::kThreadsPerKey == 0 || c < Cfg::kRawChunks) {
        cp_async_16(base + raw_offset<Cfg>(key, c), valid ? src + c * 16 : src, valid);
      }
    }
  }
}

// ---- fp8 -> 16-bit conversion of a landed raw tile ----------------------------------------------

// raw [64][kRawEntry] -> conv [64][1152] swizzled, in units of 8 values (16 converted bytes).
template <class Cfg>
__device__ __forceinline__ void convert_tile(const uint8_t* raw, uint8_t* conv) {
  using Elem = typename Cfg::Element;
  constexpr int kUnits = kBlockN * kRowChunks;
  static_assert(kUnits % kThreads == 0, "every thread converts the same number of units");
#pragma unroll 6
  for (int i = 0; i < kUnits / kThreads; ++i) {
    const int u = static_cast<int>(threadIdx.x) + i * kThreads;
    const int key = u / kRowChunks, c = u % kRowChunks;
    const uint8_t* entry = raw + key * Cfg::kRawEntry;
    uint4 v;
    if constexpr (Cfg::kFormat == CacheFormat::kFp8E4m3) {
      const uint2 in = *reinterpret_cast<const uint2*>(entry + c * 8);
      v = make_uint4(Elem::from_e4m3x2(in.x & 0xffff), Elem::from_e4m3x2(in.x >> 16),
                     Elem::from_e4m3x2(in.y & 0xffff), Elem::from_e4m3x2(in.y >> 16));
    } else {
      // fp8_ds_mla: bytes [0, 512) e4m3 NoPE, [512, 528) four f32 scales (one per 128 values, i.e.
      // per 16 chunks), [528, 656) the rope values already in the MMA element type.
      constexpr int kNopeChunks = 512 / 8, kChunksPerScale = 128 / 8;
      constexpr int kScaleOffset = 512, kRopeOffset = 528;
      if (c < kNopeChunks) {
        const uint2 in = *reinterpret_cast<const uint2*>(entry + c * 8);
        const float scale =
            *reinterpret_cast<const float*>(entry + kScaleOffset + (c / kChunksPerScale) * 4);
        uint32_t out[4];
        const uint32_t words[2] = {in.x, in.y};
#pragma unroll
        for (int pair = 0; pair < 4; ++pair) {
          const uint16_t two = static_cast<uint16_t>(words[pair / 2] >> (16 * (pair % 2)));
          const float2 f = f16x2_to_float2(e4m3x2_to_f16x2(two));
          out[pair] = Elem::pack(f.x * scale, f.y * scale);
        }
        v = make_uint4(out[0], out[1], out[2], out[3]);
      } else {
        v = *reinterpret_cast<const uint4*>(entry + kRopeOffset + (c - kNopeChunks) * 16);
      }
    }
    *reinterpret_cast<uint4*>(conv + swizzled<kRowBytes>(key, c)) = v;
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
#pragma unroll
    for (int mt = 0; mt < Cfg::kRowTiles; ++mt) {
      ldmatrix_x4(a[mt],
                  p_base + swizzled<kPRowBytes>(mt * 16 + (lane & 15), 2 * ks + (lane >> 4)));
    }
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

// ---- epilogue ----------------------------------------------------------------------------------

__device__ __forceinline__ void store_pair(void* base, int64_t offset, RuntimeDType dtype, float x,
                                           float y) {
  switch (dtype) {
    case RuntimeDType::kF32:
      *reinterpret_cast<float2*>(static_cast<float*>(base) + offset) = make_float2(x, y);
      break;
    case RuntimeDType::kBF16:
      *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(base) + offset) =
          __floats2bfloat162_rn(x, y);
      break;
    default:
      *reinterpret_cast<__half2*>(static_cast<__half*>(base) + offset) = __floats2half2_rn(x, y);
      break;
  }
}

// ---- the kernel --------------------------------------------------------------------------------

template <class Cfg>
__global__ void __launch_bounds__(kThreads, 1)
    mla_decode_sm90_kernel(const __grid_constant__ DecodeKernelParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, tq = lane & 3;  // MMA fragment row (0..7) and column pair (0..3)
  const int row_group = warp / Cfg::kKeyGroups, key_group = warp % Cfg::kKeyGroups;

  const WorkItem w = make_work_item<Cfg>(p);
  bool bad = w.bad_seq_len;

  float* row_max_part = reinterpret_cast<float*>(smem + Cfg::kRowMaxOffset);  // [kKeyGroups][M]
  float* row_sum_part = reinterpret_cast<float*>(smem + Cfg::kRowSumOffset);  // [kKeyGroups][M]
  float* alpha_s = reinterpret_cast<float*>(smem + Cfg::kAlphaOffset);        // [M]
  float* max_final = reinterpret_cast<float*>(smem + Cfg::kMaxFinalOffset);   // [M]
  auto raw_stage = [&](int tile) {
    return smem + Cfg::kRawOffset + (tile % Cfg::kStages) * align128(Cfg::kRawTileBytes);
  };

  // The two rows (g, g + 8 of the row group) this thread's score fragments hold, and the end of
  // the keys each sees (bottom-right causal within the split).
  int score_row[2], row_end[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    score_row[h] = row_group * 16 + g + 8 * h;
    const int row = w.row0 + score_row[h];
    row_end[h] =
        row < p.rows ? min(w.key_end, visible_end(w.seq_len, p.s_q, row / p.num_heads)) : w.key_end;
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
  if (w.num_tiles > 0) {
    int pages[Cfg::kLoadPasses];
#pragma unroll
    for (int t = 0; t < Cfg::kTilesAhead; ++t) {
      if (t < w.num_tiles) {
        lookup_pages<Cfg>(p, w, t, pages);
        copy_tile<Cfg>(p, w, t, pages, raw_stage(t), bad);
      }
      cp_async_commit();
    }
    if constexpr (Cfg::kQInRegisters) {
      // Stage q where no copy is in flight (the conversion buffer, or the ring stage the first
      // in-loop copy fills), then move it into A fragments.
      uint8_t* staging = Cfg::kConvert ? smem + Cfg::kConvOffset : raw_stage(Cfg::kStages - 1);
      load_q_tile<Cfg>(p, w, staging);
      __syncthreads();
#pragma unroll
      for (int ks = 0; ks < kDimQK / 16; ++ks) {
        ldmatrix_x4(q_frags[ks],
                    smem_addr(staging) + swizzled<kRowBytes>(lane & 15, 2 * ks + (lane >> 4)));
      }
    } else {
      load_q_tile<Cfg>(p, w, smem + Cfg::kQOffset);  // read after the loop's first barrier
    }
  }

  int next_pages[Cfg::kLoadPasses] = {};  // page ids of the next tile to copy
  if (Cfg::kTilesAhead < w.num_tiles) lookup_pages<Cfg>(p, w, Cfg::kTilesAhead, next_pages);

  for (int t = 0; t < w.num_tiles; ++t) {
    cp_async_wait<Cfg::kTilesAhead - 1>();  // this thread's copies of tile t have landed
    __syncthreads();  // everyone's have; tile t - 1 is no longer read by anyone
    const int ahead = t + Cfg::kTilesAhead;
    uint8_t* tile_data;
    if constexpr (Cfg::kConvert) {
      tile_data = smem + Cfg::kConvOffset;
      convert_tile<Cfg>(raw_stage(t), tile_data);
      __syncthreads();  // the converted tile is complete; raw stage t is free
    } else {
      tile_data = raw_stage(t);
    }
    // Native: stage (t - 1) % kStages is free since the barrier above; converted: stage t % kStages
    // since the conversion. Both equal ahead % kStages.
    if (ahead < w.num_tiles) copy_tile<Cfg>(p, w, ahead, next_pages, raw_stage(ahead), bad);
    cp_async_commit();
    if (ahead + 1 < w.num_tiles) lookup_pages<Cfg>(p, w, ahead + 1, next_pages);

    // scores
    float acc[Cfg::kScoreChains][Cfg::kScoreTiles][4];
#pragma unroll
    for (int c = 0; c < Cfg::kScoreChains; ++c)
#pragma unroll
      for (int nt = 0; nt < Cfg::kScoreTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[c][nt][e] = 0.0f;
    compute_scores<Cfg>(q_frags, smem_addr(smem + Cfg::kQOffset), smem_addr(tile_data), row_group,
                        key_group, acc);

    // scale, mask, tile max of this warp's keys per row
    const int tile_start = w.key_begin + t * kBlockN;
    float s[Cfg::kScoreTiles][4];
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < Cfg::kScoreTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = acc[0][nt][e];
        if constexpr (Cfg::kScoreChains == 2) v += acc[1][nt][e];
        const int pos = tile_start + key_group * Cfg::kKeysPerWarp + nt * 8 + 2 * tq + (e & 1);
        v = pos < row_end[e >> 1] ? v * p.score_scale_log2 : -INFINITY;
        s[nt][e] = v;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], v);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      if (tq == 0) row_max_part[key_group * Cfg::kBlockM + score_row[h]] = tile_max[h];
    }
    __syncthreads();  // the key groups' maxima are visible

    // online softmax: new max, rescale factor, probabilities into P
    uint8_t* p_tile = smem + Cfg::kPOffset;
    float m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m_tile = -INFINITY;
#pragma unroll
      for (int k = 0; k < Cfg::kKeyGroups; ++k) {
        m_tile = fmaxf(m_tile, row_max_part[k * Cfg::kBlockM + score_row[h]]);
      }
      const float m_new = fmaxf(m_run[h], m_tile);
      m_use[h] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: p = 2^-inf = 0
      const float alpha = fast_exp2(m_run[h] - m_use[h]);
      m_run[h] = m_new;
      l_run[h] *= alpha;
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
#pragma unroll
    for (int mt = 0; mt < Cfg::kRowTiles; ++mt) {
      const float a0 = alpha_s[mt * 16 + g], a1 = alpha_s[mt * 16 + g + 8];
#pragma unroll
      for (int nt = 0; nt < Cfg::kColTiles; ++nt) {
        o[mt][nt][0] *= a0;
        o[mt][nt][1] *= a0;
        o[mt][nt][2] *= a1;
        o[mt][nt][3] *= a1;
      }
    }
    accumulate_values<Cfg>(smem_addr(p_tile), smem_addr(tile_data), warp, o);
  }
  cp_async_wait<0>();  // no copy may outlive the CTA (only empty groups remain, but be exact)

  // ---- epilogue: row sums across lanes and key groups, then normalized rows and LSEs.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (tq == 0) row_sum_part[key_group * Cfg::kBlockM + score_row[h]] = l;
    if (tq == 0 && key_group == 0) max_final[score_row[h]] = m_run[h];
  }
  bad = __syncthreads_or(bad) != 0;

  const bool direct = p.num_splits == 1;
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
      float inv, lse;
      if (bad) {
        inv = lse = NAN;
      } else if (l > 0.0f) {
        inv = p.value_scale / l;
        lse = (max_final[local_row] + __log2f(l)) * kLn2;
      } else {
        inv = 0.0f;  // no visible key: out 0, lse -inf
        lse = -INFINITY;
      }
      const int j = row / p.num_heads, n = row % p.num_heads;
      const int64_t split_row =
          (static_cast<int64_t>(w.batch_index) * p.num_splits + w.split) * p.rows + row;
      if (direct || lse != -INFINITY) {  // the combine skips -inf partials without reading them
        void* base = direct ? p.out : p.partial_out;
        const int64_t row_offset = direct ? w.batch_index * p.out_stride_batch +
                                                j * p.out_stride_query + n * p.out_stride_head
                                          : split_row * kDimV;
        const RuntimeDType dtype = direct ? p.out_dtype : RuntimeDType::kF32;
#pragma unroll
        for (int nt = 0; nt < Cfg::kColTiles; ++nt) {
          const int col = warp * Cfg::kColsPerWarp + nt * 8 + 2 * tq;
          store_pair(base, row_offset + col, dtype, o[mt][nt][2 * h] * inv,
                     o[mt][nt][2 * h + 1] * inv);
        }
      }
      if (warp == 0 && tq == 0) {
        if (direct) {
          p.lse[w.batch_index * p.lse_stride_batch + j * p.lse_stride_query +
                n * p.lse_stride_head] = lse;
        } else {
          p.partial_lse[split_row] = lse;
        }
      }
    }
  }
}

}  // namespace mlakit::cuda::decode_sm90
