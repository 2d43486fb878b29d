// The bad-input table through the C ABI (mlakit.h, libmlakit_c.so): every malformed call returns
// the table's status, and mlakit_last_error() holds the table's message parts.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "errors/runner.hpp"
#include "errors/table.hpp"
#include "mlakit/mlakit.h"

namespace mlakit::errors {
namespace {

// A kv_cache_dtype given by name, or as a raw int (a value outside the enumeration).
int32_t kv_cache_dtype(const Materialized& m) {
  const nlohmann::json& v = m.scalars()["kv_cache_dtype"];
  if (v.is_number()) return v.get<int32_t>();
  int32_t code = -1;
  EXPECT_EQ(mlakit_parse_kv_cache_dtype(v.get<std::string>().c_str(), &code), MLAKIT_OK);
  return code;
}

DLDataType act_dtype(const Materialized& m) {
  const std::string name = m.text("act_dtype");
  if (name == "f16") return {kDLFloat, 16, 1};
  if (name == "bf16") return {kDLBfloat, 16, 1};
  if (name == "f32") return {kDLFloat, 32, 1};
  return {kDLFloat8_e4m3fn, 8, 1};  // not an activation dtype: the library must say so
}

// MlaAttention's configuration from the scalars (the library's defaults for the others).
mlakit_mla_config_t attention_config(const Materialized& m) {
  mlakit_mla_config_t c;
  mlakit_mla_config_init(&c);
  c.num_heads = m.integer("num_heads");
  c.kv_lora_rank = m.integer("kv_lora_rank");
  c.qk_rope_head_dim = m.integer("qk_rope_head_dim");
  c.qk_nope_head_dim = m.integer("qk_nope_head_dim");
  c.v_head_dim = m.integer("v_head_dim");
  c.act_dtype = act_dtype(m);
  c.scale = m.has_scalar("scale") ? static_cast<float>(m.number("scale")) : 0.125f;
  if (m.has_scalar("kv_cache_dtype")) c.kv_cache_dtype = kv_cache_dtype(m);
  if (m.has_scalar("block_size")) c.block_size = m.integer("block_size");
  if (m.has_scalar("decode_threshold")) c.decode_threshold = m.integer("decode_threshold");
  if (m.has_scalar("workspace_tokens")) c.workspace_tokens = m.integer("workspace_tokens");
  if (m.has_scalar("max_model_len")) c.max_model_len = m.integer("max_model_len");
  if (m.has_scalar("max_num_seqs")) c.max_num_seqs = m.integer("max_num_seqs");
  if (m.has_scalar("query_len_support")) {
    const std::string support = m.text("query_len_support");
    c.query_len_support = support == "single_only" ? MLAKIT_QUERY_LEN_SINGLE_ONLY
                          : support == "uniform"   ? MLAKIT_QUERY_LEN_UNIFORM
                                                   : MLAKIT_QUERY_LEN_VARLEN;
  }
  if (m.has_scalar("device") && m.text("device") != "cpu") c.device = DLDevice{kDLCUDA, 0};
  return c;
}

mlakit_status_t create_attention(const Materialized& m) {
  const mlakit_mla_config_t config = attention_config(m);
  mlakit_attention_t* layer = nullptr;
  const mlakit_status_t status = mlakit_attention_create(&config, m.dl("kv_b_proj_weight"),
                                                         m.dl("kv_b_proj_scale_inv"), &layer);
  mlakit_attention_destroy(layer);
  return status;
}

// mlakit_mla_decode(_scheduled); tensor_scales: their _tensor_scale entries (q_scale and k_scale
// tensors, mla_decode_tensor_scale's table).
mlakit_status_t decode(const Materialized& m, bool tensor_scales) {
  const int64_t rank = m.integer("kv_lora_rank");
  const float scale = static_cast<float>(m.number("scale"));
  const float q_scale = tensor_scales ? 1.0f : static_cast<float>(m.number("q_scale"));
  const float k_scale = tensor_scales ? 1.0f : static_cast<float>(m.number("k_scale"));
  if (m.text("form") == "host") {
    if (tensor_scales) {
      return mlakit_mla_decode_tensor_scale(m.dl("q"), m.dl("kv_cache"), m.dl("block_table"),
                                            m.dl("seq_lens"), m.dl("out"), m.dl("lse"), rank, scale,
                                            kv_cache_dtype(m), m.dl("q_scale"), m.dl("k_scale"));
    }
    return mlakit_mla_decode(m.dl("q"), m.dl("kv_cache"), m.dl("block_table"), m.dl("seq_lens"),
                             m.dl("out"), m.dl("lse"), rank, scale, kv_cache_dtype(m), q_scale,
                             k_scale);
  }
  const std::vector<int32_t> lens = m.scalars()["schedule_lens"].get<std::vector<int32_t>>();
  mlakit_decode_schedule_t* schedule = nullptr;
  mlakit_status_t status = mlakit_plan_decode_splits(lens.data(), static_cast<int64_t>(lens.size()),
                                                     m.integer("schedule_block_size"),
                                                     m.integer("num_workers"), &schedule);
  if (status != MLAKIT_OK) return status;
  status = tensor_scales
               ? mlakit_mla_decode_scheduled_tensor_scale(
                     m.dl("q"), m.dl("kv_cache"), m.dl("block_table"), m.dl("seq_lens"),
                     m.dl("out"), m.dl("lse"), rank, scale, kv_cache_dtype(m), m.dl("q_scale"),
                     m.dl("k_scale"), schedule, m.dl("split_workspace"), nullptr)
               : mlakit_mla_decode_scheduled(m.dl("q"), m.dl("kv_cache"), m.dl("block_table"),
                                             m.dl("seq_lens"), m.dl("out"), m.dl("lse"), rank,
                                             scale, kv_cache_dtype(m), q_scale, k_scale, schedule,
                                             m.dl("split_workspace"), nullptr);
  mlakit_decode_schedule_destroy(schedule);
  return status;
}

mlakit_status_t call(const std::string& op, const Materialized& m) {
  if (op == "concat_and_cache_mla") {
    return mlakit_concat_and_cache_mla(m.dl("kv_c"), m.dl("k_pe"), m.dl("kv_cache"),
                                       m.dl("slot_mapping"), kv_cache_dtype(m),
                                       static_cast<float>(m.number("scale")), nullptr);
  }
  if (op == "gather_and_maybe_dequant_cache") {
    return mlakit_gather_and_maybe_dequant_cache(
        m.dl("src_cache"), m.dl("dst"), m.dl("block_table"), m.dl("cu_seq_lens"),
        m.dl("token_to_seq"), m.integer("num_tokens"), kv_cache_dtype(m),
        static_cast<float>(m.number("scale")), m.dl("seq_starts"), nullptr);
  }
  if (op == "concat_and_cache_mla_tensor_scale") {
    return mlakit_concat_and_cache_mla_tensor_scale(m.dl("kv_c"), m.dl("k_pe"), m.dl("kv_cache"),
                                                    m.dl("slot_mapping"), kv_cache_dtype(m),
                                                    m.dl("scale"), nullptr);
  }
  if (op == "gather_and_maybe_dequant_cache_tensor_scale") {
    return mlakit_gather_and_maybe_dequant_cache_tensor_scale(
        m.dl("src_cache"), m.dl("dst"), m.dl("block_table"), m.dl("cu_seq_lens"),
        m.dl("token_to_seq"), m.integer("num_tokens"), kv_cache_dtype(m), m.dl("scale"),
        m.dl("seq_starts"), nullptr);
  }
  if (op == "scaled_fp8_quant_tensor_scale") {
    return mlakit_scaled_fp8_quant_tensor_scale(m.dl("input"), m.dl("out"), m.dl("scale"), nullptr);
  }
  if (op == "dynamic_scaled_fp8_quant") {
    return mlakit_dynamic_scaled_fp8_quant(m.dl("input"), m.dl("out"), m.dl("scale"), nullptr);
  }
  if (op == "cp_gather_cache") {
    return mlakit_cp_gather_cache(m.dl("src_cache"), m.dl("dst"), m.dl("block_table"),
                                  m.dl("cu_seq_lens"), m.integer("batch_size"), m.dl("seq_starts"),
                                  nullptr);
  }
  if (op == "merge_attn_states") {
    return mlakit_merge_attn_states(m.dl("output"), m.dl("prefix_output"), m.dl("prefix_lse"),
                                    m.dl("suffix_output"), m.dl("suffix_lse"), m.dl("output_lse"),
                                    nullptr);
  }
  if (op == "scaled_fp8_quant") {
    return mlakit_scaled_fp8_quant(m.dl("input"), m.dl("out"),
                                   static_cast<float>(m.number("scale")), nullptr);
  }
  if (op == "mla_decode" || op == "mla_decode_tensor_scale") {
    return decode(m, op == "mla_decode_tensor_scale");
  }
  if (op == "mla_prefill") {
    return mlakit_mla_prefill(m.dl("q"), m.dl("k_nope"), m.dl("k_pe"), m.dl("v"),
                              m.dl("cu_seqlens_q"), m.dl("cu_seqlens_k"), m.integer("max_seqlen_q"),
                              m.integer("max_seqlen_k"), static_cast<float>(m.number("scale")),
                              static_cast<int32_t>(m.integer("causal")), m.dl("out"), m.dl("lse"),
                              nullptr);
  }
  // absorb_kv_b_proj has no C entry point: the C ABI reaches it through the layer's creation.
  if (op == "absorb_kv_b_proj" || op == "mla_attention") return create_attention(m);
  ADD_FAILURE() << "no C ABI runner for " << op;
  return MLAKIT_ERROR_INTERNAL;
}

class ErrorTableCAbi : public ::testing::TestWithParam<std::string> {};

TEST_P(ErrorTableCAbi, EveryMalformedCallReturnsItsStatusAndNamesTheArgument) {
  const std::string op = GetParam();
  check_table(op, "c", [&](const Materialized& m) {
    const mlakit_status_t status = call(op, m);
    if (status == MLAKIT_OK) return Outcome{};
    return Outcome{false, mlakit_status_name(status), mlakit_last_error()};
  });
}

INSTANTIATE_TEST_SUITE_P(Ops, ErrorTableCAbi, ::testing::ValuesIn(table_ops()), op_test_name);

}  // namespace
}  // namespace mlakit::errors
