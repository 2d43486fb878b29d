// plan_decode_splits: the split-KV schedule of the absorbed MQA decode (plan.hpp).
//
// The whole batch's keys are cut into about kPiecesPerWorker * num_workers pieces of one common
// length (rounded up to whole blocks, never below kMinSplitTokens), then every request's length is
// re-divided into equal whole-block pieces so that its last piece is not a sliver. Long requests
// get many splits, short ones one; a batch with many requests gets one split per request.
// Batch-invariant schedules derive each request's piece length from its own length only, so that
// its splits do not depend on the rest of the batch.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>

#include "core/check.hpp"
#include "mlakit/plan.hpp"

namespace mlakit {

using detail::require;

namespace {

// Pieces per worker: with dynamic scheduling, 4 pieces per worker keep the last-finishing worker
// within ~1/4 piece of the others when pieces differ in length (requests of unequal seq_len).
constexpr int64_t kPiecesPerWorker = 4;
// Shortest piece worth a split (tokens): a split costs one pass over its queries (s_q * N rows of
// 576 values) plus a partial result of s_q * N * 513 floats; 64 keys of work amortize that to a few
// percent, and 64 is the CPU kernel's key tile, so a shorter piece would leave its tile part empty.
constexpr int64_t kMinSplitTokens = 64;
// Piece length of batch-invariant schedules: long enough that a split's fixed cost (one pass over
// the queries, one partial row) stays a few percent of its 1024 keys, short enough that a 4096-key
// request still spreads over 4 workers.
constexpr int64_t kBatchInvariantSplitTokens = 1024;
// Most splits of one request in a batch-invariant schedule (longer requests get longer pieces):
// bounds the partial results, and so the workspace, at 16 per request.
constexpr int64_t kBatchInvariantMaxSplits = 16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t multiple) { return ceil_div(a, multiple) * multiple; }

}  // namespace

DecodeSchedule plan_decode_splits(std::span<const int32_t> seq_lens, int64_t block_size,
                                  int64_t num_workers, bool batch_invariant) {
  constexpr const char* kOp = "plan_decode_splits";
  // A worker count beyond 2^20 is no machine; it bounds the piece count so no product overflows.
  constexpr int64_t kMaxWorkers = int64_t{1} << 20;
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  require(block_size > 0 && block_size <= kInt32Max, ErrorCode::kInvalidArgument, kOp,
          ": block_size must be in [1, 2^31 - 1], got ", block_size);
  require(num_workers > 0 && num_workers <= kMaxWorkers, ErrorCode::kInvalidArgument, kOp,
          ": num_workers must be in [1, ", kMaxWorkers, "], got ", num_workers);
  const int64_t batch = static_cast<int64_t>(seq_lens.size());
  require(batch < kInt32Max, ErrorCode::kInvalidArgument, kOp, ": too many requests (", batch, ")");
  int64_t total_tokens = 0;
  for (int64_t b = 0; b < batch; ++b) {
    require(seq_lens[b] >= 0, ErrorCode::kInvalidArgument, kOp, ": seq_lens[", b,
            "] must be >= 0, got ", seq_lens[b]);
    total_tokens += seq_lens[b];
  }

  const int64_t target_pieces = kPiecesPerWorker * num_workers;
  const int64_t shared_piece_len = round_up(
      std::max({ceil_div(total_tokens, target_pieces), kMinSplitTokens, int64_t{1}}), block_size);
  // Piece length for a request of `len` keys: one for the whole batch, or (batch-invariant) a
  // function of len alone.
  auto piece_len_of = [&](int64_t len) {
    if (!batch_invariant) return shared_piece_len;
    return round_up(std::max(kBatchInvariantSplitTokens, ceil_div(len, kBatchInvariantMaxSplits)),
                    block_size);
  };

  DecodeSchedule schedule;
  schedule.split_offsets.assign(batch + 1, 0);
  schedule.split_len.assign(batch, 0);
  int64_t total = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = seq_lens[b];
    int64_t splits = 0;
    const int64_t piece_len = piece_len_of(len);
    int64_t split_len = piece_len;
    if (len > 0) {
      // Re-divide into equal whole-block pieces: ceil(len / piece_len) pieces of at most
      // piece_len tokens each, the same count but balanced lengths.
      const int64_t pieces = ceil_div(len, piece_len);
      split_len = round_up(ceil_div(len, pieces), block_size);
      splits = ceil_div(len, split_len);
    }
    total += splits;
    require(total <= kInt32Max, ErrorCode::kInvalidArgument, kOp,
            ": the schedule would need more than 2^31 - 1 splits");
    require(split_len <= kInt32Max, ErrorCode::kInvalidArgument, kOp, ": split length ", split_len,
            " does not fit in int32 (block_size ", block_size, ")");
    schedule.split_len[b] = static_cast<int32_t>(split_len);
    schedule.split_offsets[b + 1] = static_cast<int32_t>(total);
    schedule.max_splits = std::max(schedule.max_splits, splits);
  }
  schedule.total_splits = total;
  return schedule;
}

int64_t max_decode_splits(int64_t batch, int64_t max_seq_len, int64_t block_size,
                          int64_t num_workers, bool batch_invariant) {
  require(batch >= 0 && max_seq_len >= 0 && block_size > 0 && num_workers > 0,
          ErrorCode::kInvalidArgument,
          "max_decode_splits: need batch >= 0, max_seq_len >= 0, block_size > 0 and num_workers > "
          "0, got ",
          batch, ", ", max_seq_len, ", ", block_size, ", ", num_workers);
  if (batch == 0 || max_seq_len == 0) return 0;
  // Invariant: at most kBatchInvariantMaxSplits per request, and never more than one per block.
  // Shared piece length: every request gets ceil(len / piece) <= len / piece + 1 splits and the
  // piece is at least total / target_pieces, so the batch gets at most target_pieces + batch.
  const int64_t per_request = std::min(kBatchInvariantMaxSplits, ceil_div(max_seq_len, block_size));
  if (batch_invariant) return batch * per_request;
  return std::min(batch * ceil_div(max_seq_len, block_size),
                  kPiecesPerWorker * num_workers + batch);
}

}  // namespace mlakit
