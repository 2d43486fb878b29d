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
  int64_t prefill_tokens = 0;  // Tp
  int64_t chunk_rows = 0;      // rows of the largest context chunk (0: no context)
  int64_t decode_tokens = 0;   // Td
  int64_t split_elems = 0;     // f32 elements of the largest decode run's split workspace
};

// Temporaries of one step, carved from the workspace.
struct StepBuffers {
  TensorView metadata;  // i32 [metadata_ints]: the uploaded index arrays
  // prefill (with context: context chunks first, then the new tokens)
  TensorView kv_up;         // [max(Tp, chunk rows), N * (P + V)] act: kv_b_proj(kv_c) of either
  TensorView ctx_out;       // [Tp, N, V] f32: context chunks merged so far
  TensorView ctx_lse;       // [N, Tp] f32
  TensorView part_out;      // [Tp, N, V] f32: one chunk's result, then the new tokens' result
  TensorView part_lse;      // [N, Tp] f32
  TensorView gather;        // [chunk rows, L + R] act: one chunk's cache entries
  TensorView token_to_seq;  // i32 [chunk rows]
  // decode (shares bytes with the prefill temporaries: the phases follow each other)
  TensorView ql;        // [Td, N, L + R] act
  TensorView ql_fp8;    // [Td, N, L + R] fp8 (fp8_e4m3 caches only)
  TensorView o_lat;     // [Td, N, L] act
  TensorView lse;       // [Td, N] f32
  TensorView split_ws;  // f32 [split_elems]
};

StepBuffers carve(Arena& arena, const MlaAttentionConfig& config, const StepShape& shape);

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
  TensorView block_table;      // i32 [>= R, max_blocks] (the engine's)
  TensorView slot_mapping;     // i64 [>= T] (the engine's)

  // Views into buffers.metadata.
  TensorView seq_lens;                        // i32 [R]
  TensorView prefill_query_start_loc;         // i32 [np + 1]
  std::vector<TensorView> chunk_cu_seq_lens;  // i32 [np + 1] per chunk
  std::vector<TensorView> chunk_starts;       // i32 [np] per chunk
  detail::StepBuffers buffers;
  int64_t bytes_used = 0;

  const Workspace::State* workspace = nullptr;
  uint64_t generation = 0;
  // Everything a launch depends on besides the uploaded index values (same_launches).
  std::vector<int64_t> launch_signature;
};

}  // namespace mlakit
