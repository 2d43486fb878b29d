// Arithmetic of the CUDA decode's work plan (docs/kernels/decode_sm90.md, "Schedule"): how the
// batch's key tiles are cut into segments and dealt to the P parts of the grid, the bounds of the
// plan and the layout of the split workspace. Plain C++ with host/device qualifiers: the plan
// kernel (sm90/plan_kernel.cuh) runs it on the GPU from the device seq_lens; the host planner
// (schedule.cpp) and the op size the workspace with its bounds; the tests run it on the CPU.
//
// The cost line. Request b costs cost_b units (one unit = one 64-key tile of work): its key tiles
// plus kSegmentCostTiles per segment. Requests lie end to end, b at [start_b, start_b + cost_b)
// with start_b = cost_0 + ... + cost_{b-1}; the line has total = sum cost_b units. Part p owns the
// units [p * share, (p + 1) * share), share = ceil(total / P), so no part owns more than share.
//  - Balanced (batch_invariant false): request b's tiles sit at [start_b + F, start_b + F +
//    tiles_b) (F = kSegmentCostTiles, paid once at its start). A tile belongs to the part owning
//    its unit, so the part boundaries cut the batch's tiles into near-equal shares across request
//    boundaries: a segment is a maximal run of one request's tiles within one part. A request with
//    no tile (seq_len 0, or a bad seq_len) has one empty segment, in the part owning start_b + F -
//    1, which writes its rows (0 / -inf, or NaN).
//  - Batch-invariant: request b is first cut into invariant_piece_count(tiles_b) pieces of
//    invariant_piece_tiles(tiles_b) tiles, which depend on its own length only; piece k costs F +
//    its tiles, and belongs whole to the part owning its middle unit. Parts therefore only decide
//    which CTA computes a piece, never where a piece starts or ends.
//  - Whole requests (balanced mode, when cutting does not pay): every request is one segment and
//    parts take consecutive requests, floor or ceil(B / P) each. Cutting costs more than the
//    segments' fixed costs the cost line counts (partial rows written and read back, and the
//    combine launch), so when the longest request times ceil(B / P) is within that of the balanced
//    share (uniform lengths with B >= P, say) the plan keeps requests whole: no partial, no
//    combine, the schedule an equal-length batch wants.
// Segments are numbered request by request, piece by piece; their parts never decrease, so part
// p's segments are one range. A request with more than one segment writes one partial result per
// segment, into consecutive partial slots, and the combine merges them in segment order.
#pragma once

#include <cstdint>

#include "cuda/decode/tile_shape.hpp"

#if defined(__CUDACC__)
#define MLAKIT_HOST_DEVICE __host__ __device__
#else
#define MLAKIT_HOST_DEVICE
#endif

namespace mlakit::cuda {

// Fixed cost of one segment, in key tiles of work: loading the request's q rows (a 64-row q tile
// is as large as a key tile), filling the copy pipeline before the first MMA, and writing the rows
// (a 64-row partial is 128 KiB). Together about two tiles' time for both row configurations.
inline constexpr int64_t kSegmentCostTiles = 2;
// Batch-invariant pieces aim at 16 tiles (1024 keys, the CPU planner's batch-invariant length): a
// piece's fixed cost stays 1/8 of its work, and the partial rows it writes (s_q * N * 2052 bytes:
// 33 KiB at 16 rows) stay 3 % of the 1.15 MB of bf16 keys it reads.
inline constexpr int64_t kInvariantPieceTiles = 16;
// Most segments of one request: the combine reads one partial LSE per thread of its 256, and 256
// parts already spread one request over every SM of a GPU.
inline constexpr int64_t kMaxRequestSegments = 256;
// Most parts per row tile: P - 1 part boundaries cut one request into at most P segments.
inline constexpr int64_t kMaxDecodeParts = kMaxRequestSegments;

MLAKIT_HOST_DEVICE constexpr int64_t ceil_div_i64(int64_t a, int64_t b) { return (a + b - 1) / b; }
MLAKIT_HOST_DEVICE constexpr int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
MLAKIT_HOST_DEVICE constexpr int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }

// The seq_len the kernels use: a value outside [0, max_seq_len] is a bad index, planned as empty
// (the decode turns its rows into NaN and reports it).
MLAKIT_HOST_DEVICE constexpr bool seq_len_is_valid(int64_t seq_len, int64_t max_seq_len) {
  return seq_len >= 0 && seq_len <= max_seq_len;
}
MLAKIT_HOST_DEVICE constexpr int64_t key_tiles(int64_t seq_len) {
  return ceil_div_i64(seq_len, kDecodeKeyTile);
}

// ---- batch-invariant pieces: ceil(tiles / 16) pieces (at most kMaxRequestSegments, at least 1)
// of equal whole tiles, the last one possibly shorter; a request without tiles is one empty piece.
MLAKIT_HOST_DEVICE constexpr int64_t invariant_piece_target(int64_t tiles) {
  return min_i64(kMaxRequestSegments, max_i64(1, ceil_div_i64(tiles, kInvariantPieceTiles)));
}
MLAKIT_HOST_DEVICE constexpr int64_t invariant_piece_tiles(int64_t tiles) {
  return max_i64(1, ceil_div_i64(tiles, invariant_piece_target(tiles)));
}
MLAKIT_HOST_DEVICE constexpr int64_t invariant_piece_count(int64_t tiles) {
  return tiles == 0 ? 1 : ceil_div_i64(tiles, invariant_piece_tiles(tiles));
}

// Units of the cost line a request with `tiles` key tiles takes.
MLAKIT_HOST_DEVICE constexpr int64_t request_cost(bool batch_invariant, int64_t tiles) {
  return tiles + kSegmentCostTiles * (batch_invariant ? invariant_piece_count(tiles) : 1);
}

// Units per part: ceil(total / parts), at least 1. Every unit u < total lies in part u / share <
// parts.
MLAKIT_HOST_DEVICE constexpr int64_t part_share(int64_t total_cost, int64_t parts) {
  return max_i64(1, ceil_div_i64(total_cost, parts));
}

// Cost of merging the requests a balanced plan cuts, in key tiles of work, besides the segments'
// fixed costs: the combine's launch and tail (about two tiles' time), plus per 16 query rows of a
// request one tile (a cut request writes and re-reads 2052 bytes per row and segment with an f32
// out; 16 rows of two segments move about half a 64-key bf16 tile, at the time a tile's share of
// bandwidth takes). A 16-bit out's partials take 1028 bytes (sm90/params.cuh, partial_dtype); the
// plan keeps the f32 figure, so it is independent of the output dtype.
inline constexpr int64_t kCombineCostTiles = 2;
inline constexpr int64_t kPartialRowsPerTile = 16;

// Whether a balanced plan keeps every request whole (see the header): its makespan, ceil(B / P)
// requests of at most max_cost units per part, is within the cost of merging of the cut plan's
// share. rows: query rows per request (s_q * N).
MLAKIT_HOST_DEVICE constexpr bool whole_requests(bool batch_invariant, int64_t batch, int64_t parts,
                                                 int64_t total_cost, int64_t max_cost,
                                                 int64_t rows) {
  if (batch_invariant || batch == 0) return false;
  return max_cost * ceil_div_i64(batch, parts) <= part_share(total_cost, parts) +
                                                      kCombineCostTiles +
                                                      ceil_div_i64(rows, kPartialRowsPerTile);
}
// The part of request b in a whole-request plan: consecutive requests, floor or ceil(B / P) each.
MLAKIT_HOST_DEVICE constexpr int64_t whole_request_part(int64_t b, int64_t batch, int64_t parts) {
  return batch <= parts ? b : b * parts / batch;
}

// Segments of a request with `tiles` key tiles that starts at unit `start`.
MLAKIT_HOST_DEVICE constexpr int64_t request_segment_count(bool batch_invariant, int64_t start,
                                                           int64_t tiles, int64_t share) {
  if (batch_invariant) return invariant_piece_count(tiles);
  if (tiles == 0) return 1;
  const int64_t first_tile_unit = start + kSegmentCostTiles;
  return (first_tile_unit + tiles - 1) / share - first_tile_unit / share + 1;
}

struct SegmentRange {
  int64_t part;        // the part that computes it
  int64_t tile_begin;  // key tiles [tile_begin, tile_end) of the request
  int64_t tile_end;
};

// Balanced mode: the part holding the first tile of a request with tiles that starts at unit
// `start`; segment k of the request is in part first_tile_part + k.
MLAKIT_HOST_DEVICE constexpr int64_t first_tile_part(int64_t start, int64_t share) {
  return (start + kSegmentCostTiles) / share;
}
// Balanced mode: segment k of a request with tiles > 0 whose first tile is in part `first_part`
// (first_tile_part): multiplications only, so a loop over a request's segments divides once.
MLAKIT_HOST_DEVICE constexpr SegmentRange balanced_segment(int64_t start, int64_t tiles,
                                                           int64_t share, int64_t first_part,
                                                           int64_t k) {
  const int64_t first_tile_unit = start + kSegmentCostTiles;
  const int64_t part = first_part + k;
  return {part, max_i64(0, part * share - first_tile_unit),
          min_i64(tiles, (part + 1) * share - first_tile_unit)};
}

// Segment k (< request_segment_count) of that request.
MLAKIT_HOST_DEVICE constexpr SegmentRange request_segment(bool batch_invariant, int64_t start,
                                                          int64_t tiles, int64_t share, int64_t k) {
  if (batch_invariant) {
    const int64_t each = invariant_piece_tiles(tiles);
    const int64_t begin = min_i64(k * each, tiles), end = min_i64(begin + each, tiles);
    const int64_t piece_start = start + k * (kSegmentCostTiles + each);
    const int64_t middle = piece_start + (kSegmentCostTiles + end - begin - 1) / 2;
    return {middle / share, begin, end};
  }
  if (tiles == 0) return {(start + kSegmentCostTiles - 1) / share, 0, 0};
  return balanced_segment(start, tiles, share, first_tile_part(start, share), k);
}

// ---- bounds of a plan, from the shape only ----------------------------------------------------

struct WorkPlanBounds {
  int64_t max_segments;        // segments of the whole batch
  int64_t max_split_requests;  // requests with more than one segment
  int64_t max_partials;        // partial slots: the segments of those requests
};

// Balanced: each of the P - 1 inner part boundaries cuts at most one request once, so there are at
// most B + P - 1 segments; a request cut c > 0 times has c + 1 <= 2c segments, so the partials
// number at most (P - 1) + min(B, P - 1) <= 2 (P - 1). Batch-invariant: a request of at most
// max_seq_len keys has at most n = invariant_piece_target(tiles of max_seq_len) pieces.
constexpr WorkPlanBounds work_plan_bounds(int64_t batch, int64_t parts, bool batch_invariant,
                                          int64_t max_seq_len) {
  if (batch == 0) return {0, 0, 0};
  if (batch_invariant) {
    const int64_t n = invariant_piece_target(key_tiles(max_seq_len));
    return {batch * n, n > 1 ? batch : 0, n > 1 ? batch * n : 0};
  }
  const int64_t cuts = parts - 1;
  return {batch + cuts, min_i64(batch, cuts), cuts + min_i64(batch, cuts)};
}

// ---- the plan as the kernels read it ----------------------------------------------------------

// One segment: keys [key_begin, key_end) of `request`. slot < 0: the request's only segment, which
// writes out and lse; else the partial slot its rows go to.
struct SegmentRecord {
  int32_t request, key_begin, key_end, slot;
};
// A request with more than one segment: its partials are slots [first_slot, first_slot +
// num_segments), in key order.
struct SplitRecord {
  int32_t request, first_slot, num_segments, unused;
};
static_assert(sizeof(SegmentRecord) == 16 && sizeof(SplitRecord) == 16, "16-byte records");

// Counts the plan kernel writes at the start of the workspace (int32 each).
enum WorkPlanHeader : int32_t {
  kHeaderSegments = 0,
  kHeaderSplitRequests = 1,
  kHeaderPartials = 2,
  kHeaderWords = 4,  // one 16-byte row
};

// The split workspace (f32 elements, 16-byte aligned), in 4-byte words from its start; every
// region starts on a 16-byte boundary.
struct WorkspaceLayout {
  int64_t part_begin;  // int32 [parts + 1]: part p's segments are [part_begin[p], part_begin[p+1])
  int64_t segments;    // SegmentRecord [max_segments]
  int64_t segment_part;  // int32 [max_segments]: the part of each segment (the plan kernel's)
  int64_t splits;        // SplitRecord [max_split_requests]
  int64_t partial_lse;   // f32 [max_partials, rows]
  int64_t partial_out;   // [max_partials, rows, value_dim] normalized rows in f32 words (sm90:
                         // out's dtype, params.cuh's partial_dtype)
  int64_t total;         // words in all
};

constexpr int64_t round_up_words(int64_t words) { return ceil_div_i64(words, 4) * 4; }

constexpr WorkspaceLayout workspace_layout(int64_t parts, const WorkPlanBounds& bounds,
                                           int64_t rows, int64_t value_dim) {
  WorkspaceLayout l{};
  l.part_begin = kHeaderWords;
  l.segments = l.part_begin + round_up_words(parts + 1);
  l.segment_part = l.segments + 4 * bounds.max_segments;
  l.splits = l.segment_part + round_up_words(bounds.max_segments);
  l.partial_lse = l.splits + 4 * bounds.max_split_requests;
  l.partial_out = l.partial_lse + round_up_words(bounds.max_partials * rows);
  l.total = l.partial_out + bounds.max_partials * rows * value_dim;
  return l;
}

}  // namespace mlakit::cuda
