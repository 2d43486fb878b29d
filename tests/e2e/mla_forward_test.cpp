// MlaAttention::forward end to end against the fp64 oracle (spec D.1, D.12), on the CPU backend.
#include <gtest/gtest.h>

#include <vector>

#include "common/mla_harness.hpp"
#include "common/test_util.hpp"
#include "mlakit/attention.hpp"
#include "mlakit/error.hpp"

namespace mlakit::test {
namespace {

MlaDims deepseek_dims(int64_t heads) { return MlaDims{heads, 512, 64, 128, 128}; }
// Small dims keep the fp64 oracle cheap for wide grids; the code paths are the same.
MlaDims small_dims() { return MlaDims{4, 64, 16, 32, 32}; }

struct BatchSpec {
  const char* name;
  std::vector<int32_t> seq_lens, query_lens;
  int64_t decode_threshold = 1;
};

// D.1's batch specs, with sequence lengths scaled down so the fp64 oracle stays fast.
const std::vector<BatchSpec>& d1_specs() {
  static const std::vector<BatchSpec> specs = {
      {"small_decode", {32, 40}, {1, 1}},
      {"small_prefill", {32, 40}, {8, 8}},
      {"mixed_small", {32, 40, 48, 56}, {1, 1, 5, 5}},
      {"medium_decode", {128, 256, 17, 1}, {1, 1, 1, 1}},
      {"mixed_medium", {128, 200, 65, 128, 100, 64}, {1, 1, 1, 7, 7, 7}},
      {"single_prefill", {160}, {64}},
      {"spec_decode", {40, 64, 80, 100}, {4, 4, 4, 4}, 4},
      {"spec_decode_as_prefill", {40, 64, 80, 100}, {4, 4, 4, 4}, 1},
      {"one_token_requests", {1, 2, 1}, {1, 1, 1}},
  };
  return specs;
}

struct Variant {
  const char* name;
  DType act;
  KvCacheDType kv;
  float q_scale, k_scale;
};

void run_spec(const BatchSpec& spec, const MlaDims& dims, const Variant& var, int64_t block_size,
              uint64_t stream) {
  E2eCase c;
  c.name = std::string(spec.name) + "/" + var.name;
  c.dims = dims;
  c.act_dtype = var.act;
  c.kv_dtype = var.kv;
  c.q_scale = var.q_scale;
  c.k_scale = var.k_scale;
  c.block_size = block_size;
  c.seq_lens = spec.seq_lens;
  c.query_lens = spec.query_lens;
  c.decode_threshold = spec.decode_threshold;
  c.support = spec.decode_threshold > 1 ? QueryLenSupport::kUniform : QueryLenSupport::kVarlen;
  c.seed_stream = stream;
  SCOPED_TRACE(c.name);
  run_e2e_case(c);
}

TEST(MlaForward, DeepSeekDimsBf16AutoCache) {
  uint64_t stream = 100;
  for (const BatchSpec& spec : d1_specs())
    run_spec(spec, deepseek_dims(16), {"bf16-auto", DType::kBF16, KvCacheDType::kAuto, 1, 1}, 16,
             stream++);
}

TEST(MlaForward, DeepSeekDims128Heads) {
  const Variant var{"bf16-auto", DType::kBF16, KvCacheDType::kAuto, 1, 1};
  run_spec(d1_specs()[0], deepseek_dims(128), var, 64, 200);
  run_spec(d1_specs()[2], deepseek_dims(128), var, 64, 201);
  run_spec(d1_specs()[0], deepseek_dims(128),
           {"f32-fp8-scales-2-3", DType::kF32, KvCacheDType::kFp8E4m3, 2, 3}, 64, 202);
}

TEST(MlaForward, DeepSeekDimsFp8Caches) {
  const std::vector<Variant> variants = {
      {"bf16-fp8-scales-2-3", DType::kBF16, KvCacheDType::kFp8E4m3, 2, 3},
      {"bf16-fp8_ds_mla", DType::kBF16, KvCacheDType::kFp8DsMla, 1, 1},
  };
  uint64_t stream = 300;
  for (const Variant& var : variants)
    for (int i : {2, 6})  // mixed_small, spec_decode
      run_spec(d1_specs()[i], deepseek_dims(16), var, 64, stream++);
}

TEST(MlaForward, SmallDimsEveryDtypeCacheAndBlockSize) {
  const std::vector<Variant> variants = {
      {"f32-auto", DType::kF32, KvCacheDType::kAuto, 1, 1},
      {"f16-auto", DType::kF16, KvCacheDType::kAuto, 1, 1},
      {"bf16-auto", DType::kBF16, KvCacheDType::kAuto, 1, 1},
      {"f32-fp8-1-1", DType::kF32, KvCacheDType::kFp8E4m3, 1, 1},
      {"bf16-fp8-2-3", DType::kBF16, KvCacheDType::kFp8E4m3, 2, 3},
  };
  uint64_t stream = 400;
  for (const Variant& var : variants)
    for (int64_t bs : {1, 16, 64})
      for (const BatchSpec& spec : d1_specs()) run_spec(spec, small_dims(), var, bs, stream++);
}

E2eCase multi_chunk_case(const MlaDims& dims, DType act, KvCacheDType kv, ChunkPolicy policy) {
  E2eCase c;
  c.name = "multi_chunk";
  c.dims = dims;
  c.act_dtype = act;
  c.kv_dtype = kv;
  c.block_size = 16;
  // A decode, a zero-context prefill, a long-context prefill and a short-context one.
  c.seq_lens = {150, 8, 260, 45, 17};
  c.query_lens = {1, 8, 20, 5, 16};
  c.workspace_tokens = 64;  // 4 pages: forces many context chunks
  c.chunk_policy = policy;
  return c;
}

TEST(MlaForward, ContextInThreeOrMoreChunksMergedByLse) {
  uint64_t stream = 500;
  for (ChunkPolicy policy : {ChunkPolicy::kEqualShare, ChunkPolicy::kPacked}) {
    for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3}) {
      E2eCase c = multi_chunk_case(small_dims(), DType::kF32, kv, policy);
      c.seed_stream = stream++;
      const E2eResult r = run_e2e_case(c);
      EXPECT_GE(r.context_chunks, 3);
      EXPECT_EQ(r.num_decodes, 1);
    }
  }
  E2eCase c =
      multi_chunk_case(deepseek_dims(16), DType::kBF16, KvCacheDType::kAuto, ChunkPolicy::kPacked);
  c.seed_stream = stream++;
  EXPECT_GE(run_e2e_case(c).context_chunks, 3);
}

TEST(MlaForward, CudaGraphPaddedDecodeBatch) {
  E2eCase c;
  c.name = "padded_uniform_decode";
  c.dims = small_dims();
  c.act_dtype = DType::kBF16;
  c.seq_lens = {33, 64, 7};
  c.query_lens = {1, 1, 1};
  c.padding_requests = 2;  // q_len 0, seq_len 0, block-table rows -1
  c.padding_tokens = 2;    // num_actual_tokens = 5 = requests x q_len
  c.support = QueryLenSupport::kUniform;
  c.seed_stream = 600;
  const E2eResult r = run_e2e_case(c);
  EXPECT_EQ(r.num_decodes, 5);
}

TEST(MlaForward, RandomBatches) {
  auto rng = make_rng(700);
  for (int iter = 0; iter < 24; ++iter) {
    E2eCase c = random_case(rng, iter, /*max_context=*/90, /*max_query=*/12, /*chunk_blocks=*/8);
    c.seed_stream = 701 + iter;
    SCOPED_TRACE(c.name);
    run_e2e_case(c);
  }
}

TEST(MlaForward, ProfileRunZeroFillsOutput) {
  const MlaDims dims = small_dims();
  MlaAttentionConfig cfg;
  cfg.dims = dims;
  cfg.scale = 0.2f;
  cfg.act_dtype = DType::kF32;
  auto rng = make_rng(800);
  Tensor w =
      random_tensor(rng, {dims.num_heads * dims.kv_b_out_dim(), dims.kv_lora_rank}, DType::kF32);
  MlaAttention attn(cfg, w);
  Tensor out = nan_tensor({5, dims.num_heads * dims.v_head_dim}, DType::kF32);
  Tensor empty = Tensor::empty({0, 1, 1}, DType::kF32);
  attn.forward(empty, empty, empty, empty, nullptr, out);
  EXPECT_TRUE(all_close(out, std::vector<double>(out.numel(), 0.0), {0, 0}));
}

}  // namespace
}  // namespace mlakit::test
