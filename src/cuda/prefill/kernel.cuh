// Device code of the sm90 prefill kernel: FlashAttention-2 schedule with mma.sync m16n8k16.
//
// Block = (64 query rows, head, request). Q tile [64, 192] in shared memory; for each key tile
// of 64: K tile [64, k_nope 128 | k_pe 64] and V tile [64, 128] copied with cp.async (double
// buffered); each warp computes S = Q K^T for its 16 rows in registers (f32), the online softmax
// in log2 units, and O += P V with P rounded to the input's 16-bit type. Causal: key tiles wholly
// above the diagonal are skipped, tiles crossing it are masked (bottom-right alignment).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/device_errors.cuh"
#include "cuda/common/elements.cuh"
#include "cuda/common/pack.cuh"
#include "cuda/prefill/online_softmax.cuh"
#include "cuda/prefill/params.cuh"
#include "cuda/prefill/ptx.cuh"
#include "cuda/prefill/request.cuh"
#include "cuda/prefill/traits.cuh"

namespace mlakit::cuda::prefill {

// ---- PTX wrappers
// --------------------------------------------------------------------------------

// Four 8x8 16-bit matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

// The MMA and the f32 -> 16-bit pair conversion of each input type.
template <class In>
struct Mma;

template <>
struct Mma<BF16> {
  // c[16x8] += a[16x16] * b[16x8], f32 accumulate.
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  // lo in the low half (the lower column index), round to nearest even.
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};

template <>
struct Mma<F16> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};

// ---- Loads
// ---------------------------------------------------------------------------------------

// 8 consecutive elements of a row (element stride `inner`) into 16 bytes of shared memory; zeros
// when !valid (rows past the request: V must be 0 there, since 0 * NaN is NaN). `unread`: the
// source address a zero-filled copy names and does not read, the tile's first row of the same
// tensor when it has one (written memory: initcheck does not honour the zero source size).
__device__ __forceinline__ void load_chunk(uint16_t* dst, const uint16_t* src, int64_t inner,
                                           bool valid, bool vector_loads, const void* unread) {
  if (vector_loads) {
    cp_async_16(dst, valid ? static_cast<const void*>(src) : unread, valid ? 16 : 0);
    return;
  }
  Pack<uint16_t, kChunk> pack;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) pack.v[i] = valid ? src[i * inner] : uint16_t{0};
  *reinterpret_cast<Pack<uint16_t, kChunk>*>(dst) = pack;
}

// Q rows [row0, row0 + kBlockM) of the request (rows >= rows_valid are zero).
// q_rows: the request's first token row of `head`
__device__ __forceinline__ void load_q_tile(const PrefillParams& p, SharedStorage& s,
                                            const uint16_t* q_rows, int rows_valid) {
  constexpr int kChunksPerRow = kHeadDimQK / kChunk;  // 24
  for (int c = threadIdx.x; c < kBlockM * kChunksPerRow; c += kThreads) {
    const int row = c / kChunksPerRow, col = (c % kChunksPerRow) * kChunk;
    load_chunk(&s.q[row][col], q_rows + row * p.q_stride[0] + col * p.q_stride[2], p.q_stride[2],
               row<rows_valid, p.vector_loads, rows_valid> 0 ? q_rows : p.q);
  }
}

// K and V rows [key0, key0 + kBlockN) of `head` into stage `stage` (keys >= keys_valid are 0).
// key0 counted from the first key of the whole tensor.
__device__ __forceinline__ void load_kv_tile(const PrefillParams& p, SharedStorage& s, int stage,
                                             int64_t key0, int keys_valid, int head) {
  const auto* k_nope = static_cast<const uint16_t*>(p.k_nope);
  const auto* k_pe = static_cast<const uint16_t*>(p.k_pe);
  const auto* v = static_cast<const uint16_t*>(p.v);
  constexpr int kNopeChunks = kNope / kChunk;    // 16
  constexpr int kKChunks = kHeadDimQK / kChunk;  // 24
  for (int c = threadIdx.x; c < kBlockN * kKChunks; c += kThreads) {
    const int row = c / kKChunks, chunk = c % kKChunks;
    const int64_t key = key0 + row;
    const bool valid = row < keys_valid;
    const uint16_t* src;
    int64_t inner;
    if (chunk < kNopeChunks) {
      src = k_nope + key * p.k_nope_stride[0] + head * p.k_nope_stride[1] +
            chunk * kChunk * p.k_nope_stride[2];
      inner = p.k_nope_stride[2];
    } else {
      src = k_pe + key * p.k_pe_stride[0] + (chunk - kNopeChunks) * kChunk * p.k_pe_stride[1];
      inner = p.k_pe_stride[1];
    }
    const void* unread = keys_valid <= 0 ? p.k_pe
                         : chunk < kNopeChunks
                             ? static_cast<const void*>(k_nope + key0 * p.k_nope_stride[0] +
                                                        head * p.k_nope_stride[1])
                             : k_pe + key0 * p.k_pe_stride[0];
    load_chunk(&s.k[stage][row][chunk * kChunk], src, inner, valid, p.vector_loads, unread);
  }
  constexpr int kVChunks = kHeadDimV / kChunk;  // 16
  for (int c = threadIdx.x; c < kBlockN * kVChunks; c += kThreads) {
    const int row = c / kVChunks, col = (c % kVChunks) * kChunk;
    const int64_t key = key0 + row;
    load_chunk(&s.v[stage][row][col],
               v + key * p.v_stride[0] + head * p.v_stride[1] + col * p.v_stride[2], p.v_stride[2],
               row<keys_valid, p.vector_loads, keys_valid> 0
                   ? v + key0 * p.v_stride[0] + head * p.v_stride[1]
                   : p.v);
  }
}

// ---- Compute
// -------------------------------------------------------------------------------------

constexpr int kScoreTiles = kBlockN / 8;  // n8 tiles of S per warp: 8
constexpr int kOutTiles = kHeadDimV / 8;  // n8 tiles of O per warp: 16

// acc[j] (16 x 8 tile j of the warp's S) += Q[warp rows] K[stage]^T.
template <class In>
__device__ __forceinline__ void compute_scores(const SharedStorage& s, int stage, int warp,
                                               int lane, float (&acc)[kScoreTiles][4]) {
#pragma unroll
  for (int j = 0; j < kScoreTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kHeadDimQK / 16; ++kk) {
    uint32_t a[4];
    // matrices: rows 0-7 / 8-15 x cols 0-7, then cols 8-15 (a0..a3 of the A fragment)
    ldmatrix_x4(a, &s.q[warp * 16 + lane % 16][kk * 16 + (lane / 16) * 8]);
#pragma unroll
    for (int jp = 0; jp < kScoreTiles / 2; ++jp) {
      uint32_t b[4];
      // matrices: keys 0-7 x dims 0-7, keys 0-7 x dims 8-15, keys 8-15 x dims 0-7, 8-15 x 8-15
      ldmatrix_x4(
          b, &s.k[stage][jp * 16 + (lane / 16) * 8 + lane % 8][kk * 16 + ((lane / 8) % 2) * 8]);
      Mma<In>::run(acc[2 * jp], a, b[0], b[1]);
      Mma<In>::run(acc[2 * jp + 1], a, b[2], b[3]);
    }
  }
}

// acc += P V[stage]; P is the warp's 16 x 64 probabilities in S's accumulator layout.
template <class In>
__device__ __forceinline__ void accumulate_pv(const SharedStorage& s, int stage, int lane,
                                              const float (&prob)[kScoreTiles][4],
                                              float (&acc)[kOutTiles][4]) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    // S accumulator tiles 2kk and 2kk+1 are exactly the A fragment of keys [16kk, 16kk + 16).
    const uint32_t a[4] = {Mma<In>::pack(prob[2 * kk][0], prob[2 * kk][1]),
                           Mma<In>::pack(prob[2 * kk][2], prob[2 * kk][3]),
                           Mma<In>::pack(prob[2 * kk + 1][0], prob[2 * kk + 1][1]),
                           Mma<In>::pack(prob[2 * kk + 1][2], prob[2 * kk + 1][3])};
#pragma unroll
    for (int jp = 0; jp < kOutTiles / 2; ++jp) {
      uint32_t b[4];
      // transposed matrices: keys 0-7 / 8-15 x dims 0-7, then dims 8-15
      ldmatrix_x4_trans(b, &s.v[stage][kk * 16 + lane % 16][jp * 16 + (lane / 16) * 8]);
      Mma<In>::run(acc[2 * jp], a, b[0], b[1]);
      Mma<In>::run(acc[2 * jp + 1], a, b[2], b[3]);
    }
  }
}

// ---- The kernel
// ----------------------------------------------------------------------------------

template <class In, class Out>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    prefill_kernel(const __grid_constant__ PrefillParams p) {
  extern __shared__ __align__(128) char smem[];
  SharedStorage& s = *reinterpret_cast<SharedStorage*>(smem);
  const int head = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;

  Request r;
  if (!resolve_request<Out>(p, head, 1, b, r)) return;
  const int64_t q_begin = r.q_begin, k_begin = r.k_begin;
  const int sq = r.sq, sk = r.sk;
  // First query row of the block within the request. Reversed: the blocks launched first hold
  // the last rows, which see the most keys under the causal mask (shorter tail of the grid).
  const int row0 = (gridDim.x - 1 - blockIdx.x) * kBlockM;
  if (row0 >= sq) return;
  const int rows_valid = min(kBlockM, sq - row0);
  const KeyRange keys = key_range(r, p.causal, row0, rows_valid);
  const int key_tiles = (keys.block_keys + kBlockN - 1) / kBlockN;

  const auto* q_rows =
      static_cast<const uint16_t*>(p.q) + (q_begin + row0) * p.q_stride[0] + head * p.q_stride[1];
  if (key_tiles > 0) {
    load_q_tile(p, s, q_rows, rows_valid);
    load_kv_tile(p, s, 0, k_begin, min(kBlockN, sk), head);
  }
  cp_async_commit();

  float out[kOutTiles][4];
#pragma unroll
  for (int j = 0; j < kOutTiles; ++j) out[j][0] = out[j][1] = out[j][2] = out[j][3] = 0.0f;
  RowState rows;
  const int warp_row = row0 + warp * 16 + lane / 4;  // the thread's first row in the request

  for (int t = 0; t < key_tiles; ++t) {
    const int stage = t % kStages;
    if (t + 1 < key_tiles) {
      const int next = (t + 1) * kBlockN;
      load_kv_tile(p, s, (t + 1) % kStages, k_begin + next, min(kBlockN, sk - next), head);
    }
    cp_async_commit();
    cp_async_wait<1>();  // every group but the one just issued has landed
    __syncthreads();

    float score[kScoreTiles][4];
    compute_scores<In>(s, stage, warp, lane, score);
    const int key0 = t * kBlockN;
    // Masked when some key of the tile is past the first row's limit (causal) or past sk.
    const bool masked = key0 + kBlockN > keys.first_row_keys;
    int key_limit[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
      key_limit[h] = row_key_limit(r, keys, p.causal, warp_row + 8 * h, key0);
    softmax_tile<kScoreTiles, kOutTiles>([&](int j, int i) -> float& { return score[j][i]; },
                                         p.scale_log2, masked, key_limit, lane, rows,
                                         [&](int j, int i) -> float& { return out[j][i]; });
    accumulate_pv<In>(s, stage, lane, score, out);
    __syncthreads();  // the next iteration's copy overwrites this stage
  }
  cp_async_wait<0>();

  store_rows<Out, kOutTiles>(p, r, head, warp_row, lane, rows,
                             [&](int j, int i) -> float& { return out[j][i]; });
}

}  // namespace mlakit::cuda::prefill
