// One engine step: the layer configuration, the step's batch, the workspace every layer shares and
// the StepPlan built once per step (DESIGN.md §2, "plan once per step, run per layer").
//
// An engine serving an L-layer model does, per step:
//   StepPlan plan = plan_step(config, batch, workspace, stream);   // host planning + one upload
//   for (layer : layers) layer.forward(q, kv_c, k_pe, kv_cache[layer], plan, output, scales,
//   stream);
// plan_step validates the batch, plans it (spec B), carves every temporary of the step from the
// workspace and uploads all index arrays in one asynchronous copy. forward() then only launches
// kernels: no host synchronization, no allocation, no planning, no host-to-device copy, so a
// decode-only step of all layers can be captured in one CUDA graph and replayed after a later
// plan_step of the same shape (StepPlan::same_launches) has written new lengths into the workspace.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "mlakit/config.hpp"
#include "mlakit/plan.hpp"
#include "mlakit/types.hpp"

namespace mlakit {

struct MlaAttentionConfig {
  MlaDims dims;
  float scale = 0.0f;  // softmax scale from the model config (not 1/sqrt(576)); must be > 0
  DType act_dtype = DType::kBF16;
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;
  int64_t block_size = 64;
  // Requests with q_len <= threshold and context > 0 decode; 1 under DCP whatever is set here.
  int64_t decode_threshold = 1;
  QueryLenSupport query_len_support = QueryLenSupport::kVarlen;
  // Gather-workspace rows for context chunks; 0 means B.2 from max_model_len and max_num_seqs,
  // lowered so that one chunk's up-projection [rows, N * (P + V)] stays within 512 MiB (a chunk
  // then holds fewer rows and a long context takes more chunks; the result is the same). Set by
  // hand it must be >= block_size: a chunk holds whole blocks.
  int64_t workspace_tokens = 0;
  // Engine limits: the workspace is sized for the worst step within them (workspace_bytes).
  int64_t max_model_len = 4096;           // tokens of one request (context + new)
  int64_t max_num_seqs = 256;             // requests of one step
  int64_t max_num_batched_tokens = 8192;  // tokens of one step
  ChunkPolicy chunk_policy = ChunkPolicy::kPacked;
  // Decode attention cuts each request's keys by its own length only (DecodePlanShape::
  // batch_invariant), so a decode request's latent output and LSE are bitwise the same whatever
  // else is in the batch (at some cost in balance). The projections around it (batched_matmul)
  // are not made invariant.
  bool batch_invariant = false;
  Device device{};
  // Decode context parallelism (docs/dcp.md): this layer is rank dcp.rank of dcp.world_size ranks
  // sharing every request's tokens with interleave dcp.interleave. W = 1: no DCP (the default).
  // Under DCP the engine gives each rank its own block table (columns for its local positions),
  // decodes use decode_threshold 1, context chunks are aligned to lcm(block_size, W I) (a
  // workspace_tokens set by hand must hold that many rows), and MlaAttention needs the group's
  // Communicator.
  DcpConfig dcp{};
};

// Throws mlakit::Error naming the field for an invalid configuration.
void validate_config(const MlaAttentionConfig& config);

// Rows of one context chunk (the gather workspace) the configuration uses.
int64_t context_chunk_rows(const MlaAttentionConfig& config);

// One forward step's batch. Host arrays drive planning; the views are read by the kernels and
// must live on the layer's device. The engine owns them; for CUDA-graph replay it keeps the same
// block_table and slot_mapping buffers and writes the new step's values into them.
//
// Under DCP (config.dcp.world_size > 1) seq_lens are the global lengths (equal on every rank),
// block_table is this rank's table of its local positions (ceil(dcp_local_seq_len / block_size)
// columns a request), and slot_mapping must be empty: plan_step derives this rank's slot of every
// token from its position and the block table (ops::dcp_slot_mapping; -1 for the tokens other
// ranks hold and for padding).
struct ForwardBatch {
  std::span<const int32_t> query_start_loc;  // host [R + 1], requests reordered decodes-first
  std::span<const int32_t> seq_lens;         // host [R]
  int64_t num_actual_tokens = 0;             // T: tokens to process (padding rows excluded)
  TensorView block_table;                    // i32 [>= R, max_blocks] (rows of padding: any value)
  TensorView slot_mapping;                   // i64 [>= T]; < 0 skips the cache write (DCP: empty)
};

// fp8 scales of the layer (spec A.2): k_scale quantizes the whole latent entry, q_scale the
// decode query. Both are used only with fp8 caches (forward checks them there: finite and > 0);
// other caches ignore them, whatever their value.
struct ForwardScales {
  float q_scale = 1.0f;
  float k_scale = 1.0f;
};

// Bytes of device (or host, for the CPU) memory the worst step within the configuration's limits
// needs: index metadata plus the larger of the prefill and the decode temporaries. Independent of
// the number of layers.
int64_t workspace_bytes(const MlaAttentionConfig& config);

// Scratch memory shared by every layer of a model (one per stream): workspace_bytes(config) on the
// configuration's device, plus a pinned host staging buffer for the index upload (GPU only).
// Allocated once here; nothing allocates later.
class Workspace {
 public:
  explicit Workspace(const MlaAttentionConfig& config);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  int64_t bytes() const;
  Device device() const;
  // The profile run (spec A.12, F-44): writes every byte once (zeros), so that the memory is
  // committed and accounted for before the engine sizes its KV cache.
  void touch(Stream stream = {});

  struct State;
  State& state() const { return *state_; }

 private:
  std::unique_ptr<State> state_;
};

// The plan of one step and where its temporaries live in the workspace. Valid until the next
// plan_step on the same workspace (which overwrites the uploaded indices), even one that then
// throws; forward() checks that.
// It refers to its workspace, which must outlive it.
class StepPlan {
 public:
  StepPlan();
  ~StepPlan();
  StepPlan(const StepPlan& other);  // a copy is valid exactly as long as the original
  StepPlan& operator=(const StepPlan& other);
  StepPlan(StepPlan&&) noexcept;
  StepPlan& operator=(StepPlan&&) noexcept;

  const Plan& plan() const;
  int64_t num_actual_tokens() const;
  // Workspace bytes this step uses.
  int64_t workspace_bytes_used() const;
  // True when both plans launch the same kernels with the same arguments (same shapes, same
  // workspace addresses; lengths, block tables and slots may differ): a CUDA graph captured while
  // running one replays correctly for the other.
  bool same_launches(const StepPlan& other) const;

  struct State;
  const State& state() const { return *state_; }

 private:
  friend StepPlan plan_step(const MlaAttentionConfig&, const ForwardBatch&, Workspace&, Stream);
  std::unique_ptr<State> state_;
};

// Validates the batch against the configuration (the same checks MlaAttention::plan makes), plans
// it, carves the step's temporaries from `workspace` and uploads every index array in one
// asynchronous copy on `stream` (GPU: from the pinned staging buffer, after waiting for the
// previous step's upload to have left it). Throws kInvalidArgument when the step does not fit the
// configuration's limits. On the CPU it also reads, once, every block id the step will read (each
// decode request's keys, each context gather's positions, within the request's length) and keeps
// the lowest and the highest: each layer's forward compares them with its own cache's block count
// before it writes anything.
StepPlan plan_step(const MlaAttentionConfig& config, const ForwardBatch& batch,
                   Workspace& workspace, Stream stream = {});

}  // namespace mlakit
