// The DCP decode building block (spec A.6, A.9, F-13; docs/dcp.md "Decode"): what a rank runs
// around its local absorbed decode. With W ranks of N query heads each (H = W N):
//
//   dcp_gather_queries   q of this rank's N heads  -> q of all H heads (all-gather over heads)
//   ops::mla_decode      all H heads over this rank's keys (local cache, local seq_lens)
//                        -> partial out [T, H, L] and lse [T, H]
//   dcp_combine_heads    all-gather of the LSEs, LSE correction of this rank's partial,
//                        reduce-scatter (sum) -> the combined result of this rank's N heads
//
// T = B decode tokens, one query per request (decode_threshold 1: a local cache cannot apply the
// causal mask of several queries, see docs/dcp.md). Nothing here allocates or synchronizes the
// host on the GPU path; every buffer is the caller's (sizes from dcp_decode_buffers).
#pragma once

#include <cstdint>
#include <optional>

#include "mlakit/dist.hpp"
#include "mlakit/types.hpp"

namespace mlakit::dist {

struct DcpDecodeShape {
  int64_t num_tokens = 0;      // T: decode tokens of the step
  int64_t num_heads = 0;       // N: query heads of this rank
  int64_t entry_dim = 576;     // L + R: width of a query (and a cache entry)
  int64_t kv_lora_rank = 512;  // L: width of a latent output
};

// Elements of each scratch buffer of one call pair, for a group of `world_size` ranks.
struct DcpDecodeBuffers {
  int64_t gathered_queries = 0;  // [W, T, N, L + R] activation dtype
  int64_t gathered_lse = 0;      // f32 [W, T, W N]
  int64_t corrected = 0;         // [W, T, N, L] exchange dtype
};
DcpDecodeBuffers dcp_decode_buffers(const DcpDecodeShape& shape, int64_t world_size);

// q_local:          [T, N, L + R]  activation dtype (f32/f16/bf16), contiguous
// gathered_queries: [W, T, N, L + R]  q_local's dtype, contiguous (scratch)
// q_all:            [T, W N, L + R]  contiguous: q_local's dtype, or fp8 (kFp8E4m3 / kU8) for an
//                   fp8 cache, then quantized with fp8_q_scale as scaled_fp8_quant does.
//                   Head k N + n is head n of rank k. mla_decode reads it as [T, 1, W N, L + R].
void dcp_gather_queries(Communicator& comm, const TensorView& q_local,
                        const TensorView& gathered_queries, const TensorView& q_all,
                        std::optional<float> fp8_q_scale = std::nullopt, Stream stream = {});

// partial_out:           [T, W N, L]  f32/f16/bf16 (mla_decode's out over the local keys)
// partial_lse:           f32 [T, W N] (mla_decode's lse_tokens_heads), contiguous
// gathered_lse:          f32 [W, T, W N], contiguous (scratch)
// corrected:             [W, T, N, L]  exchange dtype (f32, f16 or bf16), contiguous (scratch)
// out:                   [T, N, L]  exchange dtype, contiguous: this rank's heads, combined over
//                        the keys of all ranks (0 for a request without keys)
// The exchange dtype is the caller's choice: f32 sums the ranks as dcp_lse_combine does (to f32
// rounding); the activation dtype halves the reduce-scatter bytes but rounds every rank's share.
void dcp_combine_heads(Communicator& comm, const TensorView& partial_out,
                       const TensorView& partial_lse, const TensorView& gathered_lse,
                       const TensorView& corrected, const TensorView& out, Stream stream = {});

}  // namespace mlakit::dist
