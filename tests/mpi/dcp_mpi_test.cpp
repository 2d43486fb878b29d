// DCP across real ranks (spec D.12; run by ctest under `mpirun -np W`, W in {1, 2, 4}): every rank
// holds its share of a paged cache (written through ops::dcp_slot_mapping), runs the local
// absorbed decode over it, and combines through the MPI communicator; the result for its heads
// must equal the single-rank decode over the whole cache (to rounding) and the fp64 oracle.
// The context chunks of the same requests, gathered under DCP, must hold exactly the cached
// values in global token order. Caches auto (bf16) and fp8_e4m3, block sizes 16 and 64,
// interleaves 1, 2, 16, 64, contexts from 0 to 20000 tokens (4000 in sanitizer builds).
//
// All ranks draw the same global batch (rank 0's seed is broadcast). A failure on one rank must
// not leave the others waiting in a collective: checks are EXPECTs (never ASSERTs) between
// collectives, and an exception aborts the process (gtest does not catch it), which ends the job.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/fp8_reference.hpp"
#include "common/test_util.hpp"
#include "dist/dcp_context.hpp"
#include "dist/dcp_decode.hpp"
#include "mlakit/dcp.hpp"
#include "mlakit/dist_mpi.hpp"
#include "mlakit/ops.hpp"
#include "reference/reference.hpp"

namespace mlakit {
namespace {

constexpr float kScale = 0.1352338f;  // DeepSeek-V3's softmax scale (DESIGN.md §1)
constexpr int64_t kLatent = 512;      // L
constexpr int64_t kEntry = 576;       // L + R
constexpr int64_t kHeadsPerRank = 2;  // N: small, so the oracle over 20000 keys stays quick
constexpr float kKScale = 0.02f;      // fp8 cache: N(0, 1) values / 0.02 stay well inside +-448
constexpr float kQScale = 0.03f;      // fp8 q: the same for the absorbed queries
// The longest context: 20000 tokens, a fifth of it in sanitizer builds (~3x slower, and CI runs
// both).
#if defined(__SANITIZE_ADDRESS__)
constexpr int64_t kLongContext = 4000;
#else
constexpr int64_t kLongContext = 20000;
#endif
// Rows of the context workspace: the long context takes 5 chunks or more.
constexpr int64_t kWorkspaceTokens = kLongContext / 5;

struct Config {
  KvCacheDType kv;
  int64_t block_size;
  int64_t interleave;
};

std::string describe(const Config& c) {
  return std::string(kv_cache_dtype_name(c.kv)) + " block_size " + std::to_string(c.block_size) +
         " interleave " + std::to_string(c.interleave);
}

// The global batch, identical on every rank: per request its length, every token's cache entry
// as written (bf16 values) and as the kernels read it back, and every head's absorbed query.
struct Batch {
  std::vector<int64_t> seq_lens;
  std::vector<int64_t> first_token;  // [R + 1] offsets into the token arrays
  Tensor kv_c, k_pe;                 // bf16 [>= tokens, L], [>= tokens, R] (the shared pool)
  std::vector<double> keys_seen;     // [tokens, L + R]: dequantized as the kernels read them
  Tensor q;                          // bf16 [R, W N, L + R]
  int64_t tokens = 0, heads = 0;
};

// Random cache inputs drawn once per process (drawing them dominated the test's time); every
// batch takes its tokens from the start. The same on every rank (the seed is shared).
struct LatentPool {
  Tensor kv_c;  // bf16 [kPoolTokens, L]
  Tensor k_pe;  // bf16 [kPoolTokens, R]
};
constexpr int64_t kPoolTokens = 24000;  // the most tokens of any batch: ~21500 at W 4, I 64
const LatentPool& latent_pool() {
  static const LatentPool pool = [] {
    auto rng = test::make_rng(1699);
    return LatentPool{test::random_tensor(rng, {kPoolTokens, kLatent}, DType::kBF16),
                      test::random_tensor(rng, {kPoolTokens, kEntry - kLatent}, DType::kBF16)};
  }();
  return pool;
}

Batch make_batch(const Config& c, int64_t w, std::mt19937_64& rng) {
  Batch b;
  const int64_t turn = w * c.interleave;
  b.seq_lens = {0,   1,           std::max<int64_t>(1, turn - 1), turn + 1, 3 * c.block_size + 1,
                777, kLongContext};
  b.first_token = {0};
  for (int64_t len : b.seq_lens) b.first_token.push_back(b.first_token.back() + len);
  b.tokens = b.first_token.back();
  b.heads = w * kHeadsPerRank;
  b.kv_c = latent_pool().kv_c;
  b.k_pe = latent_pool().k_pe;
  EXPECT_LE(b.tokens, b.kv_c.size(0));
  b.q = test::random_tensor(rng, {static_cast<int64_t>(b.seq_lens.size()), b.heads, kEntry},
                            DType::kBF16);
  // fp8: the cache writer's f32 division, then the nearest e4m3 code (independent reference),
  // once per bf16 bit pattern: the reference searches all codes, too slow for every element.
  std::vector<double> fp8_seen(1 << 16, NAN);
  auto seen = [&](const TensorView& t, int64_t i) {
    const float x = load_float(t.data, DType::kBF16, i);
    if (c.kv == KvCacheDType::kAuto) return static_cast<double>(x);
    double& v = fp8_seen[static_cast<const uint16_t*>(t.data)[i]];
    if (std::isnan(v)) v = test::e4m3_value(test::e4m3_nearest(x / kKScale)) * kKScale;
    return v;
  };
  b.keys_seen.resize(b.tokens * kEntry);
  for (int64_t t = 0; t < b.tokens; ++t) {
    for (int64_t i = 0; i < kLatent; ++i)
      b.keys_seen[t * kEntry + i] = seen(b.kv_c, t * kLatent + i);
    for (int64_t i = kLatent; i < kEntry; ++i) {
      b.keys_seen[t * kEntry + i] = seen(b.k_pe, t * (kEntry - kLatent) + i - kLatent);
    }
  }
  return b;
}

// A paged cache holding, for every request r, positions [0, lens[r]) in a random block order;
// NaN (bf16) or 0xff (e4m3 NaN) in every slot nobody writes.
struct PagedCache {
  Tensor cache;        // [num_blocks, block_size, 576]
  Tensor block_table;  // i32 [R, width]; unused columns -1
  int64_t width = 0;
};

PagedCache make_cache(const Config& c, const std::vector<int64_t>& lens, std::mt19937_64& rng) {
  PagedCache p;
  const int64_t bs = c.block_size;
  int64_t used = 0;
  for (int64_t len : lens) {
    p.width = std::max(p.width, (len + bs - 1) / bs + 1);  // +1: a column nobody needs
    used += (len + bs - 1) / bs;
  }
  const int64_t num_blocks = used + 2;  // 2 blocks nobody uses
  std::vector<int64_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int64_t> table(lens.size() * p.width, -1);
  int64_t next = 0;
  for (size_t r = 0; r < lens.size(); ++r) {
    for (int64_t col = 0; col < (lens[r] + bs - 1) / bs; ++col)
      table[r * p.width + col] = ids[next++];
  }
  p.block_table =
      test::int_tensor(table, {static_cast<int64_t>(lens.size()), p.width}, DType::kI32);
  p.cache = test::nan_tensor({num_blocks, bs, kEntry},
                             c.kv == KvCacheDType::kAuto ? DType::kBF16 : DType::kU8);
  return p;
}

// Writes every token of the batch into `cache` through `slots` (i64 [tokens]).
void write_tokens(const Config& c, const Batch& b, const PagedCache& p, const Tensor& slots) {
  ops::concat_and_cache_mla(b.kv_c, b.k_pe, p.cache, slots, c.kv, kKScale);
}

// The heads [first, first + count) of q, as the decode reads them: bf16 [R, 1, count, 576], or
// fp8 quantized with kQScale for an fp8 cache.
Tensor query_heads(const Config& c, const Batch& b, int64_t first, int64_t count) {
  const int64_t requests = static_cast<int64_t>(b.seq_lens.size());
  Tensor q = Tensor::empty({requests, 1, count, kEntry}, DType::kBF16);
  const int64_t row = b.heads * kEntry;  // elements per request of q
  ops::copy(TensorView::strided(b.q.view().element_ptr(first * kEntry), DType::kBF16,
                                {requests, 1, count, kEntry}, {row, row, kEntry, 1}),
            q);
  if (c.kv == KvCacheDType::kAuto) return q;
  Tensor q8 = Tensor::empty({requests, 1, count, kEntry}, DType::kU8);
  ops::scaled_fp8_quant(q, q8, kQScale);
  return q8;
}

struct DecodeResult {
  Tensor out;  // f32 [R, 1, H, L]
  Tensor lse;  // f32 [R, 1, H]
};

// q: [R, 1, H, 576]
DecodeResult decode(const Config& c, const TensorView& q, const PagedCache& p,
                    const std::vector<int64_t>& lens) {
  const int64_t requests = q.size(0), heads = q.size(2);
  std::vector<int32_t> lens32(lens.begin(), lens.end());
  const DecodeSchedule schedule = ops::plan_mla_decode({.device = Device::cpu(),
                                                        .batch = requests,
                                                        .s_q = 1,
                                                        .num_heads = heads,
                                                        .block_size = c.block_size,
                                                        .max_seq_len = p.width * c.block_size},
                                                       lens32);
  const Tensor workspace = test::nan_tensor(
      {std::max<int64_t>(1, ops::mla_decode_workspace_elems(schedule, 1, heads, kLatent))},
      DType::kF32);
  DecodeResult r{test::nan_tensor({requests, 1, heads, kLatent}, DType::kF32),
                 test::nan_tensor({requests, 1, heads}, DType::kF32)};
  const ops::DecodeParams params{.scale = kScale,
                                 .kv_dtype = c.kv,
                                 .q_scale = kQScale,
                                 .k_scale = kKScale,
                                 .kv_lora_rank = kLatent};
  ops::mla_decode(
      q, p.cache, p.block_table,
      test::int_tensor(std::vector<int64_t>(lens.begin(), lens.end()), {requests}, DType::kI32),
      r.out, r.lse, params, schedule, workspace);
  return r;
}

// The oracle for heads [first, first + count): out [R, count, L] over all keys of each request.
std::vector<double> oracle(const Config& c, const Batch& b, int64_t first, int64_t count) {
  std::vector<double> out;
  const float inv_q_scale = 1.0f / kQScale;  // scaled_fp8_quant multiplies by the f32 reciprocal
  for (size_t r = 0; r < b.seq_lens.size(); ++r) {
    const int64_t len = b.seq_lens[r];
    std::vector<double> q(count * kEntry);
    for (int64_t h = 0; h < count; ++h) {
      for (int64_t i = 0; i < kEntry; ++i) {
        const float x =
            load_float(b.q.view().data, DType::kBF16, (r * b.heads + first + h) * kEntry + i);
        q[h * kEntry + i] = c.kv == KvCacheDType::kAuto
                                ? x
                                : test::e4m3_value(test::e4m3_nearest(x * inv_q_scale)) * kQScale;
      }
    }
    const std::span<const double> k(b.keys_seen.data() + b.first_token[r] * kEntry, len * kEntry);
    std::vector<double> v(len * kLatent);
    for (int64_t s = 0; s < len; ++s)
      std::copy_n(k.begin() + s * kEntry, kLatent, v.begin() + s * kLatent);
    const ref::AttentionResult a =
        ref::attention(q, k, v, 1, len, count, 1, kEntry, kLatent, kScale, /*causal=*/false);
    out.insert(out.end(), a.out.begin(), a.out.end());
  }
  return out;
}

class DcpMpi : public ::testing::Test {
 protected:
  void SetUp() override { comm_ = dist::make_mpi_communicator(MPI_COMM_WORLD); }
  std::unique_ptr<dist::Communicator> comm_;
};

std::vector<Config> all_configs() {
  std::vector<Config> configs;
  for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3})
    for (int64_t bs : {16, 64})
      for (int64_t interleave : {1, 2, 16, 64}) configs.push_back({kv, bs, interleave});
  return configs;
}

TEST_F(DcpMpi, DecodeMatchesSingleRankAndOracle) {
  const int64_t w = comm_->world_size(), rank = comm_->rank();
  uint64_t stream = 1700;
  for (const Config& c : all_configs()) {
    SCOPED_TRACE(describe(c) + ", rank " + std::to_string(rank) + " of " + std::to_string(w));
    auto rng = test::make_rng(++stream);  // the same on every rank
    const Batch b = make_batch(c, w, rng);
    const int64_t requests = static_cast<int64_t>(b.seq_lens.size());
    const DcpConfig dcp{.world_size = w, .rank = rank, .interleave = c.interleave};

    // Single rank: the whole cache, this rank's heads.
    auto table_rng = test::make_rng(stream * 100 + rank);  // block orders differ across ranks
    const PagedCache full = make_cache(c, b.seq_lens, table_rng);
    std::vector<int64_t> full_slots;
    for (int64_t r = 0; r < requests; ++r) {
      for (int64_t p = 0; p < b.seq_lens[r]; ++p) {
        const auto block =
            static_cast<int64_t>(test::element(full.block_table, {r, p / c.block_size}));
        full_slots.push_back(block * c.block_size + p % c.block_size);
      }
    }
    write_tokens(c, b, full, test::int_tensor(full_slots, {b.tokens}, DType::kI64));
    const Tensor q_mine = query_heads(c, b, rank * kHeadsPerRank, kHeadsPerRank);
    const DecodeResult single = decode(c, q_mine.view(), full, b.seq_lens);

    // DCP: this rank's share of the cache, written through the DCP slot mapping.
    std::vector<int64_t> local_lens;
    for (int64_t len : b.seq_lens)
      local_lens.push_back(dcp_local_seq_len(len, w, rank, c.interleave));
    const PagedCache local = make_cache(c, local_lens, table_rng);
    std::vector<int64_t> positions, token_to_req;
    for (int64_t r = 0; r < requests; ++r) {
      for (int64_t p = 0; p < b.seq_lens[r]; ++p) {
        positions.push_back(p);
        token_to_req.push_back(r);
      }
    }
    Tensor slots = test::nan_tensor({b.tokens}, DType::kI64);
    ops::dcp_slot_mapping(test::int_tensor(positions, {b.tokens}, DType::kI64),
                          test::int_tensor(token_to_req, {b.tokens}, DType::kI32),
                          local.block_table, c.block_size, dcp, slots);
    write_tokens(c, b, local, slots);

    // q of this rank's heads -> q of all heads; local decode; combine back to this rank's heads.
    Tensor q_local = Tensor::empty({requests, kHeadsPerRank, kEntry}, DType::kBF16);
    ops::copy(b.q.view().narrow(1, rank * kHeadsPerRank, kHeadsPerRank), q_local);
    const dist::DcpDecodeBuffers sizes = dist::dcp_decode_buffers({.num_tokens = requests,
                                                                   .num_heads = kHeadsPerRank,
                                                                   .entry_dim = kEntry,
                                                                   .kv_lora_rank = kLatent},
                                                                  w);
    Tensor gathered_q = test::nan_tensor({w, requests, kHeadsPerRank, kEntry}, DType::kBF16);
    EXPECT_EQ(gathered_q.numel(), sizes.gathered_queries);
    const bool fp8 = c.kv != KvCacheDType::kAuto;
    Tensor q_all = test::nan_tensor({requests, b.heads, kEntry}, fp8 ? DType::kU8 : DType::kBF16);
    dist::dcp_gather_queries(*comm_, q_local, gathered_q, q_all,
                             fp8 ? std::optional<float>(kQScale) : std::nullopt);
    const Tensor q_expected = query_heads(c, b, 0, b.heads);
    EXPECT_TRUE(test::all_close(q_all.view().reshape({requests, 1, b.heads, kEntry}),
                                test::to_doubles(q_expected), {0, 0}))
        << "all-gathered queries";
    const DecodeResult partial =
        decode(c, q_all.view().reshape({requests, 1, b.heads, kEntry}), local, local_lens);
    Tensor gathered_lse = test::nan_tensor({w, requests, b.heads}, DType::kF32);
    EXPECT_EQ(gathered_lse.numel(), sizes.gathered_lse);
    const std::vector<double> expected = oracle(c, b, rank * kHeadsPerRank, kHeadsPerRank);
    const std::vector<double> single_out = test::to_doubles(single.out);
    for (DType exchange : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::string("exchange ") + dtype_name(exchange));
      Tensor corrected = test::nan_tensor({w, requests, kHeadsPerRank, kLatent}, exchange);
      EXPECT_EQ(corrected.numel(), sizes.corrected);
      Tensor out = test::nan_tensor({requests, kHeadsPerRank, kLatent}, exchange);
      dist::dcp_combine_heads(*comm_, partial.out.view().reshape({requests, b.heads, kLatent}),
                              partial.lse.view().reshape({requests, b.heads}), gathered_lse,
                              corrected, out);
      // Same keys, other partition and order of the f32 sums: equal to f32 rounding; a bf16
      // exchange rounds each rank's share and the sum once more.
      const test::Tolerance tol = test::tolerance_for(exchange);
      EXPECT_TRUE(test::all_close(out, single_out, tol)) << "DCP vs single-rank decode";
      EXPECT_TRUE(test::all_close(out, expected, tol)) << "DCP vs oracle";
    }
    EXPECT_TRUE(test::all_close(single.out, expected, test::tolerance_for(DType::kF32)))
        << "single-rank decode vs oracle";
  }
}

TEST_F(DcpMpi, ContextChunksHoldTheCachedValuesInGlobalOrder) {
  const int64_t w = comm_->world_size(), rank = comm_->rank();
  uint64_t stream = 1800;
  for (const Config& c : all_configs()) {
    SCOPED_TRACE(describe(c) + ", rank " + std::to_string(rank) + " of " + std::to_string(w));
    auto rng = test::make_rng(++stream);
    const Batch b = make_batch(c, w, rng);
    const int64_t requests = static_cast<int64_t>(b.seq_lens.size());
    const DcpConfig dcp{.world_size = w, .rank = rank, .interleave = c.interleave};
    std::vector<int64_t> local_lens;
    for (int64_t len : b.seq_lens)
      local_lens.push_back(dcp_local_seq_len(len, w, rank, c.interleave));
    auto table_rng = test::make_rng(stream * 100 + rank);
    const PagedCache local = make_cache(c, local_lens, table_rng);
    std::vector<int64_t> positions, token_to_req;
    for (int64_t r = 0; r < requests; ++r) {
      for (int64_t p = 0; p < b.seq_lens[r]; ++p) {
        positions.push_back(p);
        token_to_req.push_back(r);
      }
    }
    Tensor slots = Tensor::empty({b.tokens}, DType::kI64);
    ops::dcp_slot_mapping(test::int_tensor(positions, {b.tokens}, DType::kI64),
                          test::int_tensor(token_to_req, {b.tokens}, DType::kI32),
                          local.block_table, c.block_size, dcp, slots);
    write_tokens(c, b, local, slots);

    // Every request is a prefill whose context is its whole cached length.
    const std::vector<int32_t> contexts(b.seq_lens.begin(), b.seq_lens.end());
    const std::vector<DcpContextChunk> chunks = plan_dcp_context_chunks(
        contexts, c.block_size, kWorkspaceTokens, ChunkPolicy::kPacked, dcp);
    EXPECT_GT(chunks.size(), 4u);  // the long context alone needs 5 chunks
    Tensor exchange = test::nan_tensor({kWorkspaceTokens, kEntry}, local.cache.view().dtype);
    Tensor dst = test::nan_tensor({kWorkspaceTokens, kEntry}, DType::kBF16);
    for (const DcpContextChunk& chunk : chunks) {
      auto to_tensor = [](const std::vector<int32_t>& v) {
        return test::int_tensor(std::vector<int64_t>(v.begin(), v.end()),
                                {static_cast<int64_t>(v.size())}, DType::kI32);
      };
      const Tensor cu = to_tensor(chunk.local.cu_seq_lens), starts = to_tensor(chunk.local.starts),
                   rows = to_tensor(chunk.gathered_row);
      dist::dcp_gather_context_chunk(*comm_, local.cache, local.block_table,
                                     {cu.view(), starts.view(), rows.view(), chunk.rows_per_rank},
                                     exchange, dst, c.kv, kKScale);
      const int64_t total = chunk.global.total_tokens;
      std::vector<double> expected(total * kEntry);
      for (int64_t t = 0; t < total; ++t) {
        const int64_t r = chunk.global.token_to_seq[t];
        const int64_t p = chunk.global.starts[r] + t - chunk.global.cu_seq_lens[r];
        for (int64_t i = 0; i < kEntry; ++i) {
          const double seen = b.keys_seen[(b.first_token[r] + p) * kEntry + i];
          expected[t * kEntry + i] = round_to_dtype(static_cast<float>(seen), DType::kBF16);
        }
      }
      EXPECT_TRUE(test::all_close(dst.view().narrow(0, 0, total), expected, {0, 0}));
    }
  }
}

}  // namespace
}  // namespace mlakit
