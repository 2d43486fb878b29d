// The online softmax and the epilogue shared by the prefill kernels. Both kernels hold S and O in
// the m16n8 accumulator layout (mma.sync m16n8k16 and wgmma m64nNk16 alike): a thread owns two
// rows (h = 0: lane / 4 of its 16-row slab, h = 1: 8 rows below) and, per n8 tile j, columns
// 8 j + 2 (lane % 4) + {0, 1}. Accessors `score(j, i)` / `out(j, i)` return the f32 of tile j,
// index i = 2 h + e (e: the column of the pair), so either register container fits.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/fast_exp2.cuh"
#include "cuda/common/pack.cuh"
#include "cuda/common/quad.cuh"
#include "cuda/prefill/params.cuh"
#include "cuda/prefill/request.cuh"
#include "cuda/prefill/traits.cuh"

namespace mlakit::cuda::prefill {

constexpr float kLn2 = 0.69314718055994530942f;  // log2 LSE -> natural log

// Running max (log2 units) and per-lane partial sum of the thread's two rows.
struct RowState {
  float max[2] = {-INFINITY, -INFINITY};
  float sum[2] = {0.0f, 0.0f};
};

// Online softmax of one key tile of kScoreTiles n8 tiles, O left alone. score: raw Q K^T; on
// return, probabilities 2^(score * scale_log2 - row max). key_limit[h]: keys of the tile (counted
// from its first) row h sees; masking only when `masked`. rescale[h]: the factor O's row h must be
// multiplied by (rescale_out) before this tile's P V is added. The maximum is taken over the raw
// scores (scale_log2 > 0: the same element as over the scaled ones) and the scale goes into the
// exponent's FMA; fast_exp2 spares exp2f's compare and two multiplies per probability (the
// probabilities are ~30 % of the prefill tile loop's instructions; docs/perf-notes.md).
template <int kScoreTiles, class ScoreAt>
__device__ __forceinline__ void softmax_scores(ScoreAt&& score, float scale_log2, bool masked,
                                               const int (&key_limit)[2], int lane, RowState& rows,
                                               float (&rescale)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kScoreTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (masked && j * 8 + (lane % 4) * 2 + e >= key_limit[h]) score(j, 2 * h + e) = -INFINITY;
        tile_max = fmaxf(tile_max, score(j, 2 * h + e));
      }
    }
    const float new_max = fmaxf(rows.max[h], quad_max(tile_max) * scale_log2);
    // A row that has seen only masked keys keeps max -inf; subtracting 0 then gives 2^-inf = 0.
    const float base = new_max == -INFINITY ? 0.0f : new_max;
    rescale[h] = fast_exp2(rows.max[h] - base);  // 0 on the first tile (-inf - base)
    rows.max[h] = new_max;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kScoreTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float prob = fast_exp2(fmaf(score(j, 2 * h + e), scale_log2, -base));
        score(j, 2 * h + e) = prob;
        sum += prob;
      }
    }
    rows.sum[h] = rows.sum[h] * rescale[h] + sum;  // per-lane partial; the quad sums at the end
  }
}

// Multiplies the kOutTiles tiles of O's rows h by rescale[h] (softmax_scores).
template <int kOutTiles, class OutAt>
__device__ __forceinline__ void rescale_out(OutAt&& out, const float (&rescale)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int j = 0; j < kOutTiles; ++j) {
      out(j, 2 * h) *= rescale[h];
      out(j, 2 * h + 1) *= rescale[h];
    }
  }
}

// softmax_scores, then O rescaled at once: for kernels whose P V of the previous tile is done.
template <int kScoreTiles, int kOutTiles, class ScoreAt, class OutAt>
__device__ __forceinline__ void softmax_tile(ScoreAt&& score, float scale_log2, bool masked,
                                             const int (&key_limit)[2], int lane, RowState& rows,
                                             OutAt&& out) {
  float rescale[2];
  softmax_scores<kScoreTiles>(score, scale_log2, masked, key_limit, lane, rows, rescale);
  rescale_out<kOutTiles>(out, rescale);
}

// Normalizes O, converts it to out's dtype and writes the thread's rows (request rows `row` and
// row + 8, skipped past sq) with out's strides; the LSE in natural log (-inf for a row with no
// keys, whose O is 0).
template <class Out, int kOutTiles, class OutAt>
__device__ __forceinline__ void store_rows(const PrefillParams& p, const Request& r, int head,
                                           int row, int lane, const RowState& rows, OutAt&& out) {
  auto* out_ptr = static_cast<typename Out::Storage*>(p.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = quad_sum(rows.sum[h]);
    if (row + 8 * h >= r.sq) continue;
    const int64_t token = r.q_begin + row + 8 * h;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    typename Out::Storage* dst = out_ptr + token * p.out_stride[0] + head * p.out_stride[1];
    if (p.out_pairs) {  // columns col, col + 1 adjacent and the pair aligned: one store
#pragma unroll
      for (int j = 0; j < kOutTiles; ++j) {
        const int col = j * 8 + (lane % 4) * 2;
        Pack<typename Out::Storage, 2> pair;
        pair.v[0] = Out::store(out(j, 2 * h) * inv);
        pair.v[1] = Out::store(out(j, 2 * h + 1) * inv);
        *reinterpret_cast<Pack<typename Out::Storage, 2>*>(dst + col) = pair;
      }
    } else {
#pragma unroll
      for (int j = 0; j < kOutTiles; ++j) {
        const int col = j * 8 + (lane % 4) * 2;
        dst[col * p.out_stride[2]] = Out::store(out(j, 2 * h) * inv);
        dst[(col + 1) * p.out_stride[2]] = Out::store(out(j, 2 * h + 1) * inv);
      }
    }
    if (p.lse != nullptr && lane % 4 == 0) {
      p.lse[head * p.lse_stride[0] + token * p.lse_stride[1]] =
          sum > 0.0f ? (rows.max[h] + log2f(sum)) * kLn2 : -INFINITY;
    }
  }
}

}  // namespace mlakit::cuda::prefill
