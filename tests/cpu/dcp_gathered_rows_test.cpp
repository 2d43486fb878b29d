// ops::dcp_gathered_rows on the CPU: the row of the all-gathered buffer each global context token
// of a DCP chunk comes from, against a brute-force count of the positions each rank holds; and
// the arguments it must refuse (an output sharing memory with an input or with itself, sizes whose
// products overflow int64, a bad row after good ones: nothing is written then). The GPU test
// (tests/cuda/cuda_dcp_gathered_rows_test.cpp) compares the two devices; this one needs no GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "common/test_util.hpp"
#include "mlakit/dcp.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// One chunk: request r's rows [cu[r], cu[r + 1]) are positions starts[r] + i of that request.
struct Chunk {
  int64_t w = 2, interleave = 2;
  std::vector<int64_t> cu = {0, 6, 9};   // [np + 1]
  std::vector<int64_t> starts = {0, 8};  // [np], multiples of W * I
};

// Brute force: rank k's slice holds, request by request, the positions of the chunk it owns, in
// order; slices are rows_per_rank rows apart. Returns the rank_cu_seq_lens rows ([W, np + 1]),
// rows_per_rank, and the expected row of every chunk token.
struct Expected {
  std::vector<int64_t> rank_cu;
  int64_t rows_per_rank = 0;
  std::vector<int64_t> rows;
};
Expected brute_force(const Chunk& c) {
  const auto np = static_cast<int64_t>(c.starts.size());
  auto owner = [&](int64_t p) { return (p / c.interleave) % c.w; };
  Expected e;
  e.rank_cu.assign(c.w * (np + 1), 0);
  for (int64_t k = 0; k < c.w; ++k) {
    for (int64_t r = 0; r < np; ++r) {
      int64_t held = 0;
      for (int64_t i = 0; i < c.cu[r + 1] - c.cu[r]; ++i) held += owner(c.starts[r] + i) == k;
      e.rank_cu[k * (np + 1) + r + 1] = e.rank_cu[k * (np + 1) + r] + held;
    }
    e.rows_per_rank = std::max(e.rows_per_rank, e.rank_cu[k * (np + 1) + np]);
  }
  for (int64_t r = 0; r < np; ++r) {
    for (int64_t i = 0; i < c.cu[r + 1] - c.cu[r]; ++i) {
      const int64_t p = c.starts[r] + i, k = owner(p);
      int64_t before = 0;  // positions of this piece rank k holds ahead of p
      for (int64_t q = c.starts[r]; q < p; ++q) before += owner(q) == k;
      e.rows.push_back(k * e.rows_per_rank + e.rank_cu[k * (np + 1) + r] + before);
    }
  }
  return e;
}

TEST(DcpGatheredRows, MatchesTheBruteForceRowOfEveryToken) {
  for (const Chunk& c :
       {Chunk{}, Chunk{.w = 4, .interleave = 1, .cu = {0, 3, 3, 20}, .starts = {4, 0, 8}},
        Chunk{.w = 1, .interleave = 3, .cu = {0, 5}, .starts = {6}}}) {
    const Expected e = brute_force(c);
    const auto np = static_cast<int64_t>(c.starts.size());
    const int64_t tokens = c.cu.back();
    Tensor rows = test::int_tensor(std::vector<int64_t>(tokens + 1, -7), {tokens + 1}, DType::kI32);
    ops::dcp_gathered_rows(test::int_tensor(c.cu, {np + 1}, DType::kI32),
                           test::int_tensor(c.starts, {np}, DType::kI32),
                           test::int_tensor(e.rank_cu, {c.w, np + 1}, DType::kI32), e.rows_per_rank,
                           c.interleave, rows, tokens);
    for (int64_t t = 0; t < tokens; ++t) {
      EXPECT_EQ(rows.data<int32_t>()[t], e.rows[t]) << "token " << t << " W " << c.w;
    }
    EXPECT_EQ(rows.data<int32_t>()[tokens], -7) << "a row past num_tokens was written";
  }
}

// The default chunk's valid inputs, for the bad-argument cases to change one at a time.
struct ValidInputs {
  Chunk chunk;
  Expected expected = brute_force(chunk);
  Tensor cu = test::int_tensor(chunk.cu, {3}, DType::kI32);
  Tensor starts = test::int_tensor(chunk.starts, {2}, DType::kI32);
  Tensor rank_cu = test::int_tensor(expected.rank_cu, {2, 3}, DType::kI32);
  Tensor rows = Tensor::zeros({9}, DType::kI32);
};

TEST(DcpGatheredRows, OutputSharingMemoryIsRefused) {
  ValidInputs in;
  const int64_t rpr = in.expected.rows_per_rank;
  // row_index over cu_seq_lens: the op would overwrite offsets it has not read yet.
  Tensor shared = test::int_tensor({0, 6, 9, 0, 0, 0, 0, 0, 0}, {9}, DType::kI32);
  const TensorView cu_inside = shared.view().narrow(0, 0, 3);
  MLAKIT_EXPECT_THROW_MSG(
      ops::dcp_gathered_rows(cu_inside, in.starts, in.rank_cu, rpr, 2, shared, 9),
      "dcp_gathered_rows: row_index must not overlap cu_seq_lens");
  MLAKIT_EXPECT_THROW_MSG(
      ops::dcp_gathered_rows(in.cu, in.starts, in.rank_cu, rpr, 2,
                             TensorView::strided(in.rows.data<int32_t>(), DType::kI32, {9}, {0}),
                             9),
      "dcp_gathered_rows: row_index must not overlap itself");
}

TEST(DcpGatheredRows, ARefusedCallWritesNothing) {
  // Request 0's six rows are valid; request 1 is bad. The op used to write request 0's rows
  // before it threw: row_index must keep every bit it had.
  constexpr int32_t kPoison = 0x7fbadbad;  // no row index the op could compute
  for (int bad_case = 0; bad_case < 2; ++bad_case) {
    ValidInputs in;
    if (bad_case == 0) {
      in.starts.data<int32_t>()[1] = 10;  // not a multiple of W I = 4
    } else {
      // Rank 1's first row of request 1 far past its slice: the last token (position 10, rank 1)
      // lands outside the all-gathered rows.
      in.rank_cu.data<int32_t>()[1 * 3 + 1] = 100;
    }
    Tensor rows = test::int_tensor(std::vector<int64_t>(9, kPoison), {9}, DType::kI32);
    MLAKIT_EXPECT_THROW_MSG(
        ops::dcp_gathered_rows(in.cu, in.starts, in.rank_cu, in.expected.rows_per_rank, 2, rows, 9),
        bad_case == 0 ? "seq_starts[1]" : "row 8 (request 1");
    for (int64_t t = 0; t < 9; ++t) {
      EXPECT_EQ(rows.data<int32_t>()[t], kPoison)
          << "row_index[" << t << "] written, case " << bad_case;
    }
  }
}

TEST(DcpGatheredRows, SizesWhoseProductsOverflowAreRefused) {
  ValidInputs in;
  // 2 ranks x 2^62 rows wraps to 0 in int64, which passed the int32 bound of the gathered rows.
  MLAKIT_EXPECT_THROW_MSG(
      ops::dcp_gathered_rows(in.cu, in.starts, in.rank_cu, int64_t{1} << 62, 2, in.rows, 9),
      "must fit in int32");
  // W * I = 2 x 2^62 wraps to 0: the op took a remainder by it (SIGFPE).
  MLAKIT_EXPECT_THROW_MSG(
      ops::dcp_gathered_rows(in.cu, in.starts, in.rank_cu, in.expected.rows_per_rank,
                             int64_t{1} << 62, in.rows, 9),
      "interleave");
  MLAKIT_EXPECT_THROW_MSG(ops::dcp_gathered_rows(in.cu, in.starts, in.rank_cu,
                                                 in.expected.rows_per_rank, kInt64Max, in.rows, 9),
                          "interleave");
}

}  // namespace
}  // namespace mlakit
