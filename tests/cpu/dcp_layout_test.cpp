// DCP placement (mlakit/dcp.hpp) against brute force, spec D.12 "dcp_local_lens": local lengths
// exhaustively for L <= 300, W <= 8, I in {1, 2, 4, 16}; local positions enumerate each rank's
// tokens in order; ops::dcp_slot_mapping on CPU against slots computed from that enumeration.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "common/test_util.hpp"
#include "mlakit/dcp.hpp"
#include "mlakit/error.hpp"
#include "mlakit/ops.hpp"

namespace mlakit {
namespace {

constexpr int64_t kInterleaves[] = {1, 2, 4, 16};

TEST(DcpLayout, LocalSeqLenMatchesBruteForceExhaustively) {
  for (int64_t interleave : kInterleaves) {
    for (int64_t w = 1; w <= 8; ++w) {
      std::vector<int64_t> count(w, 0);  // positions [0, len) owned by each rank, by counting
      for (int64_t len = 0; len <= 300; ++len) {
        int64_t total = 0;
        for (int64_t k = 0; k < w; ++k) {
          ASSERT_EQ(dcp_local_seq_len(len, w, k, interleave), count[k])
              << "len " << len << " W " << w << " rank " << k << " I " << interleave;
          total += count[k];
        }
        ASSERT_EQ(total, len);
        ++count[(len / interleave) % w];  // position `len` joins the count for len + 1
      }
    }
  }
}

// Spec F-7: the snapshot-A formula L / W + (rank <= (L - 1) % W) over-counts when L % W == 0.
TEST(DcpLayout, FullLastRoundGivesNoRankAnExtraToken) {
  EXPECT_EQ(dcp_local_seq_len(8, 4, 0, 1), 2);
  EXPECT_EQ(dcp_local_seq_len(8, 4, 3, 1), 2);
  EXPECT_EQ(dcp_local_seq_len(9, 4, 0, 1), 3);
  EXPECT_EQ(dcp_local_seq_len(9, 4, 1, 1), 2);
}

TEST(DcpLayout, LocalPositionsEnumerateEachRanksTokensInOrder) {
  for (int64_t interleave : kInterleaves) {
    for (int64_t w = 1; w <= 8; ++w) {
      std::vector<int64_t> next(w, 0);
      for (int64_t p = 0; p < 600; ++p) {
        const int64_t owner = dcp_owner_rank(p, w, interleave);
        ASSERT_EQ(owner, (p / interleave) % w);
        ASSERT_EQ(dcp_local_position(p, w, interleave), next[owner])
            << "position " << p << " W " << w << " I " << interleave;
        ++next[owner];
      }
    }
  }
}

TEST(DcpLayout, LocalSeqLensOfABatch) {
  const std::vector<int32_t> lens = {0, 1, 7, 64, 65};
  const DcpConfig dcp{.world_size = 2, .rank = 1, .interleave = 4};
  const std::vector<int32_t> local = dcp_local_seq_lens(lens, dcp);
  EXPECT_EQ(local, (std::vector<int32_t>{0, 0, 3, 32, 32}));
  MLAKIT_EXPECT_THROW_MSG(dcp_local_seq_lens(std::vector<int32_t>{3, -1}, dcp),
                          "seq_lens[1] must be >= 0");
}

TEST(DcpLayout, ConfigIsValidated) {
  MLAKIT_EXPECT_THROW_MSG((DcpConfig{.world_size = 0}.validate()), "world_size must be >= 1");
  MLAKIT_EXPECT_THROW_MSG((DcpConfig{.world_size = 2, .rank = 2}.validate()),
                          "rank must be in [0, world_size = 2)");
  MLAKIT_EXPECT_THROW_MSG((DcpConfig{.world_size = 2, .interleave = 0}.validate()),
                          "interleave must be >= 1");
  // W * I wrapped in int64: local positions came out negative (block column < 0, read before
  // the block table) or a remainder by 0.
  MLAKIT_EXPECT_THROW_MSG((DcpConfig{.world_size = 3, .interleave = int64_t{1} << 62}.validate()),
                          "world_size * interleave must fit in int64, got 3 * 4611686018427387904");
}

struct SlotCase {
  std::vector<int64_t> positions;
  std::vector<int64_t> token_to_req;
  std::vector<int64_t> table;  // [requests, width]
  int64_t requests = 0, width = 0;
};

// Tokens of 3 requests at random positions (and a padding token at -1); each request's table row
// a random permutation of blocks.
SlotCase random_slot_case(std::mt19937_64& rng, int64_t block_size) {
  SlotCase c;
  c.requests = 3;
  c.width = 40;
  std::vector<int64_t> ids(c.requests * c.width);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.table = ids;
  std::uniform_int_distribution<int64_t> position(0, c.width * block_size - 1);
  for (int64_t t = 0; t < 200; ++t) {
    c.positions.push_back(t == 7 ? -1 : position(rng));
    c.token_to_req.push_back(t % c.requests);
  }
  return c;
}

TEST(DcpSlotMapping, MatchesSlotsOfEachRanksEnumeratedPositions) {
  auto rng = test::make_rng(1501);
  for (int64_t block_size : {16, 64}) {
    for (int64_t interleave : {1, 2, 16, 64}) {
      for (int64_t w : {1, 2, 4}) {
        const SlotCase c = random_slot_case(rng, block_size);
        const int64_t t = static_cast<int64_t>(c.positions.size());
        const Tensor positions = test::int_tensor(c.positions, {t}, DType::kI64);
        const Tensor token_to_req = test::int_tensor(c.token_to_req, {t}, DType::kI32);
        const Tensor table = test::int_tensor(c.table, {c.requests, c.width}, DType::kI32);
        std::vector<int> writers(t, 0);
        for (int64_t rank = 0; rank < w; ++rank) {
          const DcpConfig dcp{.world_size = w, .rank = rank, .interleave = interleave};
          Tensor slots = test::nan_tensor({t}, DType::kI64);
          ops::dcp_slot_mapping(positions, token_to_req, table, block_size, dcp, slots);
          for (int64_t i = 0; i < t; ++i) {
            const int64_t p = c.positions[i];
            const int64_t got = slots.data<int64_t>()[i];
            // Expected: the local position counted by walking the request's positions.
            int64_t local = 0;
            for (int64_t q = 0; q < p; ++q) local += ((q / interleave) % w) == rank;
            const bool mine = p >= 0 && (p / interleave) % w == rank;
            const int64_t expected =
                mine ? c.table[c.token_to_req[i] * c.width + local / block_size] * block_size +
                           local % block_size
                     : -1;
            ASSERT_EQ(got, expected) << "token " << i << " position " << p << " rank " << rank
                                     << " W " << w << " I " << interleave;
            writers[i] += got >= 0;
          }
        }
        for (int64_t i = 0; i < t; ++i) EXPECT_EQ(writers[i], c.positions[i] >= 0 ? 1 : 0);
      }
    }
  }
}

TEST(DcpSlotMapping, BadIndicesThrow) {
  const DcpConfig dcp{.world_size = 2, .rank = 0, .interleave = 1};
  const Tensor table = test::int_tensor({3, -1}, {1, 2}, DType::kI32);
  Tensor slots = Tensor::empty({1}, DType::kI64);
  auto run = [&](int64_t position, int64_t request) {
    ops::dcp_slot_mapping(test::int_tensor({position}, {1}, DType::kI64),
                          test::int_tensor({request}, {1}, DType::kI32), table, 16, dcp, slots);
  };
  MLAKIT_EXPECT_THROW_MSG(run(0, 1), "token_to_req[0] = 1 is not a row of block_table");
  MLAKIT_EXPECT_THROW_MSG(run(2 * 16 * 2, 0), "needs block column 2 but block_table has 2");
  MLAKIT_EXPECT_THROW_MSG(run(2 * 16, 0), "block_table[0, 1] = -1");
  run(1, 5);  // rank 1's token: not this rank's, so its request is never looked up
  EXPECT_EQ(slots.data<int64_t>()[0], -1);
  // block 3 x block_size 2^62 wrapped to a negative slot, which concat_and_cache_mla skips: the
  // token was silently never cached.
  MLAKIT_EXPECT_THROW_MSG(ops::dcp_slot_mapping(test::int_tensor({0}, {1}, DType::kI64),
                                                test::int_tensor({0}, {1}, DType::kI32), table,
                                                int64_t{1} << 62, dcp, slots),
                          "block_table[0, 0] = 3 x block_size 4611686018427387904 overflows int64");
  MLAKIT_EXPECT_THROW_MSG(
      ops::dcp_slot_mapping(test::int_tensor({0}, {1}, DType::kI32),
                            test::int_tensor({0}, {1}, DType::kI32), table, 16, dcp, slots),
      "positions must have dtype i64");
}

}  // namespace
}  // namespace mlakit
