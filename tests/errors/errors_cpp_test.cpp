// The bad-input table through the C++ API (mlakit::ops, absorb_kv_b_proj, MlaAttention): every
// malformed call throws mlakit::Error with the table's status and message parts.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "errors/runner.hpp"
#include "errors/table.hpp"
#include "mlakit/attention.hpp"
#include "mlakit/config.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/plan.hpp"
#include "mlakit/weights.hpp"

namespace mlakit::errors {
namespace {

KvCacheDType kv_cache_dtype(const Materialized& m) {
  return parse_kv_cache_dtype(m.text("kv_cache_dtype"));
}

Device device_of(const Materialized& m) {
  if (!m.has_scalar("device") || m.text("device") == "cpu") return Device::cpu();
  return Device::cuda(0);
}

MlaDims dims_of(const Materialized& m) {
  MlaDims d;
  d.num_heads = m.integer("num_heads");
  d.kv_lora_rank = m.integer("kv_lora_rank");
  d.qk_rope_head_dim = m.integer("qk_rope_head_dim");
  d.qk_nope_head_dim = m.integer("qk_nope_head_dim");
  d.v_head_dim = m.integer("v_head_dim");
  return d;
}

// mla_decode; tensor_scales: q_scale and k_scale are tensors (mla_decode_tensor_scale's table).
void decode(const Materialized& m, bool tensor_scales) {
  ops::DecodeParams p;
  p.scale = static_cast<float>(m.number("scale"));
  p.kv_dtype = kv_cache_dtype(m);
  if (!tensor_scales) {
    p.q_scale = static_cast<float>(m.number("q_scale"));
    p.k_scale = static_cast<float>(m.number("k_scale"));
  }
  p.kv_lora_rank = m.integer("kv_lora_rank");
  if (tensor_scales) {
    p.q_scale_tensor = m.optional_view("q_scale");
    p.k_scale_tensor = m.optional_view("k_scale");
  }
  if (m.text("form") == "host") {
    ops::mla_decode(m.view("q"), m.view("kv_cache"), m.view("block_table"), m.view("seq_lens"),
                    m.view("out"), m.view("lse"), p);
    return;
  }
  const std::vector<int32_t> lens = m.scalars()["schedule_lens"].get<std::vector<int32_t>>();
  const DecodeSchedule schedule =
      plan_decode_splits(lens, m.integer("schedule_block_size"), m.integer("num_workers"));
  ops::mla_decode(m.view("q"), m.view("kv_cache"), m.view("block_table"), m.view("seq_lens"),
                  m.view("out"), m.view("lse"), p, schedule, m.view("split_workspace"));
}

MlaAttentionConfig attention_config(const Materialized& m) {
  MlaAttentionConfig c;
  c.dims = dims_of(m);
  c.scale = static_cast<float>(m.number("scale"));
  c.act_dtype = dtype_of(m.text("act_dtype"));
  c.kv_cache_dtype = kv_cache_dtype(m);
  c.block_size = m.integer("block_size");
  c.decode_threshold = m.integer("decode_threshold");
  c.workspace_tokens = m.integer("workspace_tokens");
  c.max_model_len = m.integer("max_model_len");
  c.max_num_seqs = m.integer("max_num_seqs");
  if (m.has_scalar("query_len_support")) {
    const std::string support = m.text("query_len_support");
    c.query_len_support = support == "single_only" ? QueryLenSupport::kSingleOnly
                          : support == "uniform"   ? QueryLenSupport::kUniform
                                                   : QueryLenSupport::kVarlen;
  }
  c.device = device_of(m);
  return c;
}

void call(const std::string& op, const Materialized& m) {
  if (op == "concat_and_cache_mla") {
    ops::concat_and_cache_mla(m.view("kv_c"), m.view("k_pe"), m.view("kv_cache"),
                              m.view("slot_mapping"), kv_cache_dtype(m),
                              static_cast<float>(m.number("scale")));
  } else if (op == "gather_and_maybe_dequant_cache") {
    ops::gather_and_maybe_dequant_cache(
        m.view("src_cache"), m.view("dst"), m.view("block_table"), m.view("cu_seq_lens"),
        m.view("token_to_seq"), m.integer("num_tokens"), kv_cache_dtype(m),
        static_cast<float>(m.number("scale")), m.optional_view("seq_starts"));
  } else if (op == "concat_and_cache_mla_tensor_scale") {
    ops::concat_and_cache_mla(m.view("kv_c"), m.view("k_pe"), m.view("kv_cache"),
                              m.view("slot_mapping"), kv_cache_dtype(m), m.view("scale"));
  } else if (op == "gather_and_maybe_dequant_cache_tensor_scale") {
    ops::gather_and_maybe_dequant_cache(m.view("src_cache"), m.view("dst"), m.view("block_table"),
                                        m.view("cu_seq_lens"), m.view("token_to_seq"),
                                        m.integer("num_tokens"), kv_cache_dtype(m), m.view("scale"),
                                        m.optional_view("seq_starts"));
  } else if (op == "scaled_fp8_quant_tensor_scale") {
    ops::scaled_fp8_quant(m.view("input"), m.view("out"), m.view("scale"));
  } else if (op == "dynamic_scaled_fp8_quant") {
    ops::dynamic_scaled_fp8_quant(m.view("input"), m.view("out"), m.view("scale"));
  } else if (op == "cp_gather_cache") {
    ops::cp_gather_cache(m.view("src_cache"), m.view("dst"), m.view("block_table"),
                         m.view("cu_seq_lens"), m.integer("batch_size"),
                         m.optional_view("seq_starts"));
  } else if (op == "merge_attn_states") {
    ops::merge_attn_states(m.view("output"), m.optional_view("output_lse"), m.view("prefix_output"),
                           m.view("prefix_lse"), m.view("suffix_output"), m.view("suffix_lse"));
  } else if (op == "scaled_fp8_quant") {
    ops::scaled_fp8_quant(m.view("input"), m.view("out"), static_cast<float>(m.number("scale")));
  } else if (op == "mla_decode" || op == "mla_decode_tensor_scale") {
    decode(m, op == "mla_decode_tensor_scale");
  } else if (op == "mla_prefill") {
    ops::mla_prefill(m.view("q"), m.view("k_nope"), m.view("k_pe"), m.view("v"),
                     m.view("cu_seqlens_q"), m.view("cu_seqlens_k"), m.integer("max_seqlen_q"),
                     m.integer("max_seqlen_k"), static_cast<float>(m.number("scale")),
                     m.integer("causal") != 0, m.view("out"), m.optional_view("lse"));
  } else if (op == "batched_matmul") {
    ops::batched_matmul(m.view("a"), m.view("w"), m.view("c"));
  } else if (op == "absorb_kv_b_proj") {
    absorb_kv_b_proj(m.view("kv_b_proj_weight"), m.optional_view("kv_b_proj_scale_inv"), dims_of(m),
                     dtype_of(m.text("act_dtype")), device_of(m));
  } else if (op == "mla_attention") {
    const MlaAttention layer(attention_config(m), m.view("kv_b_proj_weight"),
                             m.optional_view("kv_b_proj_scale_inv"));
  } else {
    FAIL() << "no C++ runner for " << op;
  }
}

class ErrorTableCpp : public ::testing::TestWithParam<std::string> {};

TEST_P(ErrorTableCpp, EveryMalformedCallThrowsNamingTheArgument) {
  const std::string op = GetParam();
  check_table(op, "cpp", [&](const Materialized& m) {
    try {
      call(op, m);
      return Outcome{};
    } catch (const Error& e) {
      return Outcome{false, status_name(e.code()), e.what()};
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ops, ErrorTableCpp, ::testing::ValuesIn(table_ops()), op_test_name);

}  // namespace
}  // namespace mlakit::errors
