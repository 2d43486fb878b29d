// B.6: chunked-context planning, equal-share (vLLM) and packed (spec F-19, vLLM #50613).
#include "planner/context_chunks.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "core/check.hpp"

namespace mlakit::detail {

namespace {
constexpr const char* kOp = "plan_context_chunks";
// Workspace rows and chunk offsets are int32 (cu_seq_lens, token_to_seq).
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

int64_t round_down(int64_t x, int64_t multiple) { return x / multiple * multiple; }
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One chunk under construction: pieces are added in request order, at most one per request.
class ChunkBuilder {
 public:
  explicit ChunkBuilder(int64_t num_requests) {
    chunk_.starts.assign(num_requests, 0);  // an empty piece starts at 0: it reads nothing
    chunk_.seq_lens.assign(num_requests, 0);
  }

  bool empty() const { return chunk_.total_tokens == 0; }

  void add(int64_t request, int64_t start, int64_t len) {
    chunk_.starts[request] = static_cast<int32_t>(start);
    chunk_.seq_lens[request] = static_cast<int32_t>(len);
    chunk_.total_tokens += len;
    chunk_.max_seq_len = std::max(chunk_.max_seq_len, len);
  }

  // Fills the row offsets and the row -> request map.
  ContextChunk finish() && {
    const size_t num_requests = chunk_.seq_lens.size();
    chunk_.cu_seq_lens.assign(num_requests + 1, 0);
    chunk_.token_to_seq.resize(chunk_.total_tokens);
    for (size_t r = 0; r < num_requests; ++r) {
      const int32_t begin = chunk_.cu_seq_lens[r];
      chunk_.cu_seq_lens[r + 1] = begin + chunk_.seq_lens[r];
      std::fill_n(chunk_.token_to_seq.begin() + begin, chunk_.seq_lens[r], static_cast<int32_t>(r));
    }
    return std::move(chunk_);
  }

 private:
  ContextChunk chunk_;
};

// vLLM's rule: every request with context gets the same page-aligned share of the workspace per
// chunk, share = round_down(workspace / n_with_context, block_size); chunk i reads positions
// [i * share, (i + 1) * share) of every request. When the workspace holds less than one page per
// request (share would be 0), the requests with context are taken in groups of
// workspace / block_size, each group planned the same way on its own chunks; with enough
// workspace there is one group and the plan is exactly vLLM's.
std::vector<ContextChunk> plan_equal_share(std::span<const int32_t> context_lens,
                                           int64_t block_size, int64_t workspace_tokens) {
  const int64_t num_requests = static_cast<int64_t>(context_lens.size());
  std::vector<int64_t> with_context;
  for (int64_t r = 0; r < num_requests; ++r)
    if (context_lens[r] > 0) with_context.push_back(r);
  const int64_t n = static_cast<int64_t>(with_context.size());
  std::vector<ContextChunk> chunks;
  if (n == 0) return chunks;

  const int64_t group_size = std::min(n, workspace_tokens / block_size);        // >= 1
  const int64_t share = round_down(workspace_tokens / group_size, block_size);  // >= block_size
  for (int64_t group_begin = 0; group_begin < n; group_begin += group_size) {
    const std::span<const int64_t> group =
        std::span(with_context).subspan(group_begin, std::min(group_size, n - group_begin));
    int64_t max_context = 0;
    for (int64_t r : group) max_context = std::max<int64_t>(max_context, context_lens[r]);
    for (int64_t i = 0; i < cdiv(max_context, share); ++i) {
      ChunkBuilder chunk(num_requests);
      for (int64_t r : group) {
        const int64_t start = i * share;
        const int64_t len = std::min<int64_t>(context_lens[r] - start, share);
        if (len > 0) chunk.add(r, start, len);
      }
      chunks.push_back(std::move(chunk).finish());
    }
  }
  return chunks;
}

// Greedy packing in request order: a chunk takes whole remaining contexts while they fit; the
// first one that does not fit contributes its longest page-aligned piece and continues at the
// start of the next chunk. Every chunk but the last has fewer than block_size free rows.
std::vector<ContextChunk> plan_packed(std::span<const int32_t> context_lens, int64_t block_size,
                                      int64_t workspace_tokens) {
  const int64_t num_requests = static_cast<int64_t>(context_lens.size());
  std::vector<ContextChunk> chunks;
  ChunkBuilder chunk(num_requests);
  int64_t free_rows = workspace_tokens;
  for (int64_t r = 0; r < num_requests; ++r) {
    int64_t position = 0;  // always a multiple of block_size (or the context end)
    while (position < context_lens[r]) {
      const int64_t rest = context_lens[r] - position;
      const int64_t len = rest <= free_rows ? rest : round_down(free_rows, block_size);
      if (len == 0) {  // not even one page fits: close the chunk (a fresh one has room)
        chunks.push_back(std::move(chunk).finish());
        chunk = ChunkBuilder(num_requests);
        free_rows = workspace_tokens;
        continue;
      }
      chunk.add(r, position, len);
      position += len;
      free_rows -= len;
    }
  }
  if (!chunk.empty()) chunks.push_back(std::move(chunk).finish());
  return chunks;
}

}  // namespace

std::vector<ContextChunk> plan_context_chunks(std::span<const int32_t> context_lens,
                                              int64_t block_size, int64_t workspace_tokens,
                                              ChunkPolicy policy) {
  require(block_size > 0, ErrorCode::kInvalidArgument, kOp, ": block_size must be > 0, got ",
          block_size);
  require(workspace_tokens <= kMaxInt32, ErrorCode::kInvalidArgument, kOp,
          ": workspace_tokens must be <= ", kMaxInt32, ", got ", workspace_tokens);
  require(workspace_tokens >= block_size, ErrorCode::kInvalidArgument, kOp,
          ": workspace_tokens must hold at least one block (block_size ", block_size, "), got ",
          workspace_tokens);
  require(context_lens.size() <= size_t{kMaxInt32}, ErrorCode::kInvalidArgument, kOp, ": at most ",
          kMaxInt32, " prefill requests, got ", context_lens.size());
  for (size_t r = 0; r < context_lens.size(); ++r) {
    require(context_lens[r] >= 0, ErrorCode::kInvalidArgument, kOp, ": context_lens[", r,
            "] must be >= 0, got ", context_lens[r]);
  }
  switch (policy) {
    case ChunkPolicy::kEqualShare:
      return plan_equal_share(context_lens, block_size, workspace_tokens);
    case ChunkPolicy::kPacked:
      return plan_packed(context_lens, block_size, workspace_tokens);
  }
  fail(ErrorCode::kInvalidArgument,
       str_cat(kOp, ": unknown chunk policy ", static_cast<int>(policy)));
}

int64_t max_context_chunks(int64_t max_requests, int64_t max_context_len, int64_t block_size,
                           int64_t workspace_tokens, ChunkPolicy policy) {
  constexpr const char* kBoundOp = "max_context_chunks";
  require(
      max_requests >= 0 && max_context_len >= 0 && block_size > 0 && workspace_tokens >= block_size,
      ErrorCode::kInvalidArgument, kBoundOp,
      ": need max_requests >= 0, max_context_len >= 0, block_size > 0 and workspace_tokens >= "
      "block_size, got ",
      max_requests, ", ", max_context_len, ", ", block_size, ", ", workspace_tokens);
  if (max_requests == 0 || max_context_len == 0) return 0;
  if (policy == ChunkPolicy::kPacked) {
    // A chunk is closed only when fewer than block_size rows are free, so every closed chunk holds
    // more than workspace_tokens - block_size context tokens; one more chunk takes the rest.
    return max_requests * max_context_len / (workspace_tokens - block_size + 1) + 1;
  }
  // Equal share: n requests with context form ceil(n / group) groups of group = min(n,
  // workspace / block) requests, each group taking ceil(longest context / share) chunks. The share
  // shrinks and the group count grows with n, so n = max_requests is the worst case.
  const int64_t group = std::min(max_requests, workspace_tokens / block_size);
  const int64_t share = round_down(workspace_tokens / group, block_size);
  return cdiv(max_requests, group) * cdiv(max_context_len, share);
}

}  // namespace mlakit::detail
