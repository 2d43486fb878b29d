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
#include "cuda/common/quad.cuh"
#include "cuda/prefill/params.cuh"
#include "cuda/prefill/traits.cuh"

namespace mlakit::cuda::prefill {

// ---- PTX wrappers
// --------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; src_bytes 0 writes zeros (src is not read).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

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
// when !valid (rows past the request: V must be 0 there, since 0 * NaN is NaN).
__device__ __forceinline__ void load_chunk(uint16_t* dst, const uint16_t* src, int64_t inner,
                                           bool valid, bool vector_loads, const void* any_global) {
  if (vector_loads) {
    cp_async_16(dst, valid ? static_cast<const void*>(src) : any_global, valid ? 16 : 0);
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
               row < rows_valid, p.vector_loads, p.q);
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
    load_chunk(&s.k[stage][row][chunk * kChunk], src, inner, valid, p.vector_loads, p.k_pe);
  }
  constexpr int kVChunks = kHeadDimV / kChunk;  // 16
  for (int c = threadIdx.x; c < kBlockN * kVChunks; c += kThreads) {
    const int row = c / kVChunks, col = (c % kVChunks) * kChunk;
    const int64_t key = key0 + row;
    load_chunk(&s.v[stage][row][col],
               v + key * p.v_stride[0] + head * p.v_stride[1] + col * p.v_stride[2], p.v_stride[2],
               row < keys_valid, p.vector_loads, p.v);
  }
}

// ---- Compute
// -------------------------------------------------------------------------------------

constexpr int kScoreTiles = kBlockN / 8;         // n8 tiles of S per warp: 8
constexpr int kOutTiles = kHeadDimV / 8;         // n8 tiles of O per warp: 16
constexpr float kLn2 = 0.69314718055994530942f;  // log2 LSE -> natural log

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

// Online softmax of one key tile for the thread's two rows (h = 0: row lane / 4, h = 1: +8).
// score: raw Q K^T; on return, probabilities 2^(score * scale_log2 - row_max).
// key_limit[h]: keys of the tile (counted from its first) the row sees; mask only when `masked`.
__device__ __forceinline__ void softmax_tile(float (&score)[kScoreTiles][4], float scale_log2,
                                             bool masked, const int (&key_limit)[2], int lane,
                                             float (&row_max)[2], float (&row_sum)[2],
                                             float (&out)[kOutTiles][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kScoreTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float x = score[j][2 * h + e] * scale_log2;
        if (masked && j * 8 + (lane % 4) * 2 + e >= key_limit[h]) x = -INFINITY;
        score[j][2 * h + e] = x;
        tile_max = fmaxf(tile_max, x);
      }
    }
    const float new_max = fmaxf(row_max[h], quad_max(tile_max));
    // A row that has seen only masked keys keeps max -inf; subtracting 0 then gives 2^-inf = 0.
    const float base = new_max == -INFINITY ? 0.0f : new_max;
    const float rescale = exp2f(row_max[h] - base);  // 0 on the first tile (-inf - base)
    row_max[h] = new_max;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kScoreTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float prob = exp2f(score[j][2 * h + e] - base);
        score[j][2 * h + e] = prob;
        sum += prob;
      }
    }
    row_sum[h] = row_sum[h] * rescale + sum;  // per-lane partial; the quad is summed at the end
#pragma unroll
    for (int j = 0; j < kOutTiles; ++j) {
      out[j][2 * h] *= rescale;
      out[j][2 * h + 1] *= rescale;
    }
  }
}

// ---- Epilogues
// -----------------------------------------------------------------------------------

// Rows [first, end) of the whole q that belong to no request: out 0, lse -inf. The block of
// blockIdx.z == B strides over them with the x blocks.
template <class Out>
__device__ void write_uncovered_rows(const PrefillParams& p, int head, int64_t first) {
  auto* out = static_cast<typename Out::Storage*>(p.out);
  const int64_t count = p.tokens - first;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < count * kHeadDimV;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t t = first + i / kHeadDimV, d = i % kHeadDimV;
    out[t * p.out_stride[0] + head * p.out_stride[1] + d * p.out_stride[2]] = Out::store(0.0f);
    if (d == 0 && p.lse != nullptr) p.lse[head * p.lse_stride[0] + t * p.lse_stride[1]] = -INFINITY;
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

  const int64_t q_begin = p.cu_seqlens_q[b * p.cu_seqlens_q_stride];
  if (b == p.batch) {  // the rows past the last request
    if (q_begin < 0 || q_begin > p.tokens) {
      if (threadIdx.x == 0 && blockIdx.x == 0 && head == 0) {
        raise_device_error(p.error_word, kPrefillBadSeqlens);
      }
      return;
    }
    write_uncovered_rows<Out>(p, head, q_begin);
    return;
  }
  const int64_t q_end = p.cu_seqlens_q[(b + 1) * p.cu_seqlens_q_stride];
  const int64_t k_begin = p.cu_seqlens_k[b * p.cu_seqlens_k_stride];
  const int64_t k_end = p.cu_seqlens_k[(b + 1) * p.cu_seqlens_k_stride];
  const bool valid = q_begin >= 0 && q_begin <= q_end && q_end <= p.tokens &&
                     q_end - q_begin <= p.max_seqlen_q && k_begin >= 0 && k_begin <= k_end &&
                     k_end <= p.keys && k_end - k_begin <= p.max_seqlen_k &&
                     (b > 0 || (q_begin == 0 && k_begin == 0));
  if (!valid) {
    if (threadIdx.x == 0 && blockIdx.x == 0 && head == 0) {
      raise_device_error(p.error_word, kPrefillBadSeqlens);
    }
    return;
  }
  const int sq = static_cast<int>(q_end - q_begin), sk = static_cast<int>(k_end - k_begin);
  // First query row of the block within the request. Reversed: the blocks launched first hold
  // the last rows, which see the most keys under the causal mask (shorter tail of the grid).
  const int row0 = (gridDim.x - 1 - blockIdx.x) * kBlockM;
  if (row0 >= sq) return;
  const int rows_valid = min(kBlockM, sq - row0);
  // Query row i sees keys [0, i + 1 + sk - sq) (causal, bottom-right) or [0, sk).
  const int diagonal = sk - sq + 1;  // key limit of row 0
  const int block_keys =
      p.causal ? max(0, min(sk, row0 + rows_valid - 1 + diagonal)) : sk;  // the last row's limit
  const int first_row_keys = p.causal ? min(sk, row0 + diagonal) : sk;    // may be negative
  const int key_tiles = (block_keys + kBlockN - 1) / kBlockN;

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
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
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
    const bool masked = key0 + kBlockN > first_row_keys;
    int key_limit[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row + 8 * h;
      key_limit[h] = (p.causal ? min(sk, row + diagonal) : sk) - key0;
    }
    softmax_tile(score, p.scale_log2, masked, key_limit, lane, row_max, row_sum, out);
    accumulate_pv<In>(s, stage, lane, score, out);
    __syncthreads();  // the next iteration's copy overwrites this stage
  }
  cp_async_wait<0>();

  // Epilogue: normalize, convert to out's dtype, write with out's strides; LSE in natural log.
  auto* out_ptr = static_cast<typename Out::Storage*>(p.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = warp_row + 8 * h;
    const float sum = quad_sum(row_sum[h]);
    if (row >= sq) continue;
    const int64_t token = q_begin + row;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    typename Out::Storage* dst = out_ptr + token * p.out_stride[0] + head * p.out_stride[1];
#pragma unroll
    for (int j = 0; j < kOutTiles; ++j) {
      const int col = j * 8 + (lane % 4) * 2;
      dst[col * p.out_stride[2]] = Out::store(out[j][2 * h] * inv);
      dst[(col + 1) * p.out_stride[2]] = Out::store(out[j][2 * h + 1] * inv);
    }
    if (p.lse != nullptr && lane % 4 == 0) {
      p.lse[head * p.lse_stride[0] + token * p.lse_stride[1]] =
          sum > 0.0f ? (row_max[h] + log2f(sum)) * kLn2 : -INFINITY;
    }
  }
}

}  // namespace mlakit::cuda::prefill
