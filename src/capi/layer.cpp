#include "capi/layer.hpp"

#include <span>

#include "capi/boundary.hpp"

namespace mlakit::capi {

namespace {

bool to_flag(const char* op, const char* name, int32_t value) {
  detail::require(value == 0 || value == 1, ErrorCode::kInvalidArgument, op, ": ", name,
                  " must be 0 or 1, got ", value);
  return value == 1;
}

}  // namespace

MlaAttentionConfig to_config(const char* op, const mlakit_mla_config_t& c) {
  MlaAttentionConfig config;
  config.dims.num_heads = c.num_heads;
  config.dims.kv_lora_rank = c.kv_lora_rank;
  config.dims.qk_rope_head_dim = c.qk_rope_head_dim;
  config.dims.qk_nope_head_dim = c.qk_nope_head_dim;
  config.dims.v_head_dim = c.v_head_dim;
  config.scale = c.scale;
  config.act_dtype = to_dtype(op, "config.act_dtype", c.act_dtype);
  config.kv_cache_dtype = to_kv_cache_dtype(op, c.kv_cache_dtype);
  config.block_size = c.block_size;
  config.decode_threshold = c.decode_threshold;
  config.query_len_support = to_query_len_support(op, c.query_len_support);
  config.chunk_policy = to_chunk_policy(op, c.chunk_policy);
  config.workspace_tokens = c.workspace_tokens;
  config.max_model_len = c.max_model_len;
  config.max_num_seqs = c.max_num_seqs;
  config.max_num_batched_tokens = c.max_num_batched_tokens;
  config.batch_invariant = to_flag(op, "config.batch_invariant", c.batch_invariant);
  // The device comes through a zero-size tensor so that it gets the same checks as any tensor's.
  DLTensor probe{};
  probe.device = c.device;
  probe.dtype = to_dl_dtype(DType::kF32);
  config.device = to_view(op, "config.device", &probe).device;
  config.dcp.world_size = c.dcp_world_size;
  config.dcp.rank = c.dcp_rank;
  config.dcp.interleave = c.dcp_interleave;
  return config;
}

void init_config(mlakit_mla_config_t& config) {
  const MlaAttentionConfig d;
  config.num_heads = d.dims.num_heads;
  config.kv_lora_rank = d.dims.kv_lora_rank;
  config.qk_rope_head_dim = d.dims.qk_rope_head_dim;
  config.qk_nope_head_dim = d.dims.qk_nope_head_dim;
  config.v_head_dim = d.dims.v_head_dim;
  config.scale = d.scale;
  config.act_dtype = to_dl_dtype(d.act_dtype);
  config.kv_cache_dtype = MLAKIT_KV_CACHE_AUTO;
  config.block_size = d.block_size;
  config.decode_threshold = d.decode_threshold;
  config.query_len_support = MLAKIT_QUERY_LEN_VARLEN;
  config.chunk_policy = MLAKIT_CHUNK_PACKED;
  config.workspace_tokens = d.workspace_tokens;
  config.max_model_len = d.max_model_len;
  config.max_num_seqs = d.max_num_seqs;
  config.max_num_batched_tokens = d.max_num_batched_tokens;
  config.batch_invariant = d.batch_invariant ? 1 : 0;
  config.device = DLDevice{kDLCPU, 0};
  config.dcp_world_size = d.dcp.world_size;
  config.dcp_rank = d.dcp.rank;
  config.dcp_interleave = d.dcp.interleave;
}

ForwardBatch to_batch(const char* op, const mlakit_forward_batch_t& b) {
  require_request_count(op, "batch.num_reqs", b.num_reqs);
  require_pointer(op, "batch.query_start_loc", b.query_start_loc);
  if (b.num_reqs > 0) require_pointer(op, "batch.seq_lens", b.seq_lens);
  ForwardBatch batch;
  batch.query_start_loc = std::span<const int32_t>(b.query_start_loc, b.num_reqs + 1);
  batch.seq_lens = std::span<const int32_t>(b.seq_lens, static_cast<size_t>(b.num_reqs));
  batch.num_actual_tokens = b.num_actual_tokens;
  batch.block_table = to_view(op, "batch.block_table", b.block_table);
  batch.slot_mapping = to_view(op, "batch.slot_mapping", b.slot_mapping);
  return batch;
}

}  // namespace mlakit::capi
