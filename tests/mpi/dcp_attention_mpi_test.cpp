// MlaAttention under decode context parallelism across real ranks (spec D.12; run by ctest under
// `mpirun -np W`, W in {1, 2, 4}): every rank serves its N query heads of a model of W N heads and
// holds its share of every request's tokens in a cache of its own; forward() writes the new
// tokens through the DCP slot mapping, gathers the context chunks from all ranks and combines the
// decode across them. On mixed batches (decodes, prefills with and without context, contexts long
// enough for several chunks, requests some ranks hold no token of) every rank's output must equal
// the single-rank layer over the whole cache (same heads, same inputs) to rounding, and both must
// be within tolerance of the fp64 oracle (the harness checks each run against it). Caches auto and
// fp8_e4m3, block sizes 16 and 64, interleaves 1, 2, 16 and 64, the single-call form and the
// engine form (plan_step over a shared workspace, two layers, a padding request).
//
// Checks are EXPECTs between collectives: a failing rank keeps joining them (main() aborts the
// whole job on an exception, see mpi_gtest_main.cpp).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/mla_harness.hpp"
#include "common/test_util.hpp"
#include "mlakit/dist_mpi.hpp"

namespace mlakit {
namespace {

// Context of the long requests: several chunks of kWorkspaceTokens rows, yet a quick oracle (CI
// time; sanitizer builds run ~3x slower and get half of it).
// kWorkspaceTokens is a multiple of every DCP alignment lcm(block_size, W I) here (at most
// lcm(64, 4 * 64) = 256), so the single-rank and the DCP layer may share it.
#if defined(__SANITIZE_ADDRESS__)
constexpr int32_t kLongContext = 1250;
constexpr int64_t kWorkspaceTokens = 512;
#else
constexpr int32_t kLongContext = 2500;
constexpr int64_t kWorkspaceTokens = 1024;
#endif

struct Config {
  KvCacheDType kv;
  int64_t block_size;
  int64_t interleave;
  bool engine_form;  // plan_step over a shared workspace, 2 layers, a padding request
};

std::vector<Config> all_configs() {
  std::vector<Config> configs;
  bool engine_form = false;
  for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3})
    for (int64_t bs : {16, 64})
      for (int64_t interleave : {1, 2, 16, 64}) {
        configs.push_back({kv, bs, interleave, engine_form});
        engine_form = !engine_form;
      }
  return configs;
}

// The global batch, the same on every rank: decodes first (q_len 1; lengths around one turn of
// the ranks W I and whole blocks, one long), then prefills (no context, a context shorter than
// one turn so that most ranks hold none of it, whole blocks less one, a long context).
test::E2eCase make_case(const Config& c, int64_t w, int64_t rank, uint64_t stream) {
  const auto turn = static_cast<int32_t>(w * c.interleave);
  const auto bs = static_cast<int32_t>(c.block_size);
  test::E2eCase e;
  e.name = std::string(kv_cache_dtype_name(c.kv)) + " block_size " + std::to_string(bs) +
           " interleave " + std::to_string(c.interleave) + (c.engine_form ? " engine" : "");
  e.dims = MlaDims{2, 64, 16, 32, 32};  // small: the fp64 oracle over long contexts stays quick
  e.act_dtype = DType::kBF16;
  e.kv_dtype = c.kv;
  e.k_scale = c.kv == KvCacheDType::kAuto ? 1.0f : 0.05f;  // N(0, 1) / 0.05 stays inside +-448
  e.q_scale = c.kv == KvCacheDType::kAuto ? 1.0f : 0.05f;
  e.block_size = c.block_size;
  e.workspace_tokens = kWorkspaceTokens;
  const std::vector<std::pair<int32_t, int32_t>> context_and_query = {
      {turn, 1},       {3 * bs, 1},      {kLongContext - 700, 1},
      {1, 1},          {0, 5},           {std::max(turn - 1, 1), 3},
      {2 * bs - 1, 2}, {kLongContext, 6}};
  for (auto [context, query] : context_and_query) {
    e.seq_lens.push_back(context + query);
    e.query_lens.push_back(query);
  }
  e.step_plan = c.engine_form;
  e.num_layers = c.engine_form ? 2 : 1;
  e.padding_requests = c.engine_form ? 1 : 0;
  e.seed_stream = stream;
  e.head_ranks = w;
  e.head_rank = rank;
  e.dcp_interleave = c.interleave;
  return e;
}

// Runs `single` as one rank and over the DCP group `comm`; returns the DCP run's result after
// checking its output against the single-rank layer's. The same values attended in other
// partitions (ranks, chunks) and orders of f32 sums: equal to the rounding of the bf16 output.
test::E2eResult expect_dcp_matches_single_rank(const test::E2eCase& single,
                                               dist::Communicator* comm) {
  test::E2eCase dcp = single;
  dcp.name += " (DCP)";
  dcp.dcp_comm = comm;
  const test::E2eResult expected = test::run_e2e_case(single);
  test::E2eResult got = test::run_e2e_case(dcp);
  EXPECT_TRUE(test::all_close(got.output, test::to_doubles(expected.output),
                              test::tolerance_for(DType::kBF16)))
      << "DCP vs single-rank layer";
  return got;
}

TEST(DcpAttentionMpi, EveryRankMatchesTheSingleRankLayerAndTheOracle) {
  const std::unique_ptr<dist::Communicator> comm = dist::make_mpi_communicator(MPI_COMM_WORLD);
  const int64_t w = comm->world_size(), rank = comm->rank();
  uint64_t stream = 1900;
  for (const Config& c : all_configs()) {
    test::E2eCase single = make_case(c, w, rank, ++stream);
    SCOPED_TRACE(single.name + ", rank " + std::to_string(rank) + " of " + std::to_string(w));
    const test::E2eResult got = expect_dcp_matches_single_rank(single, comm.get());
    EXPECT_EQ(got.num_decodes, 4);
    EXPECT_GE(got.context_chunks, 3);  // the prefill contexts, > 2.4 kWorkspaceTokens rows
  }
}

// A batch of decodes alone with padded tokens after its last request (spec B.4 makes them decode
// tokens), more of them than max_num_seqs * decode_threshold: every rank exchanges the decode
// requests' rows only (the same count on every rank), and the padded tokens get zero rows (the
// harness checks them). Before, the decode phase carved a row per padded token too and overran the
// workspace (fuzz_capi's finding, tests/e2e/step_plan_test.cpp).
TEST(DcpAttentionMpi, PaddedTokensAfterDecodesOnEveryRank) {
  const std::unique_ptr<dist::Communicator> comm = dist::make_mpi_communicator(MPI_COMM_WORLD);
  const int64_t w = comm->world_size(), rank = comm->rank();
  uint64_t stream = 1950;
  for (bool engine_form : {false, true}) {
    test::E2eCase single;
    single.name = engine_form ? "padded decodes, engine" : "padded decodes";
    // Wide latent rows and one-block chunks: the decode phase outweighs the prefill phase.
    single.dims = MlaDims{2, 512, 64, 16, 16};
    single.act_dtype = DType::kBF16;
    single.block_size = 16;
    single.workspace_tokens = 16;  // lcm(block_size, W I) at W I = 2, 4 and 8
    single.seq_lens = {static_cast<int32_t>(2 * w) + 1, 49, 1};
    single.query_lens = {1, 1, 1};
    single.padding_tokens = 20;
    single.step_plan = engine_form;
    single.num_layers = engine_form ? 2 : 1;
    single.seed_stream = ++stream;
    single.head_ranks = w;
    single.head_rank = rank;
    single.dcp_interleave = 2;
    SCOPED_TRACE(single.name + ", rank " + std::to_string(rank) + " of " + std::to_string(w));
    EXPECT_EQ(expect_dcp_matches_single_rank(single, comm.get()).num_decodes, 3);
  }
}

}  // namespace
}  // namespace mlakit
