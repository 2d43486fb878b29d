// The engine path (mlakit/step.hpp): one StepPlan per step over one Workspace shared by every
// layer, against the fp64 oracle; the workspace's worst-case sizing; what plan_step and forward
// reject.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/mla_harness.hpp"
#include "common/test_util.hpp"
#include "mlakit/attention.hpp"
#include "mlakit/dist.hpp"
#include "mlakit/error.hpp"
#include "mlakit/step.hpp"

namespace mlakit::test {
namespace {

MlaDims small_dims() { return MlaDims{4, 64, 16, 32, 32}; }

// fn() must throw mlakit::Error with `code` and a message containing `substring`.
template <class Fn>
void expect_error(Fn&& fn, ErrorCode code, const std::string& substring) {
  try {
    fn();
    ADD_FAILURE() << "expected mlakit::Error containing '" << substring << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(substring), std::string::npos) << e.what();
  }
}

E2eCase step_case(const std::string& name, std::vector<int32_t> seq_lens,
                  std::vector<int32_t> query_lens, uint64_t seed) {
  E2eCase c;
  c.name = name;
  c.dims = small_dims();
  c.act_dtype = DType::kBF16;
  c.block_size = 16;
  c.seq_lens = std::move(seq_lens);
  c.query_lens = std::move(query_lens);
  c.step_plan = true;
  c.seed_stream = seed;
  return c;
}

TEST(StepPlan, LayersShareOnePlanAndWorkspace) {
  // Decodes, a prefill with context cut into several chunks, a fresh prefill; three layers.
  E2eCase c = step_case("three_layers_mixed", {70, 33, 150, 9}, {1, 1, 6, 9}, 1000);
  c.num_layers = 3;
  c.workspace_tokens = 48;  // 3 blocks: the 144-token context takes several chunks
  const E2eResult r = run_e2e_case(c);
  EXPECT_EQ(r.num_decodes, 2);
  EXPECT_GE(r.context_chunks, 3);

  E2eCase fp8 = step_case("two_layers_fp8", {40, 90, 30}, {1, 1, 30}, 1001);
  fp8.num_layers = 2;
  fp8.kv_dtype = KvCacheDType::kFp8E4m3;
  fp8.q_scale = 2;
  fp8.k_scale = 3;
  run_e2e_case(fp8);

  E2eCase spec = step_case("spec_decode_uniform", {40, 64, 80}, {3, 3, 3}, 1002);
  spec.num_layers = 2;
  spec.decode_threshold = 3;
  spec.support = QueryLenSupport::kUniform;
  EXPECT_EQ(run_e2e_case(spec).num_decodes, 3);
}

TEST(StepPlan, DeepSeekDimsTwoLayers) {
  E2eCase c = step_case("deepseek_two_layers", {64, 130, 40}, {1, 1, 12}, 1010);
  c.dims = MlaDims{16, 512, 64, 128, 128};
  c.num_layers = 2;
  run_e2e_case(c);
}

TEST(StepPlan, PaddingRowsAreZeroInEveryKindOfBatch) {
  // Padding requests (q_len 0, seq_len 0) and padded tokens after prefills, then after decodes.
  for (bool step : {false, true}) {
    E2eCase mixed = step_case("padded_after_prefill", {30, 20}, {1, 20}, 1020);
    mixed.step_plan = step;
    mixed.padding_requests = 2;
    mixed.padding_tokens = 3;
    run_e2e_case(mixed);
    E2eCase decode = step_case("padded_decode_only", {30, 41}, {1, 1}, 1021);
    decode.step_plan = step;
    decode.padding_requests = 2;
    decode.padding_tokens = 2;
    decode.support = QueryLenSupport::kUniform;
    run_e2e_case(decode);
  }
}

TEST(StepPlan, BatchInvariantScheduleStillMatchesTheOracle) {
  E2eCase c = step_case("batch_invariant", {3000, 70, 1100}, {1, 1, 1}, 1030);
  c.batch_invariant = true;
  c.block_size = 64;
  run_e2e_case(c);
}

TEST(StepPlan, RandomBatchesAgainstTheOracle) {
  auto rng = make_rng(1040);
  for (int iter = 0; iter < 12; ++iter) {
    E2eCase c = random_case(rng, iter, /*max_context=*/120, /*max_query=*/10, /*chunk_blocks=*/4);
    c.name = "random_step_" + std::to_string(iter);
    c.step_plan = true;
    c.num_layers = 1 + iter % 3;
    c.seed_stream = 1041 + iter;
    SCOPED_TRACE(c.name);
    run_e2e_case(c);
  }
}

// fuzz_capi's finding tests/fuzz/corpus/capi/f3bb9a21d3efe7fe897691a38b9d88cf01562558: a varlen
// decode-only batch whose padded tokens after its last request (num_actual_tokens >
// query_start_loc[R]) are decode tokens (spec B.4: (R, 0, T, 0)), more of them than max_num_seqs *
// decode_threshold, the decode rows the workspace is sized for. forward failed with "workspace
// arena overflow"; the padded tokens now get zero rows without decode temporaries, and the decodes
// match the oracle.
TEST(StepPlan, PaddedTokensAfterVarlenDecodesFitTheWorkspace) {
  for (bool step : {false, true}) {
    // The finding's layer and batch: N 2, L 512, R 64, P 1, V 4 (a decode row outweighs a prefill
    // row), f16, fp8_ds_mla cache, block size 1, one-row chunks; four decodes of one token without
    // context, and one padded token.
    E2eCase c = step_case("fuzz_padded_decode_only", {1, 1, 1, 1}, {1, 1, 1, 1}, 1070);
    c.dims = MlaDims{2, 512, 64, 1, 4};
    c.act_dtype = DType::kF16;
    c.kv_dtype = KvCacheDType::kFp8DsMla;
    c.block_size = 1;
    c.workspace_tokens = 1;
    c.padding_tokens = 1;
    c.step_plan = step;
    EXPECT_EQ(run_e2e_case(c).num_decodes, 4);

    // Decodes with context, more padded tokens than requests.
    E2eCase ctx = step_case("padded_decodes_with_context", {30, 41, 17}, {1, 1, 1}, 1071);
    ctx.dims = MlaDims{2, 512, 64, 16, 16};
    ctx.padding_tokens = 6;
    ctx.step_plan = step;
    EXPECT_EQ(run_e2e_case(ctx).num_decodes, 3);

    // Varlen speculative decodes (q_len 2, 1, 2 under threshold 2) and padded tokens: the decode
    // rows reach num_decodes * 2 = 6, one past the decodes' 5 tokens.
    E2eCase spec = step_case("padded_varlen_spec_decodes", {30, 41, 17}, {2, 1, 2}, 1072);
    spec.dims = MlaDims{2, 512, 64, 16, 16};
    spec.decode_threshold = 2;
    spec.padding_tokens = 5;
    spec.step_plan = step;
    EXPECT_EQ(run_e2e_case(spec).num_decodes, 3);
  }
}

// A padding request (q_len 0, seq_len 0) between decodes of one q_len: the decodes' tokens are not
// at rows b * q_len, so the decode may not read them as one [num_decodes, q_len] block (the third
// request's token sits at row 1, not 2). With one padded token the counts still add up (3 decodes,
// 3 decode tokens), which hid it.
TEST(StepPlan, PaddingRequestBetweenDecodesKeepsEachTokenInItsRow) {
  for (bool step : {false, true}) {
    E2eCase c = step_case("padding_request_between_decodes", {5, 0, 5}, {1, 0, 1}, 1080);
    c.padding_tokens = 1;
    c.step_plan = step;
    EXPECT_EQ(run_e2e_case(c).num_decodes, 3);

    E2eCase spec = step_case("padding_request_between_spec_decodes", {9, 30, 0, 12, 0, 40},
                             {2, 2, 0, 2, 0, 2}, 1081);
    spec.decode_threshold = 2;
    spec.padding_tokens = 4;
    spec.step_plan = step;
    EXPECT_EQ(run_e2e_case(spec).num_decodes, 6);
  }
}

// ---- Sizing ----------------------------------------------------------------------------------

MlaAttentionConfig deepseek_v3_config() {
  MlaAttentionConfig c;
  c.dims = MlaDims{128, 512, 64, 128, 128};
  c.scale = 0.1352338f;
  c.act_dtype = DType::kBF16;
  c.block_size = 64;
  c.max_num_batched_tokens = 8192;
  c.max_num_seqs = 256;
  c.max_model_len = 163840;
  return c;
}

TEST(StepPlan, DeepSeekV3WorkspaceFitsTwoGiB) {
  const MlaAttentionConfig c = deepseek_v3_config();
  const int64_t bytes = workspace_bytes(c);
  EXPECT_LE(bytes, int64_t{2} << 30) << bytes << " bytes";
  // The new tokens' up-projection alone is 8192 x 128 x 256 bf16 = 512 MiB: the bound is real.
  EXPECT_GE(bytes, int64_t{512} << 20);
  EXPECT_EQ(context_chunk_rows(c), 8192);  // the chunk size that keeps kv_up at 512 MiB
  MlaAttentionConfig fp8 = c;
  fp8.kv_cache_dtype = KvCacheDType::kFp8DsMla;
  EXPECT_LE(workspace_bytes(fp8), int64_t{2} << 30);
}

// Limits and dims valid one by one (each at most 2^31 - 1) whose products pass int64: the arena
// that measures the workspace wrapped them and workspace_bytes returned a small wrong size
// (1125867698336512 bytes for 2^31 - 1 tokens of 2^16 heads of 2^16 values; the first temporary
// past int64 is the up-projection kv_up [tokens, N (P + V)]).
TEST(StepPlan, WorkspaceSizesPastInt64AreRefused) {
  MlaAttentionConfig c;
  c.dims = MlaDims{int64_t{1} << 16, 64, 16, 32, int64_t{1} << 16};
  c.scale = 0.3f;
  c.act_dtype = DType::kF32;
  c.max_num_batched_tokens = 2147483647;
  expect_error([&] { (void)workspace_bytes(c); }, ErrorCode::kInvalidArgument,
               "workspace_bytes: a step temporary of shape [2147483647, 4297064448] f32 takes "
               "the workspace past 2^63 bytes");
  expect_error([&] { Workspace workspace(c); }, ErrorCode::kInvalidArgument,
               "takes the workspace past 2^63 bytes");
}

// Random engine limits and random steps within them, padded ones included: plan_step never runs
// out of the workspace that workspace_bytes sized (index entries, chunks, decode splits included).
void expect_random_steps_fit_the_worst_case_workspace(const MlaDims& dims) {
  auto rng = make_rng(1050);
  auto padding_rng = make_rng(1051);  // a stream of its own: the batches stay those drawn before
  std::uniform_int_distribution<int> coin(0, 1);
  for (int config_iter = 0; config_iter < 12; ++config_iter) {
    MlaAttentionConfig c;
    c.dims = dims;
    c.scale = 0.3f;
    c.act_dtype = DType::kF32;
    c.block_size = std::vector<int64_t>{1, 4, 16, 64}[config_iter % 4];
    c.max_num_seqs = std::uniform_int_distribution<int>(1, 12)(rng);
    c.max_model_len = std::uniform_int_distribution<int>(1, 700)(rng);
    c.max_num_batched_tokens = std::uniform_int_distribution<int>(1, 300)(rng);
    c.decode_threshold = std::uniform_int_distribution<int>(1, 4)(rng);
    c.chunk_policy = coin(rng) ? ChunkPolicy::kPacked : ChunkPolicy::kEqualShare;
    c.workspace_tokens =
        coin(rng) ? 0 : c.block_size * std::uniform_int_distribution<int>(1, 6)(rng);
    c.batch_invariant = coin(rng);
    Workspace workspace(c);
    const int64_t width = (c.max_model_len + c.block_size - 1) / c.block_size + 1;
    Tensor table = Tensor::zeros({c.max_num_seqs, width}, DType::kI32);
    Tensor slots = Tensor::empty({c.max_num_batched_tokens}, DType::kI64);
    std::fill_n(slots.data<int64_t>(), c.max_num_batched_tokens, -1);
    for (int iter = 0; iter < 40; ++iter) {
      // Decodes (context > 0, q_len <= threshold) first, then prefills, within every limit.
      std::vector<int32_t> qsl{0}, seq_lens;
      const int reqs = std::uniform_int_distribution<int>(1, static_cast<int>(c.max_num_seqs))(rng);
      bool decodes = true;
      for (int i = 0; i < reqs; ++i) {
        const int64_t budget = c.max_num_batched_tokens - qsl.back();
        if (budget <= 0) break;
        decodes = decodes && coin(rng) && c.max_model_len > 1;
        const int64_t q_max = decodes ? std::min<int64_t>(c.decode_threshold, c.max_model_len - 1)
                                      : std::min<int64_t>(budget, c.max_model_len);
        const int ql =
            std::uniform_int_distribution<int>(1, static_cast<int>(std::min(q_max, budget)))(rng);
        const int ctx_min = decodes ? 1 : 0;
        const int ctx = std::uniform_int_distribution<int>(
            ctx_min, static_cast<int>(std::max<int64_t>(ctx_min, c.max_model_len - ql)))(rng);
        qsl.push_back(qsl.back() + ql);
        seq_lens.push_back(std::min<int32_t>(ctx + ql, static_cast<int32_t>(c.max_model_len)));
        if (seq_lens.back() < ql) seq_lens.back() = ql;
      }
      ForwardBatch batch;
      batch.query_start_loc = qsl;
      batch.seq_lens = seq_lens;
      // Padded tokens after the last request on every other step, up to the limit: a decode-only
      // step counts them as decode tokens (spec B.4).
      batch.num_actual_tokens = qsl.back();
      if (coin(padding_rng)) {
        batch.num_actual_tokens += std::uniform_int_distribution<int64_t>(
            0, c.max_num_batched_tokens - qsl.back())(padding_rng);
      }
      batch.block_table = table;
      batch.slot_mapping = slots;
      const StepPlan step = plan_step(c, batch, workspace);
      EXPECT_LE(step.workspace_bytes_used(), workspace.bytes());
    }
  }
}

TEST(StepPlan, RandomStepsFitTheWorstCaseWorkspace) {
  expect_random_steps_fit_the_worst_case_workspace(small_dims());
  // A decode row (L + R = 576 wide) outweighs a prefill row (N (P + V) = 10) here, so the decode
  // phase sizes the workspace.
  expect_random_steps_fit_the_worst_case_workspace(MlaDims{2, 512, 64, 1, 4});
}

// ---- Plans across steps ----------------------------------------------------------------------

class StepPlanRules : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_.dims = small_dims();
    cfg_.scale = 0.3f;
    cfg_.act_dtype = DType::kF32;
    cfg_.block_size = 4;
    cfg_.max_num_seqs = 4;
    cfg_.max_model_len = 64;
    cfg_.max_num_batched_tokens = 16;
    table_ = Tensor::zeros({4, 16}, DType::kI32);
    slots_ = Tensor::empty({16}, DType::kI64);
    std::fill_n(slots_.data<int64_t>(), 16, -1);
  }
  ForwardBatch batch(const std::vector<int32_t>& qsl, const std::vector<int32_t>& lens) {
    qsl_ = qsl;
    lens_ = lens;
    ForwardBatch b;
    b.query_start_loc = qsl_;
    b.seq_lens = lens_;
    b.num_actual_tokens = qsl_.back();
    b.block_table = table_;
    b.slot_mapping = slots_;
    return b;
  }

  MlaAttentionConfig cfg_;
  Tensor table_, slots_;
  std::vector<int32_t> qsl_, lens_;
};

TEST_F(StepPlanRules, StalePlanIsRejected) {
  Workspace ws(cfg_);
  auto rng = make_rng(1060);
  const MlaDims& d = cfg_.dims;
  MlaAttention layer(
      cfg_, random_tensor(rng, {d.num_heads * d.kv_b_out_dim(), d.kv_lora_rank}, DType::kF32));
  const StepPlan first = plan_step(cfg_, batch({0, 1, 2}, {9, 20}), ws);
  const StepPlan second = plan_step(cfg_, batch({0, 1, 2}, {10, 21}), ws);
  Tensor q = random_tensor(rng, {2, d.num_heads, d.qk_head_dim()}, DType::kF32);
  Tensor kv = random_tensor(rng, {2, d.entry_dim()}, DType::kF32);
  Tensor cache = random_tensor(rng, {20, 4, d.entry_dim()}, DType::kF32);
  Tensor out = nan_tensor({2, d.num_heads * d.v_head_dim}, DType::kF32);
  const TensorView kv_c = kv.view().narrow(1, 0, d.kv_lora_rank);
  const TensorView k_pe = kv.view().narrow(1, d.kv_lora_rank, d.qk_rope_head_dim);
  expect_error([&] { layer.forward(q, kv_c, k_pe, cache, first, out); },
               ErrorCode::kInvalidArgument, "stale");
  EXPECT_NO_THROW(layer.forward(q, kv_c, k_pe, cache, second, out));
  expect_error([&] { layer.forward(q, kv_c, k_pe, cache, StepPlan(), out); },
               ErrorCode::kInvalidArgument, "empty");
}

TEST_F(StepPlanRules, ConfigurationsMustMatch) {
  Workspace ws(cfg_);
  MlaAttentionConfig other = cfg_;
  other.block_size = 8;
  expect_error(
      [&] {
        plan_step(other, batch({0, 1}, {5}), ws);
      },
      ErrorCode::kInvalidArgument, "sized for");
  const StepPlan step = plan_step(cfg_, batch({0, 1}, {5}), ws);
  auto rng = make_rng(1061);
  const MlaDims& d = cfg_.dims;
  MlaAttention layer(
      other, random_tensor(rng, {d.num_heads * d.kv_b_out_dim(), d.kv_lora_rank}, DType::kF32));
  Tensor q = random_tensor(rng, {1, d.num_heads, d.qk_head_dim()}, DType::kF32);
  Tensor kv = random_tensor(rng, {1, d.entry_dim()}, DType::kF32);
  Tensor cache = random_tensor(rng, {20, 8, d.entry_dim()}, DType::kF32);
  Tensor out = nan_tensor({1, d.num_heads * d.v_head_dim}, DType::kF32);
  expect_error(
      [&] {
        layer.forward(q, kv.view().narrow(1, 0, d.kv_lora_rank),
                      kv.view().narrow(1, d.kv_lora_rank, d.qk_rope_head_dim), cache, step, out);
      },
      ErrorCode::kInvalidArgument, "another configuration");
}

TEST_F(StepPlanRules, StepsBeyondTheLimitsAreRejectedByName) {
  Workspace ws(cfg_);
  expect_error(
      [&] {
        plan_step(cfg_, batch({0, 1, 2, 3, 4, 5}, {5, 5, 5, 5, 5}), ws);
      },
      ErrorCode::kInvalidArgument, "max_num_seqs");
  expect_error(
      [&] {
        plan_step(cfg_, batch({0, 17}, {20}), ws);
      },
      ErrorCode::kInvalidArgument, "max_num_batched_tokens");
  expect_error(
      [&] {
        plan_step(cfg_, batch({0, 1}, {65}), ws);
      },
      ErrorCode::kInvalidArgument, "max_model_len");
}

TEST_F(StepPlanRules, SameLaunchesForTheSameShape) {
  Workspace ws(cfg_), other_ws(cfg_);
  const StepPlan a = plan_step(cfg_, batch({0, 1, 2}, {9, 20}), ws);
  // Another step of the same shape: a graph captured for `a` replays it.
  const StepPlan b = plan_step(cfg_, batch({0, 1, 2}, {9, 20}), ws);
  EXPECT_TRUE(a.same_launches(b));
  const StepPlan more_tokens = plan_step(cfg_, batch({0, 1, 2, 3}, {9, 20, 4}), ws);
  EXPECT_FALSE(a.same_launches(more_tokens));
  const StepPlan elsewhere = plan_step(cfg_, batch({0, 1, 2}, {9, 20}), other_ws);
  EXPECT_FALSE(a.same_launches(elsewhere));
}

TEST_F(StepPlanRules, PlanValidatesTheBatchLikeForward) {
  auto rng = make_rng(1062);
  const MlaDims& d = cfg_.dims;
  MlaAttention layer(
      cfg_, random_tensor(rng, {d.num_heads * d.kv_b_out_dim(), d.kv_lora_rank}, DType::kF32));
  ForwardBatch b = batch({0, 1, 2}, {9, 20});
  Tensor short_table = Tensor::zeros({1, 16}, DType::kI32);  // fewer rows than requests
  b.block_table = short_table;
  expect_error([&] { layer.plan(b); }, ErrorCode::kInvalidArgument, "batch.block_table");
  Tensor narrow_table = Tensor::zeros({2, 2}, DType::kI32);  // request 1 needs 5 blocks
  b.block_table = narrow_table;
  expect_error([&] { layer.plan(b); }, ErrorCode::kOutOfRange, "block_table_width");
}

// Rank 0 of a DCP group of two whose other rank holds the same values: all_gather repeats this
// rank's send, reduce_scatter_sum returns this rank's slice. Enough to run one rank's forward.
class MirrorCommunicator final : public dist::Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  Device device() const override { return Device::cpu(); }
  const char* backend_name() const override { return "mirror"; }

 protected:
  void all_gather_impl(const void* send, void* recv, int64_t count, DType dtype, Stream) override {
    const auto bytes = static_cast<size_t>(count * dtype_size(dtype));
    for (int k = 0; k < world_size(); ++k) {
      void* slot = static_cast<char*>(recv) + k * bytes;
      if (slot != send) std::memmove(slot, send, bytes);
    }
  }
  void reduce_scatter_sum_impl(const void* send, void* recv, int64_t recv_count, DType dtype,
                               Stream) override {
    const auto bytes = static_cast<size_t>(recv_count * dtype_size(dtype));
    std::memcpy(recv, static_cast<const char*>(send) + rank() * bytes, bytes);
  }
};

// Rank 0 of two (interleave 1; the config's dcp says so) over a MirrorCommunicator: its
// workspace and its layer, with random weights.
struct DcpRankZero {
  MirrorCommunicator comm;
  Workspace ws;
  MlaAttention layer;
  DcpRankZero(const MlaAttentionConfig& config, std::mt19937_64& rng)
      : ws(config),
        layer(
            config,
            random_tensor(
                rng, {config.dims.num_heads * config.dims.kv_b_out_dim(), config.dims.kv_lora_rank},
                DType::kF32),
            std::nullopt, &comm) {}
};

// A step's random f32 inputs: q [tokens, N, P + R], kv [tokens, L + R] (kv_c and k_pe its column
// views), a cache of `blocks` blocks of 4 entries, out [tokens, N V] NaN.
struct StepInputs {
  Tensor q, kv, cache, out;
  TensorView kv_c, k_pe;
  StepInputs(const MlaDims& d, std::mt19937_64& rng, int64_t tokens, int64_t blocks)
      : q(random_tensor(rng, {tokens, d.num_heads, d.qk_head_dim()}, DType::kF32)),
        kv(random_tensor(rng, {tokens, d.entry_dim()}, DType::kF32)),
        cache(random_tensor(rng, {blocks, 4, d.entry_dim()}, DType::kF32)),
        out(nan_tensor({tokens, d.num_heads * d.v_head_dim}, DType::kF32)),
        kv_c(kv.view().narrow(1, 0, d.kv_lora_rank)),
        k_pe(kv.view().narrow(1, d.kv_lora_rank, d.qk_rope_head_dim)) {}
};

TEST_F(StepPlanRules, ARefusedPlanStepMakesEarlierPlansStale) {
  // Under DCP plan_step refuses a bad block id only after it has uploaded the step's indices
  // into the workspace: the earlier plan's indices are gone, so that plan must be stale, not
  // run with the refused step's lengths.
  cfg_.dcp = DcpConfig{.world_size = 2, .rank = 0, .interleave = 1};
  slots_ = Tensor::empty({0}, DType::kI64);  // DCP: plan_step derives the slots
  auto rng = make_rng(1063);
  DcpRankZero rank(cfg_, rng);
  Workspace& ws = rank.ws;
  const StepPlan first = plan_step(cfg_, batch({0, 1}, {9}), ws);
  // The second step's new token, position 10, is rank 0's local position 5: block table column 1.
  Tensor bad_table = Tensor::zeros({4, 16}, DType::kI32);
  bad_table.data<int32_t>()[1] = -1;
  ForwardBatch refused = batch({0, 1}, {11});
  refused.block_table = bad_table;
  expect_error([&] { plan_step(cfg_, refused, ws); }, ErrorCode::kOutOfRange, "block_table[0, 1]");

  StepInputs in(cfg_.dims, rng, 1, 4);
  expect_error([&] { rank.layer.forward(in.q, in.kv_c, in.k_pe, in.cache, first, in.out); },
               ErrorCode::kInvalidArgument, "stale");
  const StepPlan again = plan_step(cfg_, batch({0, 1}, {9}), ws);
  EXPECT_NO_THROW(rank.layer.forward(in.q, in.kv_c, in.k_pe, in.cache, again, in.out));
}

TEST_F(StepPlanRules, DcpForwardChecksLocalBlockIdsBeforeAnyWrite) {
  // Rank 0 of two (interleave 1) holds the even positions. Request 0 decodes position 13 of 14
  // (local keys 0-6: columns 0-1); request 1 prefills positions 7-8 after a 7-key context (local
  // context keys 0-3: column 0; position 8 is local 4, column 1, the step's only write here).
  cfg_.dcp = DcpConfig{.world_size = 2, .rank = 0, .interleave = 1};
  slots_ = Tensor::empty({0}, DType::kI64);  // DCP: plan_step derives the slots
  auto rng = make_rng(1064);
  DcpRankZero rank(cfg_, rng);
  int32_t* table = table_.data<int32_t>();  // [4, 16]
  for (const auto& [index, id] : {std::pair{0, 0}, {1, 1}, {16, 2}, {17, 3}}) table[index] = id;
  constexpr int64_t kNumBlocks = 4;  // the blocks the table uses
  StepInputs in(cfg_.dims, rng, 3, kNumBlocks);
  const Tensor &cache = in.cache, &out = in.out;
  auto forward = [&](const StepPlan& step) {
    rank.layer.forward(in.q, in.kv_c, in.k_pe, in.cache, step, in.out);
  };
  auto expect_refused = [&](const std::string& message) {
    const StepPlan step = plan_step(cfg_, batch({0, 1, 3}, {14, 9}), rank.ws);
    const std::vector<float> cache_before(cache.data<float>(), cache.data<float>() + cache.numel());
    expect_error([&] { forward(step); }, ErrorCode::kOutOfRange, message);
    EXPECT_EQ(0, std::memcmp(cache_before.data(), cache.data<float>(),
                             cache_before.size() * sizeof(float)));
    for (int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isnan(out.data<float>()[i])) << i;
  };
  table[1] = kNumBlocks;
  expect_refused(
      "batch.block_table[0, 1] = 4 is not a block id of kv_cache in [0, 4): decode request 0 "
      "reads it for local positions 4 to 6 of its 7 local keys (columns 0 to 1)");
  table[1] = 1;
  table[16] = -1;
  expect_refused(
      "batch.block_table[1, 0] = -1 is not a block id of kv_cache in [0, 4): prefill request 1 "
      "reads it for local context positions 0 to 3 of its 4 local context keys (columns 0 to 0)");
  table[16] = 2;
  const StepPlan step = plan_step(cfg_, batch({0, 1, 3}, {14, 9}), rank.ws);
  EXPECT_NO_THROW(forward(step));
}

}  // namespace
}  // namespace mlakit::test
