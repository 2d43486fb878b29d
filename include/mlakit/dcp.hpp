// Decode context parallelism (DCP): the placement of a request's tokens over the W ranks of a DCP
// group, and the host-side planning that follows from it (spec A.3, B.7, F-7, F-16..F-18).
// Pure host code: no device access, no communicator. DcpConfig is in config.hpp, DcpContextChunk
// in plan.hpp (make_plan plans DCP steps). docs/dcp.md tells the whole story.
//
// Placement. With interleave I, global position p of a request belongs to rank (p / I) % W: the
// positions go round the ranks in runs of I. On its rank, p is local position
//   j = (p / (W * I)) * I + p % I,
// and the rank's cache holds its local positions as an ordinary paged cache: local position j of
// request r lives in block block_table[r, j / block_size] at offset j % block_size. Every rank
// therefore runs the ordinary kernels (cache write, gather, decode) on its own cache with local
// positions and local lengths. When block_size % I == 0 this equals vLLM's "virtual block" slot
// mapping (spec F-16); any I >= 1 works here.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mlakit/plan.hpp"

namespace mlakit {

// Rank owning global position p (>= 0): (p / I) % W.
inline int64_t dcp_owner_rank(int64_t position, int64_t world_size, int64_t interleave) {
  return (position / interleave) % world_size;
}

// Position of global position p in its owner's local order: (p / (W I)) I + p % I.
inline int64_t dcp_local_position(int64_t position, int64_t world_size, int64_t interleave) {
  return position / (world_size * interleave) * interleave + position % interleave;
}

// Number of positions in [0, seq_len) owned by `rank` (spec B.7 get_dcp_local_seq_lens, with the
// F-7 fix: a full last round gives no rank an extra token). seq_len >= 0.
inline int64_t dcp_local_seq_len(int64_t seq_len, int64_t world_size, int64_t rank,
                                 int64_t interleave) {
  const int64_t round = world_size * interleave;  // positions of one full turn of all ranks
  const int64_t rest = seq_len % round;           // positions of the last, partial turn
  int64_t in_rest = rest - rank * interleave;     // those of the partial turn this rank takes
  in_rest = in_rest < 0 ? 0 : (in_rest > interleave ? interleave : in_rest);
  return seq_len / round * interleave + in_rest;
}

// Local lengths of this rank for every request: the seq_lens the local mla_decode reads.
// seq_lens: [R] global lengths (>= 0). Returns [R].
std::vector<int32_t> dcp_local_seq_lens(std::span<const int32_t> seq_lens, const DcpConfig& dcp);

// ---- B.7: the chunked context under DCP ---------------------------------------------------------
// A chunk of context is gathered in three steps (docs/dcp.md):
//   1. every rank gathers its own tokens of the chunk from its cache (rows `local`),
//   2. an all-gather of rows_per_rank rows per rank makes [W * rows_per_rank] rows on every rank
//      (rank k's rows at [k * rows_per_rank, k * rows_per_rank + its local.total_tokens), the
//      rest of its slot unused),
//   3. row t of the chunk in global token order is row gathered_row[t] of that buffer.
// DcpContextChunk (plan.hpp) holds one chunk.
//
// context_lens: [np] context tokens of each prefill request (global positions, >= 0).
// Plans the chunks of global context (ChunkPolicy as in make_plan) and this rank's share of each.
// Guarantees, beyond those of the single-rank plan (plan_context_chunks):
//   - every piece starts at a multiple of lcm(block_size, W * I) (spec F-18), so every rank's
//     share of a piece starts at the same local position, start / W;
//   - W * rows_per_rank <= workspace_tokens and global.total_tokens <= workspace_tokens: the
//     all-gathered rows and the reorganised chunk each fit a workspace of workspace_tokens rows;
//   - across the ranks' `local` gathers, every context token is gathered exactly once, and
//     gathered_row lists them in global order;
//   - a rank never gathers a position beyond its local context length (no padded reads).
// Throws mlakit::Error on a bad DcpConfig, a negative context length, or a workspace smaller than
// lcm(block_size, W * I) rows.
std::vector<DcpContextChunk> plan_dcp_context_chunks(std::span<const int32_t> context_lens,
                                                     int64_t block_size, int64_t workspace_tokens,
                                                     ChunkPolicy policy, const DcpConfig& dcp);

}  // namespace mlakit
