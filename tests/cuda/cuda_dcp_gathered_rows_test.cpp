// ops::dcp_gathered_rows on the GPU against the CPU op and the planner's own gathered_row
// (plan_dcp_context_chunks computes it on the host by another route; tests/cpu/dcp_chunks_test.cpp
// checks that against brute force). Inputs are the chunks of random batches planned for
// W in {1, 2, 4} and I in {1, 2, 16, 64}: contexts of 0 tokens, shorter than one turn of the ranks
// (ranks that hold no row of a request, or of the whole chunk), whole turns and blocks, long ones
// over several chunks. The destination is poisoned beyond num_tokens and must stay so; inputs the
// GPU cannot serve give -1 rows where the CPU throws.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.hpp"
#include "gpu_test_util.hpp"
#include "mlakit/dcp.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"
#include "mlakit/plan.hpp"

namespace mlakit {
namespace {

using test::to_device;
using test::to_host;

// Poison of the destination: the bit pattern of an f32 NaN, neither a row of the all-gathered
// buffer nor the -1 the GPU writes for a row it cannot place.
constexpr int32_t kPoison = 0x7fc00000;
// Poisoned rows after num_tokens: a kernel writing past its range would overwrite them.
constexpr int64_t kTailRows = 5;

Tensor poisoned_rows(int64_t rows) {
  Tensor t = Tensor::empty({rows}, DType::kI32);
  std::fill_n(t.data<int32_t>(), rows, kPoison);
  return t;
}

Tensor i32(const std::vector<int32_t>& values, std::initializer_list<int64_t> shape) {
  return test::int_tensor(std::vector<int64_t>(values.begin(), values.end()), shape, DType::kI32);
}

std::vector<int32_t> rows_of(const Tensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

// One chunk's inputs on the host.
struct ChunkInputs {
  Tensor cu_seq_lens;       // i32 [np + 1]
  Tensor seq_starts;        // i32 [np]
  Tensor rank_cu_seq_lens;  // i32 [W, np + 1]
  int64_t rows_per_rank = 0;
};

ChunkInputs inputs_of(const DcpContextChunk& chunk, int64_t w) {
  const auto np = static_cast<int64_t>(chunk.global.starts.size());
  return {i32(chunk.global.cu_seq_lens, {np + 1}), i32(chunk.global.starts, {np}),
          i32(chunk.rank_cu_seq_lens, {w, np + 1}), chunk.rows_per_rank};
}

// The op on the CPU and on the GPU into poisoned [num_tokens + kTailRows] destinations.
struct Results {
  std::vector<int32_t> cpu, gpu;
};
Results run_both(const ChunkInputs& in, int64_t interleave, int64_t num_tokens) {
  Tensor cpu = poisoned_rows(num_tokens + kTailRows);
  ops::dcp_gathered_rows(in.cu_seq_lens, in.seq_starts, in.rank_cu_seq_lens, in.rows_per_rank,
                         interleave, cpu.view().narrow(0, 0, num_tokens), num_tokens);
  Tensor gpu = to_device(poisoned_rows(num_tokens + kTailRows));
  ops::dcp_gathered_rows(to_device(in.cu_seq_lens), to_device(in.seq_starts),
                         to_device(in.rank_cu_seq_lens), in.rows_per_rank, interleave,
                         gpu.view().narrow(0, 0, num_tokens), num_tokens);
  return {rows_of(cpu), rows_of(to_host(gpu))};
}

// Context lengths around the layout's edges for W ranks of interleave I and block size bs.
std::vector<int32_t> random_contexts(std::mt19937_64& rng, int64_t w, int64_t interleave,
                                     int64_t bs) {
  const auto turn = static_cast<int32_t>(w * interleave), block = static_cast<int32_t>(bs);
  const auto below_one_run = static_cast<int32_t>(std::max<int64_t>(interleave - 1, 1));
  const std::vector<int32_t> edges = {0,    1,        below_one_run, turn - 1,
                                      turn, turn + 1, block,         3 * block - 1};
  std::uniform_int_distribution<int> count(1, 6), pick(0, 2), long_len(0, 3000);
  std::uniform_int_distribution<size_t> edge(0, edges.size() - 1);
  std::vector<int32_t> contexts(count(rng));
  for (int32_t& c : contexts) c = pick(rng) == 0 ? long_len(rng) : edges[edge(rng)];
  return contexts;
}

TEST(DcpGatheredRowsCuda, MatchesTheCpuAndThePlannerOnRandomChunks) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(1903);
  int64_t chunks_checked = 0, chunks_with_an_empty_rank = 0;
  for (int64_t w : {1, 2, 4}) {
    for (int64_t interleave : {1, 2, 16, 64}) {
      for (int64_t bs : {16, 64}) {
        for (ChunkPolicy policy : {ChunkPolicy::kPacked, ChunkPolicy::kEqualShare}) {
          for (int trial = 0; trial < 4; ++trial) {
            const std::vector<int32_t> contexts = random_contexts(rng, w, interleave, bs);
            const int64_t align = std::lcm(bs, w * interleave);
            const int64_t workspace = align * std::uniform_int_distribution<int64_t>(1, 4)(rng);
            const DcpConfig dcp{.world_size = w, .rank = 0, .interleave = interleave};
            const std::vector<DcpContextChunk> chunks =
                plan_dcp_context_chunks(contexts, bs, workspace, policy, dcp);
            for (size_t c = 0; c < chunks.size(); ++c) {
              const DcpContextChunk& chunk = chunks[c];
              SCOPED_TRACE("W " + std::to_string(w) + " I " + std::to_string(interleave) +
                           " block " + std::to_string(bs) + " chunk " + std::to_string(c));
              const ChunkInputs in = inputs_of(chunk, w);
              const int64_t tokens = chunk.global.total_tokens;
              const Results r = run_both(in, interleave, tokens);
              EXPECT_EQ(r.gpu, r.cpu);
              std::vector<int32_t> want = chunk.gathered_row;
              want.insert(want.end(), kTailRows, kPoison);
              EXPECT_EQ(r.gpu, want);
              // Fewer rows than the chunk: the rest stays poisoned.
              const int64_t part = tokens / 2;
              const Results half = run_both(in, interleave, part);
              EXPECT_EQ(half.gpu, half.cpu);
              ++chunks_checked;
              const std::vector<int32_t>& rank_cu = chunk.rank_cu_seq_lens;
              const auto np = static_cast<int64_t>(chunk.global.starts.size());
              for (int64_t k = 0; k < w; ++k) {
                if (rank_cu[k * (np + 1) + np] == 0) {
                  ++chunks_with_an_empty_rank;
                  break;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(chunks_checked, 100);
  EXPECT_GT(chunks_with_an_empty_rank, 0);  // the edge the test is about did come up
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
}

// Rank 1 of 2 holds nothing (a context of I - 1 < I tokens at interleave 16), requests without
// rows sit between others, strided inputs, and num_tokens 0.
TEST(DcpGatheredRowsCuda, EmptyRanksEmptyRequestsAndStridedInputs) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const int64_t w = 2, interleave = 16;
  // Requests: 15 rows (all on rank 0), none, 40 rows from position 32 (ranks 0, 1, 0: 16 + 16 +
  // 8), none.
  const std::vector<int32_t> cu = {0, 15, 15, 55, 55};
  const std::vector<int32_t> starts = {0, 0, 32, 64};
  // Rank 0: 15 + 0 + 24 rows; rank 1: 0 + 0 + 16 rows. rows_per_rank = 39.
  const std::vector<int32_t> rank_cu = {0, 15, 15, 39, 39, /* rank 1 */ 0, 0, 0, 16, 16};
  // rank_cu_seq_lens as the transposed view of a [np + 1, W] buffer.
  std::vector<int32_t> transposed(rank_cu.size());
  for (int64_t k = 0; k < w; ++k)
    for (int64_t r = 0; r < 5; ++r) transposed[r * w + k] = rank_cu[k * 5 + r];
  const Tensor rank_cu_t = i32(transposed, {5, w});
  ChunkInputs dense{i32(cu, {5}), i32(starts, {4}), i32(rank_cu, {w, 5}), 39};
  const Results r = run_both(dense, interleave, 55);
  std::vector<int32_t> want(55 + kTailRows, kPoison);
  for (int32_t t = 0; t < 15; ++t) want[t] = t;  // rank 0's first 15 rows
  for (int32_t t = 0; t < 40; ++t) {             // positions 32..71 of request 2
    const int32_t p = 32 + t;
    const int32_t k = (p / 16) % 2, local = (p / 32) * 16 + p % 16 - 32 / 2;
    want[15 + t] = k * 39 + (k == 0 ? 15 : 0) + local;
  }
  EXPECT_EQ(r.cpu, want);
  EXPECT_EQ(r.gpu, want);

  // The same through a transposed rank_cu_seq_lens and a destination of stride 2 (odd elements
  // must stay poisoned).
  Tensor gpu = to_device(poisoned_rows(2 * 55));
  const Tensor rank_cu_dev = to_device(rank_cu_t);
  ops::dcp_gathered_rows(
      to_device(dense.cu_seq_lens), to_device(dense.seq_starts), rank_cu_dev.view().transpose(0, 1),
      39, interleave,
      TensorView::strided(gpu.view().data, DType::kI32, {55}, {2}, gpu.view().device), 55);
  const std::vector<int32_t> strided = rows_of(to_host(gpu));
  for (int64_t t = 0; t < 55; ++t) {
    EXPECT_EQ(strided[2 * t], want[t]) << t;
    EXPECT_EQ(strided[2 * t + 1], kPoison) << t;
  }

  // num_tokens 0: nothing written.
  const Results none = run_both(dense, interleave, 0);
  EXPECT_EQ(none.gpu, std::vector<int32_t>(kTailRows, kPoison));
  EXPECT_EQ(none.cpu, none.gpu);
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
}

// Inputs no plan produces: the CPU throws, the GPU writes -1 for the rows it cannot place (and
// gather_rows_and_maybe_dequant then skips and records them).
TEST(DcpGatheredRowsCuda, RowsItCannotPlaceAreMinusOne) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const int64_t interleave = 2;
  // A piece starting at 3, not a multiple of W I = 4.
  const ChunkInputs misaligned{i32({0, 4}, {2}), i32({3}, {1}), i32({0, 2, 0, 2}, {2, 2}), 2};
  MLAKIT_EXPECT_THROW_MSG(
      ops::dcp_gathered_rows(misaligned.cu_seq_lens, misaligned.seq_starts,
                             misaligned.rank_cu_seq_lens, 2, interleave, poisoned_rows(4), 4),
      "seq_starts[0] must be a multiple of world_size * interleave = 4");
  Tensor gpu = to_device(poisoned_rows(4));
  ops::dcp_gathered_rows(to_device(misaligned.cu_seq_lens), to_device(misaligned.seq_starts),
                         to_device(misaligned.rank_cu_seq_lens), 2, interleave, gpu, 4);
  EXPECT_EQ(rows_of(to_host(gpu)), std::vector<int32_t>(4, -1));

  // rows_per_rank 3 is too small for rank 0's 4 rows: its last row lands on rank 1's slice
  // (which cannot be told from a right row) and rank 1's last row outside [0, W rows_per_rank).
  const ChunkInputs short_slices{i32({0, 8}, {2}), i32({0}, {1}), i32({0, 4, 0, 4}, {2, 2}), 3};
  MLAKIT_EXPECT_THROW_MSG(
      ops::dcp_gathered_rows(short_slices.cu_seq_lens, short_slices.seq_starts,
                             short_slices.rank_cu_seq_lens, 3, interleave, poisoned_rows(8), 8),
      "all-gathered rows");
  Tensor gpu_short = to_device(poisoned_rows(8));
  ops::dcp_gathered_rows(to_device(short_slices.cu_seq_lens), to_device(short_slices.seq_starts),
                         to_device(short_slices.rank_cu_seq_lens), 3, interleave, gpu_short, 8);
  // Positions 0..7: ranks 0 0 1 1 0 0 1 1, local 0 1 0 1 2 3 2 3; rank k's row k * 3 + local.
  EXPECT_EQ(rows_of(to_host(gpu_short)), (std::vector<int32_t>{0, 1, 3, 4, 2, 3, 5, -1}));
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(0)));
}

}  // namespace
}  // namespace mlakit
