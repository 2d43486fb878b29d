// The DCP context-chunk gather (spec B.7; docs/dcp.md "Prefill context"): one chunk of a
// plan_dcp_context_chunks plan, from this rank's cache to every rank's workspace in global token
// order:
//   1. cp_gather_cache of this rank's share (raw entries, local positions) into its slice of the
//      exchange buffer,
//   2. an in-place all-gather of the W slices,
//   3. gather_rows_and_maybe_dequant of the rows in global token order into dst.
// Entries travel in the cache's storage format (fp8 caches move 1 byte a value) and are
// dequantized only in step 3. The orchestrator then runs the chunk's attention on dst with the
// chunk's global cu_seq_lens / max_seq_len, exactly as without DCP.
#pragma once

#include <cstdint>

#include "mlakit/config.hpp"
#include "mlakit/dist.hpp"
#include "mlakit/types.hpp"

namespace mlakit::dist {

// One chunk's plan arrays (DcpContextChunk) on the cache's device.
struct DcpChunkIndex {
  TensorView local_cu_seq_lens;  // i32 [np + 1]: local.cu_seq_lens
  TensorView local_starts;       // i32 [np]: local.starts
  TensorView gathered_row;       // i32 [global.total_tokens]: gathered_row
  int64_t rows_per_rank = 0;     // rows_per_rank
};

// kv_cache:    [num_blocks, block_size, entry_width]  this rank's cache
// block_table: i32 [np, max_blocks]  this rank's table rows of the prefill requests
// exchange:    [>= W * rows_per_rank, entry_width]  kv_cache's dtype, contiguous (scratch)
// dst:         [>= global.total_tokens, L + R]  f32/f16/bf16, last dim contiguous
void dcp_gather_context_chunk(Communicator& comm, const TensorView& kv_cache,
                              const TensorView& block_table, const DcpChunkIndex& chunk,
                              const TensorView& exchange, const TensorView& dst,
                              KvCacheDType kv_dtype, float k_scale, Stream stream = {});

}  // namespace mlakit::dist
