// What a StepPlan and a Workspace hold (private to src/attention/): the plan of one step, the
// device views of its uploaded indices and its temporaries carved from the shared workspace.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/arena.hpp"
#include "attention/decode_runs.hpp"
#include "mlakit/plan.hpp"
#include "mlakit/step.hpp"
#include "mlakit/types.hpp"

namespace mlakit {

struct Workspace::State {
  MlaAttentionConfig config;      // the limits it was sized for
  Tensor buffer;                  // u8 [bytes] on config.device
  int64_t metadata_capacity = 0;  // i32 entries of the index region at the start of `buffer`
  void* staging = nullptr;        // pinned host i32 [metadata_capacity] (GPU only)
  void* upload_done = nullptr;    // event recorded after each upload from `staging` (GPU only)
  uint64_t generation = 0;        // plan_step calls so far: a StepPlan is valid for one of them

  ~State();
};

namespace detail {

// The sizes that decide how much workspace a step needs. A step's own, or the worst case of the
// engine's limits (every buffer size is non-decreasing in each field).
struct StepShape {
  int64_t metadata_ints = 0;   // i32 index entries uploaded per step
  int64_t tokens = 0;          // T (DCP: the slots plan_step derives)
  int64_t prefill_tokens = 0;  // Tp
  // Rows of the largest context chunk (0: no context); under DCP also of its all-gathered entries.
  int64_t chunk_rows = 0;
  int64_t decode_tokens = 0;  // Td: rows of the decode phase (padded tokens after it take none)
  int64_t split_elems = 0;    // f32 elements of the largest decode run's split workspace
};

// Temporaries of one step, carved from the workspace.
// Under DCP (W ranks, docs/dcp.md) the decode runs over all W N heads of the group.
struct StepBuffers {
  TensorView metadata;   // i32 [metadata_ints]: the uploaded index arrays
  TensorView dcp_slots;  // i64 [T] DCP only: this rank's cache slots, derived by plan_step
  // prefill (with context: context chunks first, then the new tokens)
  TensorView kv_up;         // [max(Tp, chunk rows), N * (P + V)] act: kv_b_proj(kv_c) of either
  TensorView ctx_out;       // [Tp, N, V] f32: context chunks merged so far
  TensorView ctx_lse;       // [N, Tp] f32
  TensorView part_out;      // [Tp, N, V] f32: one chunk's result, then the new tokens' result
  TensorView part_lse;      // [N, Tp] f32
  TensorView gather;        // [chunk rows, L + R] act: one chunk's cache entries
  TensorView token_to_seq;  // i32 [chunk rows] (without DCP)
  TensorView exchange;      // u8 [chunk rows, entry bytes] DCP: one chunk's all-gathered entries
  TensorView row_index;     // i32 [chunk rows] DCP: ops::dcp_gathered_rows of one chunk
  // decode (shares bytes with the prefill temporaries: the phases follow each other)
  TensorView ql;        // [Td, N, L + R] act
  TensorView ql_fp8;    // [Td, N, L + R] fp8 (fp8_e4m3 caches without DCP)
  TensorView o_lat;     // [Td, N, L] act
  TensorView lse;       // [Td, N] f32 (without DCP)
  TensorView split_ws;  // f32 [split_elems]
  // decode under DCP
  TensorView gathered_q;    // [W, Td, N, L + R] act: every rank's absorbed queries
  TensorView q_all;         // [Td, W N, L + R] act, or fp8 for fp8_e4m3 caches
  TensorView partial_out;   // [Td, W N, L] f32: all heads over this rank's keys
  TensorView partial_lse;   // [Td, W N] f32
  TensorView gathered_lse;  // [W, Td, W N] f32
  TensorView corrected;     // [W, Td, N, L] f32: this rank's weighted partials, by receiving rank
  TensorView combined;      // [Td, N, L] f32: this rank's heads over all keys
};

StepBuffers carve(Arena& arena, const MlaAttentionConfig& config, const StepShape& shape);

// One block id a step reads, and where: batch.block_table[request, column].
struct BlockIdRead {
  int32_t id = 0;
  int64_t request = 0;
  int64_t column = 0;
  // Keys of what reads it: the decode request's seq_len, or the prefill request's context length
  // (this rank's under DCP).
  int64_t keys = 0;
  bool decode = false;  // a decode request's keys, else a prefill request's context
};

// The lowest and the highest block id a CPU step reads (every decode request's keys and every
// context gather, within each request's length), found by plan_step once per step: forward
// compares them with its cache's block count before it writes anything. Empty on a GPU, whose
// kernels check the ids on the device (check_device_errors).
struct BlockIdBounds {
  bool any = false;  // the step reads at least one block
  BlockIdRead lowest, highest;
};

// The decode threshold the planner uses: 1 under DCP (PlannerConfig::dcp), else the config's.
int64_t effective_decode_threshold(const MlaAttentionConfig& config);

// Fields two configurations must share for one workspace, or one StepPlan, to serve both.
bool same_step_config(const MlaAttentionConfig& a, const MlaAttentionConfig& b);
// The batch's block table and slot mapping (dtype, rank, rows, device): what every entry point
// that takes a ForwardBatch checks alike.
void validate_batch_tensors(const char* op, const MlaAttentionConfig& config,
                            const ForwardBatch& batch);
// Validates the batch's lengths (make_plan) and plans it with the configuration's chunking.
Plan plan_batch(const MlaAttentionConfig& config, const ForwardBatch& batch);

}  // namespace detail

struct StepPlan::State {
  MlaAttentionConfig config;  // the configuration it was planned for
  Plan plan;
  detail::DecodeRuns runs;
  int64_t num_actual_tokens = 0;
  int64_t prefill_tokens = 0;  // Tp: real prefill tokens (padding tokens follow them)
  int64_t decode_rows = 0;     // Td: the decode phase's; decode tokens past them are padding
  TensorView block_table;      // i32 [>= R, max_blocks] (the engine's; under DCP this rank's)
  TensorView slot_mapping;     // i64 [>= T] (the engine's; under DCP buffers.dcp_slots)
  // CPU only: the lowest and highest block id the step reads, for forward's check.
  detail::BlockIdBounds block_ids;

  // Views into buffers.metadata.
  TensorView seq_lens;                        // i32 [R] (under DCP this rank's local lengths)
  TensorView prefill_query_start_loc;         // i32 [np + 1]
  std::vector<TensorView> chunk_cu_seq_lens;  // i32 [np + 1] per chunk (global rows)
  std::vector<TensorView> chunk_starts;       // i32 [np] per chunk (global positions)
  // DCP, per chunk: this rank's gather (local positions) and every rank's rows.
  std::vector<TensorView> chunk_local_cu_seq_lens;  // i32 [np + 1]
  std::vector<TensorView> chunk_local_starts;       // i32 [np]
  std::vector<TensorView> chunk_rank_cu_seq_lens;   // i32 [W, np + 1]
  detail::StepBuffers buffers;
  int64_t bytes_used = 0;

  const Workspace::State* workspace = nullptr;
  uint64_t generation = 0;
  // Everything a launch depends on besides the uploaded index values (same_launches).
  std::vector<int64_t> launch_signature;
};

}  // namespace mlakit
