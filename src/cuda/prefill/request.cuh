// What every prefill kernel does before its tiles: find the block's request from the device
// cu_seqlens (validated here: the host cannot see them), or write the rows past the last request.
#pragma once

#include <cstdint>

#include "cuda/common/device_errors.cuh"
#include "cuda/prefill/params.cuh"
#include "cuda/prefill/traits.cuh"

namespace mlakit::cuda::prefill {

// One request's rows of q and keys of k / v.
struct Request {
  int64_t q_begin;  // first token row in q
  int64_t k_begin;  // first key row in k_nope / k_pe / v
  int sq;           // query rows
  int sk;           // keys
};

// Rows [first, tokens) of q that belong to no request: out 0, lse -inf. The blocks of
// blockIdx.z == B stride over them with the x blocks.
template <class Out>
__device__ void write_uncovered_rows(const PrefillParams& p, int head, int64_t first) {
  auto* out = static_cast<typename Out::Storage*>(p.out);
  const int64_t count = p.tokens - first;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count * kHeadDimV;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = first + i / kHeadDimV, d = i % kHeadDimV;
    out[t * p.out_stride[0] + head * p.out_stride[1] + d * p.out_stride[2]] = Out::store(0.0f);
    if (d == 0 && p.lse != nullptr) p.lse[head * p.lse_stride[0] + t * p.lse_stride[1]] = -INFINITY;
  }
}

// Block (x, heads [head, head + heads), b): true with `r` filled when b is a request; false when
// the block has no tiles to compute: it wrote its heads' uncovered rows (b == B) or found invalid
// cu_seqlens (error word raised by one block, nothing read or written).
template <class Out>
__device__ bool resolve_request(const PrefillParams& p, int head, int heads, int b, Request& r) {
  const int64_t q_begin = p.cu_seqlens_q[b * p.cu_seqlens_q_stride];
  const bool reporter = threadIdx.x == 0 && blockIdx.x == 0 && head == 0;
  if (b == p.batch) {  // the rows past the last request
    if (q_begin < 0 || q_begin > p.tokens) {
      if (reporter) raise_device_error(p.error_word, kPrefillBadSeqlens);
      return false;
    }
    for (int h = head; h < head + heads; ++h) write_uncovered_rows<Out>(p, h, q_begin);
    return false;
  }
  const int64_t q_end = p.cu_seqlens_q[(b + 1) * p.cu_seqlens_q_stride];
  const int64_t k_begin = p.cu_seqlens_k[b * p.cu_seqlens_k_stride];
  const int64_t k_end = p.cu_seqlens_k[(b + 1) * p.cu_seqlens_k_stride];
  const bool valid = q_begin >= 0 && q_begin <= q_end && q_end <= p.tokens &&
                     q_end - q_begin <= p.max_seqlen_q && k_begin >= 0 && k_begin <= k_end &&
                     k_end <= p.keys && k_end - k_begin <= p.max_seqlen_k &&
                     (b > 0 || (q_begin == 0 && k_begin == 0));
  if (!valid) {
    if (reporter) raise_device_error(p.error_word, kPrefillBadSeqlens);
    return false;
  }
  r.q_begin = q_begin;
  r.k_begin = k_begin;
  r.sq = static_cast<int>(q_end - q_begin);
  r.sk = static_cast<int>(k_end - k_begin);
  return true;
}

// The key range a block of rows [row0, row0 + rows_valid) of request r needs (bottom-right causal:
// query row i sees keys [0, i + 1 + sk - sq), else [0, sk)).
struct KeyRange {
  int diagonal;        // key limit of row 0: sk - sq + 1 (may be <= 0)
  int block_keys;      // keys the block's last row sees: every tile below this is computed
  int first_row_keys;  // keys the block's first row sees (may be negative): tiles past it mask
};

__device__ __forceinline__ KeyRange key_range(const Request& r, bool causal, int row0,
                                              int rows_valid) {
  KeyRange k;
  k.diagonal = r.sk - r.sq + 1;
  k.block_keys = causal ? max(0, min(r.sk, row0 + rows_valid - 1 + k.diagonal)) : r.sk;
  k.first_row_keys = causal ? min(r.sk, row0 + k.diagonal) : r.sk;
  return k;
}

// Keys of the tile starting at key0 that query row `row` sees (counted from key0).
__device__ __forceinline__ int row_key_limit(const Request& r, const KeyRange& k, bool causal,
                                             int row, int key0) {
  return (causal ? min(r.sk, row + k.diagonal) : r.sk) - key0;
}

}  // namespace mlakit::cuda::prefill
