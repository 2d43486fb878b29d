// B.7 with F-18 fixed: the chunked context under DCP. The global chunks are planned on contexts
// padded to whole turns of the ranks (multiples of W * I) with pieces aligned to
// lcm(block_size, W * I); each padded piece is then clipped to the real context. Because every
// piece starts at a multiple of W * I, rank k's share of a piece starts at local position
// start / W on every rank, and because padded pieces are whole turns, a rank's share is at most
// len / W rows: the all-gather of every rank's share fits the workspace (docs/dcp.md).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "mlakit/dcp.hpp"
#include "planner/context_chunks.hpp"

namespace mlakit {

namespace {

constexpr const char* kOp = "plan_dcp_context_chunks";
// Row offsets and positions are int32 (cu_seq_lens, token_to_seq, seq_starts).
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

using detail::require;

int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// A chunk from its per-request starts and lengths: row offsets, the row -> request map, totals.
ContextChunk make_chunk(std::vector<int32_t> starts, std::vector<int32_t> seq_lens) {
  ContextChunk chunk;
  chunk.cu_seq_lens.assign(seq_lens.size() + 1, 0);
  for (size_t r = 0; r < seq_lens.size(); ++r) {
    chunk.cu_seq_lens[r + 1] = chunk.cu_seq_lens[r] + seq_lens[r];
    chunk.max_seq_len = std::max<int64_t>(chunk.max_seq_len, seq_lens[r]);
  }
  chunk.total_tokens = chunk.cu_seq_lens.back();
  chunk.token_to_seq.resize(chunk.total_tokens);
  for (size_t r = 0; r < seq_lens.size(); ++r) {
    std::fill_n(chunk.token_to_seq.begin() + chunk.cu_seq_lens[r], seq_lens[r],
                static_cast<int32_t>(r));
  }
  chunk.starts = std::move(starts);
  chunk.seq_lens = std::move(seq_lens);
  return chunk;
}

// Rank k's share of the global chunk: request r's positions [start, start + len) with start a
// multiple of W * I are local positions [start / W, local_len(start + len)).
ContextChunk local_share(const ContextChunk& global, int64_t world_size, int64_t rank,
                         int64_t interleave) {
  const size_t num_requests = global.seq_lens.size();
  std::vector<int32_t> starts(num_requests, 0), lens(num_requests, 0);
  for (size_t r = 0; r < num_requests; ++r) {
    if (global.seq_lens[r] == 0) continue;  // an empty piece starts at 0: it reads nothing
    const int64_t start = global.starts[r];
    const int64_t end = start + global.seq_lens[r];
    starts[r] = static_cast<int32_t>(start / world_size);
    lens[r] = static_cast<int32_t>(dcp_local_seq_len(end, world_size, rank, interleave) -
                                   start / world_size);
  }
  return make_chunk(std::move(starts), std::move(lens));
}

DcpContextChunk dcp_chunk(const ContextChunk& padded, std::span<const int32_t> context_lens,
                          const DcpConfig& dcp) {
  const int64_t w = dcp.world_size, interleave = dcp.interleave;
  const size_t num_requests = context_lens.size();
  std::vector<int32_t> starts(num_requests, 0), lens(num_requests, 0);
  for (size_t r = 0; r < num_requests; ++r) {
    if (padded.seq_lens[r] == 0) continue;
    // A padded piece starts below the real context end (the padding is less than one turn and
    // pieces start at multiples of a turn), so its clipped part is never empty.
    starts[r] = padded.starts[r];
    lens[r] = std::min(padded.starts[r] + padded.seq_lens[r], context_lens[r]) - padded.starts[r];
  }
  DcpContextChunk chunk;
  chunk.global = make_chunk(std::move(starts), std::move(lens));

  std::vector<ContextChunk> shares;
  for (int64_t k = 0; k < w; ++k) {
    shares.push_back(local_share(chunk.global, w, k, interleave));
    chunk.rows_per_rank = std::max(chunk.rows_per_rank, shares.back().total_tokens);
    chunk.rank_cu_seq_lens.insert(chunk.rank_cu_seq_lens.end(), shares.back().cu_seq_lens.begin(),
                                  shares.back().cu_seq_lens.end());
  }
  chunk.gathered_row.resize(chunk.global.total_tokens);
  for (size_t r = 0; r < num_requests; ++r) {
    const int64_t start = chunk.global.starts[r];
    const int64_t row0 = chunk.global.cu_seq_lens[r];
    for (int64_t i = 0; i < chunk.global.seq_lens[r]; ++i) {
      const int64_t position = start + i;
      const int64_t owner = dcp_owner_rank(position, w, interleave);
      const int64_t local_offset = dcp_local_position(position, w, interleave) - start / w;
      chunk.gathered_row[row0 + i] = static_cast<int32_t>(
          owner * chunk.rows_per_rank + shares[owner].cu_seq_lens[r] + local_offset);
    }
  }
  chunk.local = std::move(shares[dcp.rank]);
  return chunk;
}

}  // namespace

std::vector<DcpContextChunk> plan_dcp_context_chunks(std::span<const int32_t> context_lens,
                                                     int64_t block_size, int64_t workspace_tokens,
                                                     ChunkPolicy policy, const DcpConfig& dcp) {
  dcp.validate();
  require(block_size > 0, ErrorCode::kInvalidArgument, kOp, ": block_size must be > 0, got ",
          block_size);
  require(workspace_tokens <= kMaxInt32, ErrorCode::kInvalidArgument, kOp,
          ": workspace_tokens must be <= ", kMaxInt32, ", got ", workspace_tokens);
  const int64_t turn = dcp.world_size * dcp.interleave;  // positions of one turn of all ranks
  require(turn <= kMaxInt32, ErrorCode::kInvalidArgument, kOp,
          ": world_size * interleave must be <= ", kMaxInt32, ", got ", turn);
  const int64_t alignment = std::lcm(block_size, turn);
  require(workspace_tokens >= alignment, ErrorCode::kInvalidArgument, kOp,
          ": workspace_tokens must hold at least lcm(block_size, world_size * interleave) = ",
          alignment, " rows (block_size ", block_size, ", world_size ", dcp.world_size,
          ", interleave ", dcp.interleave, "), got ", workspace_tokens);

  std::vector<int32_t> padded(context_lens.size());
  for (size_t r = 0; r < context_lens.size(); ++r) {
    require(context_lens[r] >= 0, ErrorCode::kInvalidArgument, kOp, ": context_lens[", r,
            "] must be >= 0, got ", context_lens[r]);
    const int64_t whole_turns = round_up(context_lens[r], turn);
    require(whole_turns <= kMaxInt32, ErrorCode::kInvalidArgument, kOp, ": context_lens[", r,
            "] = ", context_lens[r], " rounded up to whole turns of ", turn, " positions exceeds ",
            kMaxInt32);
    padded[r] = static_cast<int32_t>(whole_turns);
  }
  std::vector<DcpContextChunk> chunks;
  for (const ContextChunk& piece :
       detail::plan_context_chunks(padded, alignment, workspace_tokens, policy)) {
    chunks.push_back(dcp_chunk(piece, context_lens, dcp));
  }
  return chunks;
}

}  // namespace mlakit
