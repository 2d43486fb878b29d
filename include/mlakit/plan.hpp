// Host-side planning (pure functions of host integers; no device access, no allocation on the
// run path). Spec §B. Every function validates its input and throws mlakit::Error on bad input.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mlakit/config.hpp"

namespace mlakit {

// ---- B.2: rows of the chunked-context gather workspace ------------------------------------------
// min(max(8 * max_model_len, 4 * max_num_seqs * block_size), 65536), raised to at least
// max_num_seqs * block_size (one page per request).
int64_t chunked_prefill_workspace_tokens(int64_t max_model_len, int64_t max_num_seqs,
                                         int64_t block_size);

// ---- B.4: decode / prefill split of an already reordered batch ----------------------------------
struct SplitCounts {
  int64_t num_decodes = 0;
  int64_t num_prefills = 0;
  int64_t num_decode_tokens = 0;
  int64_t num_prefill_tokens = 0;
};
// query_start_loc: [R + 1] cumulative query lengths (padding requests repeat the last value).
// num_actual_tokens: T, which may exceed query_start_loc[R] for CUDA-graph padded batches.
SplitCounts split_decodes_and_prefills(std::span<const int32_t> query_start_loc,
                                       int64_t num_actual_tokens, int64_t decode_threshold,
                                       bool require_uniform);

// ---- B.5: decodes-first reorder -----------------------------------------------------------------
// Returns order[i] = index (in the input) of the request placed at position i: decodes
// (computed > 0 and scheduled <= threshold), then extends, then prefills (computed == 0); only
// positions whose region is wrong move. num_scheduled, num_computed: [R].
std::vector<int32_t> reorder_decodes_first(std::span<const int32_t> num_scheduled,
                                           std::span<const int32_t> num_computed,
                                           int64_t decode_threshold);

// ---- B.6: chunked-context plan ------------------------------------------------------------------
enum class ChunkPolicy : uint8_t {
  kEqualShare,  // vLLM: every request with context gets workspace/n_with_context per chunk
  kPacked,      // spec F-19: fill each chunk with whole remaining contexts, splitting only the
                // request that overflows it at a page boundary (far fewer chunks)
};

// One chunk of context, gathered into the workspace rows [0, total_tokens).
struct ContextChunk {
  std::vector<int32_t> starts;        // [np] first context position gathered per prefill request
  std::vector<int32_t> seq_lens;      // [np] context tokens gathered per prefill request
  std::vector<int32_t> cu_seq_lens;   // [np + 1] cumulative seq_lens (workspace row offsets)
  std::vector<int32_t> token_to_seq;  // [total_tokens] prefill request of each workspace row
  int64_t total_tokens = 0;
  int64_t max_seq_len = 0;
};

// ---- B.7: one context chunk under DCP (mlakit/dcp.hpp, plan_dcp_context_chunks) ----------------
struct DcpContextChunk {
  // The chunk in global positions and global token order: the attention over the chunk uses its
  // cu_seq_lens / max_seq_len; token_to_seq maps the reorganised rows to prefill requests.
  ContextChunk global;
  // This rank's share: starts and seq_lens in local positions of its cache, cu_seq_lens and
  // token_to_seq over its gather rows [0, local.total_tokens).
  ContextChunk local;
  // Rows every rank contributes to the all-gather: the largest local.total_tokens of any rank.
  int64_t rows_per_rank = 0;
  // [W, np + 1] local.cu_seq_lens of every rank, row-major (row dcp.rank is local.cu_seq_lens):
  // where each rank's rows of a request sit in its slice of the all-gathered buffer.
  std::vector<int32_t> rank_cu_seq_lens;
  // [global.total_tokens] row of the all-gathered [W * rows_per_rank] buffer holding global row t
  // (ops::dcp_gathered_rows computes the same rows where the tensors live).
  std::vector<int32_t> gathered_row;
};

// ---- Decode split-KV schedule -------------------------------------------------------------------
// How one mla_decode call cuts its requests' keys into pieces computed in parallel and merged by
// LSE. Two kinds, one per backend family (ops::plan_mla_decode picks the device's):
//  - kHostSplits (CPU backend): planned on the host from the host seq_lens. Request b's keys
//    [0, seq_lens[b]) are cut into num_splits(b) pieces of split_len[b] tokens (a multiple of the
//    block size; the last piece may be shorter). Split k of request b is global split index
//    split_offsets[b] + k. A request with seq_len 0 has no split.
//  - kDevicePlanned (CUDA backend): depends on the shape only (`device`). At run time a small
//    kernel reads the device seq_lens and cuts the batch's key tiles into near-equal shares, one
//    per CTA (docs/kernels/decode_sm90.md, "Schedule"), so one captured CUDA graph serves any
//    lengths and block tables of that shape. split_offsets and split_len are empty; total_splits
//    is the most partial results the plan can need and max_splits the most pieces of one request.
enum class DecodeScheduleKind : uint8_t { kHostSplits, kDevicePlanned };

// The shape a kDevicePlanned schedule was planned for; the op rejects it for another shape.
struct DeviceDecodeSchedule {
  int64_t batch = 0;      // B
  int64_t s_q = 0;        // queries per request
  int64_t num_heads = 0;  // N
  // Bound on every seq_len (e.g. block-table width x block size): a longer seq_len is a bad index
  // (NaN rows and the device error word), like one beyond the block table.
  int64_t max_seq_len = 0;
  int64_t num_parts = 0;  // P: CTAs per tile of query rows, each taking one share of the keys
  bool batch_invariant = false;  // pieces depend on the request's own seq_len only
  // The split workspace already holds this schedule's work plan for the call's seq_lens: an
  // earlier mla_decode with the same schedule, seq_lens (unchanged since) and split workspace,
  // on the same stream, wrote it (e.g. the first layer of a step for the other layers). The call
  // then skips planning. Wrong use gives wrong results: the orchestrator sets it, not users.
  bool planned_ahead = false;

  bool operator==(const DeviceDecodeSchedule&) const = default;
};

struct DecodeSchedule {
  DecodeScheduleKind kind = DecodeScheduleKind::kHostSplits;
  std::vector<int32_t> split_offsets;  // [B + 1] cumulative split counts (kHostSplits)
  std::vector<int32_t> split_len;      // [B] tokens per split (multiple of block_size; kHostSplits)
  int64_t total_splits = 0;
  int64_t max_splits = 0;       // largest split count of any request
  DeviceDecodeSchedule device;  // kDevicePlanned only

  int64_t num_splits(int64_t b) const { return split_offsets[b + 1] - split_offsets[b]; }
  bool operator==(const DecodeSchedule&) const = default;
};
// The kHostSplits schedule. seq_lens: [B] keys per decode request. Splits are sized so that about
// `num_workers` * a small factor pieces of equal length exist, never shorter than one block. With
// batch_invariant, a request is cut into pieces of max(1024, ceil(len / 16)) keys rounded up to
// whole blocks, so its splits, and with them its output bits, do not depend on the other requests
// of the batch.
DecodeSchedule plan_decode_splits(std::span<const int32_t> seq_lens, int64_t block_size,
                                  int64_t num_workers, bool batch_invariant = false);
// The largest total_splits plan_decode_splits can return for `batch` requests of at most
// max_seq_len keys each (the workspace bound of an engine's worst step).
int64_t max_decode_splits(int64_t batch, int64_t max_seq_len, int64_t block_size,
                          int64_t num_workers, bool batch_invariant);

// ---- The whole plan of one forward step ---------------------------------------------------------
struct BatchDesc {
  std::span<const int32_t> query_start_loc;  // [R + 1]
  std::span<const int32_t> seq_lens;         // [R] context + query tokens per request
  int64_t num_actual_tokens = 0;             // T (>= query_start_loc[R] when padded)
  int64_t block_table_width = 0;             // columns of the block table
};

struct PlannerConfig {
  int64_t block_size = 64;  // KV page size; chunk starts are aligned to it
  int64_t decode_threshold = 1;
  QueryLenSupport query_len_support = QueryLenSupport::kVarlen;
  int64_t workspace_tokens = 0;  // rows of the gather workspace (> 0)
  ChunkPolicy chunk_policy = ChunkPolicy::kPacked;
  int64_t num_workers = 1;  // parallel workers the decode split-KV schedule targets
  // Decode context parallelism: with dcp.world_size > 1 the block table is this rank's (its width
  // bounds the local lengths), decodes are planned over the local lengths with decode_threshold 1
  // (whatever decode_threshold says: a rank's cache cannot apply the causal mask of several
  // queries, docs/dcp.md), and the context chunks are plan_dcp_context_chunks'.
  DcpConfig dcp{};
};

struct Plan {
  int64_t num_reqs = 0;
  int64_t num_actual_tokens = 0;
  SplitCounts split;

  // Decode part: requests [0, num_decodes), tokens [0, num_decode_tokens).
  int64_t decode_query_len = 0;  // common q_len of the decodes (uniform), else 0
  int64_t max_decode_query_len = 0;
  DecodeSchedule decode_schedule;  // over seq_lens[0 : num_decodes]

  // Prefill part: requests [num_decodes, R), tokens [num_decode_tokens, T).
  std::vector<int32_t> prefill_query_start_loc;  // [np + 1], rebased to 0
  int64_t prefill_max_query_len = 0;
  std::vector<int32_t> prefill_context_lens;  // [np] seq_len - query_len
  std::vector<ContextChunk> context_chunks;   // empty when no prefill has context

  // DCP only (config.dcp.world_size > 1), empty otherwise:
  std::vector<int32_t> local_seq_lens;  // [R] dcp_local_seq_lens(seq_lens): what this rank holds
  // One per context chunk; context_chunks[i] is dcp_context_chunks[i].global.
  std::vector<DcpContextChunk> dcp_context_chunks;

  bool has_context() const { return !context_chunks.empty(); }
};

// Validates the batch (monotone query_start_loc, 0 <= query_len <= seq_len, seq_len within the
// block table; under DCP this rank's local length within it) and builds the plan. Every chunk
// satisfies total_tokens <= workspace_tokens and every block-table column it reads is <
// block_table_width.
Plan make_plan(const BatchDesc& batch, const PlannerConfig& config);

}  // namespace mlakit
