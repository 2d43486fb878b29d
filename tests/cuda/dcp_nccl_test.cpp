// DCP over NCCL on every visible GPU (W = the device count, W = 1 included: one rank still goes
// through the NCCL communicator; skipped, saying so, only without a GPU or without NCCL in the
// build). One process drives all GPUs: ncclCommInitAll makes one communicator per device and one
// thread per device runs that rank, as one process per GPU would (NCCL calls of several ranks from
// one thread would need group calls). Each rank writes its share of a paged cache through
// dcp_slot_mapping, gathers q (bf16, or fp8 for an fp8 cache: it must equal the CPU's bytes), runs
// the local absorbed decode and combines through NCCL. Its heads of the result are compared with
// (a) the single-GPU decode of the whole cache on the same GPU and (b) the fp64 oracle by the
// decode GPU tests' rule (decode_test_support.hpp: the kernel rounds q to its MMA element type E
// and P to E, so out is within out_tolerance of the oracle on the values E holds, with a cosine
// bar; the LSE, combined from the gathered partial LSEs, within kLseTolerance). Its context chunks,
// gathered under DCP, must equal the single-rank CPU gather bit for bit. Each configuration prints
// its time. Run with NCCL_NVLS_ENABLE=0 on the lent machines (docs/dcp.md).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#ifdef MLAKIT_WITH_NCCL
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.hpp"
#include "cuda/decode_test_support.hpp"
#include "dist/dcp_context.hpp"
#include "dist/dcp_decode.hpp"
#include "mlakit/dcp.hpp"
#include "mlakit/dist_nccl.hpp"
#include "mlakit/ops.hpp"
#endif

namespace mlakit {
namespace {

int gpu_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

#ifdef MLAKIT_WITH_NCCL

constexpr float kScale = 0.1352338f;        // DeepSeek-V3's softmax scale (DESIGN.md §1)
constexpr int64_t kLatent = 512;            // L
constexpr int64_t kEntry = 576;             // L + R
constexpr int64_t kHeadsPerRank = 16;       // N: DeepSeek-V3's heads per GPU at TP 8
constexpr float kKScale = 0.02f;            // fp8 cache: N(0, 1) values / 0.02 stay inside +-448
constexpr float kQScale = 0.03f;            // fp8 q: likewise
constexpr int64_t kWorkspaceTokens = 4096;  // rows of the context workspace: several chunks

struct Config {
  KvCacheDType kv;
  int64_t block_size;
  int64_t interleave;
};

// A dense copy of a host tensor on GPU `device`.
Tensor on_gpu(const Tensor& host, int device) {
  const TensorView& v = host.view();
  Tensor t =
      Tensor::empty(std::span<const int64_t>(v.shape, v.ndim), v.dtype, Device::cuda(device));
  const int64_t bytes = host.numel() * dtype_size(v.dtype);
  if (bytes > 0) {
    EXPECT_EQ(cudaMemcpy(t.view().data, v.data, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  return t;
}

Tensor on_host(const Tensor& gpu) {
  const TensorView& v = gpu.view();
  Tensor t = Tensor::empty(std::span<const int64_t>(v.shape, v.ndim), v.dtype);
  EXPECT_EQ(cudaSetDevice(v.device.index), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const int64_t bytes = gpu.numel() * dtype_size(v.dtype);
  if (bytes > 0) {
    EXPECT_EQ(cudaMemcpy(t.view().data, v.data, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return t;
}

// A paged cache (host) for requests of `lens` tokens, blocks in a random order; NaN elsewhere.
struct PagedCache {
  Tensor cache;        // [num_blocks, block_size, 576]
  Tensor block_table;  // i32 [R, width]
};
PagedCache make_cache(const Config& c, const std::vector<int64_t>& lens, std::mt19937_64& rng) {
  const int64_t bs = c.block_size;
  int64_t width = 1, used = 0;
  for (int64_t len : lens) {
    width = std::max(width, (len + bs - 1) / bs + 1);
    used += (len + bs - 1) / bs;
  }
  std::vector<int64_t> ids(used + 2);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int64_t> table(lens.size() * width, -1);
  int64_t next = 0;
  for (size_t r = 0; r < lens.size(); ++r)
    for (int64_t col = 0; col < (lens[r] + bs - 1) / bs; ++col)
      table[r * width + col] = ids[next++];
  return {test::nan_tensor({used + 2, bs, kEntry},
                           c.kv == KvCacheDType::kAuto ? DType::kBF16 : DType::kU8),
          test::int_tensor(table, {static_cast<int64_t>(lens.size()), width}, DType::kI32)};
}

// The inputs every rank shares, and the fp64 oracle of the whole problem.
struct Global {
  std::vector<int64_t> seq_lens;
  Tensor kv_c, k_pe;       // bf16 [tokens, L], [tokens, R]
  Tensor positions, reqs;  // i64 / i32 [tokens]
  Tensor q;                // bf16 [R, W N, 576]: every rank's heads before the all-gather
  Tensor q_decode;         // [R, W N, 576] as the decode reads it: q, or its fp8 codes (CPU)
  PagedCache full;         // the whole cache, written on the CPU
  // The problem as the decode GPU tests describe it: its MMA element type gives the tolerances.
  decode_test::Case rule;
  decode_test::Expected oracle;  // fp64 out [R, 1, W N, L], lse [R, 1, W N]
};

ops::DecodeParams params(const Config& c) {
  return {.scale = kScale,
          .kv_dtype = c.kv,
          .q_scale = kQScale,
          .k_scale = kKScale,
          .kv_lora_rank = kLatent};
}

struct DecodeResult {
  Tensor out;  // f32 [R, 1, H, L]
  Tensor lse;  // f32 [R, 1, H]
};

// q: [R, 1, H, 576] on `device`.
DecodeResult decode(const Config& c, const TensorView& q, const Tensor& cache, const Tensor& table,
                    const std::vector<int64_t>& lens, Device device) {
  const int64_t requests = q.shape[0], heads = q.shape[2];
  const std::vector<int32_t> lens32(lens.begin(), lens.end());
  const DecodeSchedule schedule =
      ops::plan_mla_decode({.device = device,
                            .batch = requests,
                            .s_q = 1,
                            .num_heads = heads,
                            .block_size = c.block_size,
                            .max_seq_len = table.size(1) * c.block_size},
                           lens32);
  auto make = [&](std::initializer_list<int64_t> shape, DType dtype) {
    Tensor t = test::nan_tensor(shape, dtype);
    return device.is_cuda() ? on_gpu(t, device.index) : t;
  };
  const Tensor ws =
      make({std::max<int64_t>(1, ops::mla_decode_workspace_elems(schedule, 1, heads, kLatent))},
           DType::kF32);
  Tensor out = make({requests, 1, heads, kLatent}, DType::kF32);
  Tensor lse = make({requests, 1, heads}, DType::kF32);
  Tensor seq = test::int_tensor(lens, {requests}, DType::kI32);
  if (device.is_cuda()) seq = on_gpu(seq, device.index);
  ops::mla_decode(q, cache, table, seq, out, lse, params(c), schedule, ws);
  return {out, lse};
}

// q heads as the decode reads them: bf16, or fp8 with kQScale for an fp8 cache.
Tensor decode_queries(const Config& c, const Tensor& q_bf16) {
  if (c.kv == KvCacheDType::kAuto) return q_bf16;
  const TensorView& v = q_bf16.view();
  Tensor q8 = Tensor::empty(std::span<const int64_t>(v.shape, v.ndim), DType::kU8);
  ops::scaled_fp8_quant(q_bf16, q8, kQScale);
  return q8;
}

// The decode tests' Case of this problem: q bf16 over a bf16 cache (E = bf16), or fp8 codes over
// an fp8_e4m3 cache (E = f16, which holds both exactly); f32 out.
decode_test::Case rule_case(const Config& c, const std::vector<int64_t>& lens, int64_t heads) {
  decode_test::Case r;
  r.seq_lens.assign(lens.begin(), lens.end());
  r.heads = heads;
  r.block_size = c.block_size;
  r.kv_dtype = c.kv;
  r.cache_dtype = DType::kBF16;
  r.q_dtype = c.kv == KvCacheDType::kAuto ? DType::kBF16 : DType::kU8;
  r.out_dtype = DType::kF32;
  r.q_scale = c.kv == KvCacheDType::kAuto ? 1.0f : kQScale;
  r.k_scale = c.kv == KvCacheDType::kAuto ? 1.0f : kKScale;
  return r;
}

// The fp64 oracle (decode_test::reference, one KV head) on the values the kernel holds: q read
// back from q_decode and every request's keys from the CPU-written cache through its block table;
// fp8 codes are decoded by decode_test::e4m3_value (independent of the library) times the scale.
decode_test::Expected oracle(const Config& c, const Global& g) {
  const bool fp8 = c.kv != KvCacheDType::kAuto;
  auto value = [&](const TensorView& t, int64_t i, double scale) {
    return fp8 ? decode_test::e4m3_value(static_cast<const uint8_t*>(t.data)[i]) * scale
               : static_cast<double>(load_float(t.data, DType::kBF16, i));
  };
  std::vector<double> q(g.q_decode.numel());
  for (int64_t i = 0; i < g.q_decode.numel(); ++i) q[i] = value(g.q_decode.view(), i, kQScale);
  std::vector<std::vector<double>> keys(g.seq_lens.size());
  for (size_t r = 0; r < g.seq_lens.size(); ++r) {
    for (int64_t p = 0; p < g.seq_lens[r]; ++p) {
      const auto block = static_cast<int64_t>(
          test::element(g.full.block_table, {static_cast<int64_t>(r), p / c.block_size}));
      const int64_t slot = block * c.block_size + p % c.block_size;
      for (int64_t i = 0; i < kEntry; ++i)
        keys[r].push_back(value(g.full.cache.view(), slot * kEntry + i, kKScale));
    }
  }
  return decode_test::reference(g.rule, q, keys);
}

Global make_global(const Config& c, int64_t w, std::mt19937_64& rng) {
  Global g;
  const int64_t turn = w * c.interleave;
  g.seq_lens = {0, 1, std::max<int64_t>(1, turn - 1), turn + 1, 3 * c.block_size + 1, 777, 5000};
  const int64_t requests = static_cast<int64_t>(g.seq_lens.size());
  std::vector<int64_t> positions, reqs, slots;
  g.full = make_cache(c, g.seq_lens, rng);
  for (int64_t r = 0; r < requests; ++r) {
    for (int64_t p = 0; p < g.seq_lens[r]; ++p) {
      positions.push_back(p);
      reqs.push_back(r);
      const auto block =
          static_cast<int64_t>(test::element(g.full.block_table, {r, p / c.block_size}));
      slots.push_back(block * c.block_size + p % c.block_size);
    }
  }
  const int64_t tokens = static_cast<int64_t>(positions.size());
  g.positions = test::int_tensor(positions, {tokens}, DType::kI64);
  g.reqs = test::int_tensor(reqs, {tokens}, DType::kI32);
  g.kv_c = test::random_tensor(rng, {tokens, kLatent}, DType::kBF16);
  g.k_pe = test::random_tensor(rng, {tokens, kEntry - kLatent}, DType::kBF16);
  g.q = test::random_tensor(rng, {requests, w * kHeadsPerRank, kEntry}, DType::kBF16);
  ops::concat_and_cache_mla(g.kv_c, g.k_pe, g.full.cache,
                            test::int_tensor(slots, {tokens}, DType::kI64), c.kv, kKScale);
  g.q_decode = decode_queries(c, g.q);
  g.rule = rule_case(c, g.seq_lens, w * kHeadsPerRank);
  g.oracle = oracle(c, g);
  return g;
}

// Heads [rank N, (rank + 1) N) of values laid out [R, W N, width] (or [R, 1, W N, width]).
std::vector<double> rank_heads(const std::vector<double>& all, int64_t requests, int64_t w,
                               int64_t rank, int64_t width) {
  std::vector<double> mine;
  for (int64_t r = 0; r < requests; ++r) {
    const auto first = all.begin() + (r * w + rank) * kHeadsPerRank * width;
    mine.insert(mine.end(), first, first + kHeadsPerRank * width);
  }
  return mine;
}

// f32 [R, 1, H] = log sum_k exp(gathered[k]) for gathered f32 [W, R, H] on the host, in f64; -inf
// where every rank has -inf (no key), NaN where any rank has NaN.
Tensor combined_lse(const Tensor& gathered) {
  const int64_t w = gathered.size(0), requests = gathered.size(1), heads = gathered.size(2);
  const std::vector<double> lse = test::to_doubles(gathered);
  std::vector<double> combined;
  for (int64_t i = 0; i < requests * heads; ++i) {
    double m = -std::numeric_limits<double>::infinity(), sum = 0;
    bool nan = false;
    for (int64_t k = 0; k < w; ++k) {
      nan = nan || std::isnan(lse[k * requests * heads + i]);
      m = std::max(m, lse[k * requests * heads + i]);
    }
    for (int64_t k = 0; k < w && !nan && std::isfinite(m); ++k)
      sum += std::exp(lse[k * requests * heads + i] - m);
    combined.push_back(nan ? std::nan("") : std::isfinite(m) ? m + std::log(sum) : m);
  }
  return test::tensor_from(combined, {requests, 1, heads}, DType::kF32);
}

// Rank comm.rank() on its GPU. EXPECTs only: an early return would leave the other ranks waiting
// in a collective.
void run_rank(dist::Communicator& comm, const Config& c, const Global& g, uint64_t stream) {
  const int device = comm.device().index;
  const int64_t w = comm.world_size(), rank = comm.rank();
  const int64_t requests = static_cast<int64_t>(g.seq_lens.size()), heads = w * kHeadsPerRank;
  const DcpConfig dcp{.world_size = w, .rank = rank, .interleave = c.interleave};
  EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  std::vector<int64_t> local_lens;
  for (int64_t len : g.seq_lens)
    local_lens.push_back(dcp_local_seq_len(len, w, rank, c.interleave));
  auto rng = test::make_rng(stream * 100 + rank);
  const PagedCache host_local = make_cache(c, local_lens, rng);
  const Tensor cache = on_gpu(host_local.cache, device),
               table = on_gpu(host_local.block_table, device);
  Tensor slots = on_gpu(test::nan_tensor({g.positions.size(0)}, DType::kI64), device);
  ops::dcp_slot_mapping(on_gpu(g.positions, device), on_gpu(g.reqs, device), table, c.block_size,
                        dcp, slots);
  ops::concat_and_cache_mla(on_gpu(g.kv_c, device), on_gpu(g.k_pe, device), cache, slots, c.kv,
                            kKScale);

  // Decode: q all-gather, local decode, combine (f32 exchange) back to this rank's heads.
  Tensor q_local_host = Tensor::empty({requests, kHeadsPerRank, kEntry}, DType::kBF16);
  ops::copy(g.q.view().narrow(1, rank * kHeadsPerRank, kHeadsPerRank), q_local_host);
  const bool fp8 = c.kv != KvCacheDType::kAuto;
  const Tensor q_local = on_gpu(q_local_host, device);
  const Tensor gathered_q =
      on_gpu(test::nan_tensor({w, requests, kHeadsPerRank, kEntry}, DType::kBF16), device);
  Tensor q_all =
      on_gpu(test::nan_tensor({requests, heads, kEntry}, fp8 ? DType::kU8 : DType::kBF16), device);
  dist::dcp_gather_queries(comm, q_local, gathered_q, q_all,
                           fp8 ? std::optional<float>(kQScale) : std::nullopt);
  // Every rank's q, quantized on the GPU as the CPU quantized it for the oracle.
  EXPECT_TRUE(test::all_close(on_host(q_all), test::to_doubles(g.q_decode), {0, 0}))
      << "gathered q, rank " << rank;
  const DecodeResult partial = decode(c, q_all.view().reshape({requests, 1, heads, kEntry}), cache,
                                      table, local_lens, Device::cuda(device));
  const Tensor gathered_lse = on_gpu(test::nan_tensor({w, requests, heads}, DType::kF32), device);
  const Tensor corrected =
      on_gpu(test::nan_tensor({w, requests, kHeadsPerRank, kLatent}, DType::kF32), device);
  const Tensor out =
      on_gpu(test::nan_tensor({requests, kHeadsPerRank, kLatent}, DType::kF32), device);
  dist::dcp_combine_heads(comm, partial.out.view().reshape({requests, heads, kLatent}),
                          partial.lse.view().reshape({requests, heads}), gathered_lse, corrected,
                          out);
  const Tensor combined = on_host(out);

  // (a) The single-GPU decode of the same problem on this GPU: the whole CPU-written cache, every
  // head, the CPU's q.
  const Tensor full_cache = on_gpu(g.full.cache, device),
               full_table = on_gpu(g.full.block_table, device),
               q_single = on_gpu(g.q_decode, device);
  const DecodeResult single_gpu = decode(c, q_single.view().reshape({requests, 1, heads, kEntry}),
                                         full_cache, full_table, g.seq_lens, Device::cuda(device));
  const Tensor single_out = on_host(single_gpu.out), single_lse = on_host(single_gpu.lse);
  // The single-GPU decode itself meets the decode tests' rule (else (a) proves little).
  EXPECT_TRUE(test::all_close(single_out, g.oracle.out, decode_test::out_tolerance(g.rule)))
      << "single-GPU out vs oracle, rank " << rank;
  EXPECT_TRUE(test::all_close(single_lse, g.oracle.lse, decode_test::kLseTolerance))
      << "single-GPU lse vs oracle, rank " << rank;
  // W = 1: the same kernel with the same plan (same lengths and block-table width) over the same
  // keys in the same order (only the block ids differ), and an LSE correction of exp(0) = 1:
  // equal to f32 rounding. W > 1: each rank's kernel sees a subset of the keys, so its running
  // maxima, and with them the roundings of P to E, differ from the single-GPU run's (not only the
  // order of the f32 sums): both are within the rule's bound of the oracle, so within twice that
  // bound of each other.
  test::Tolerance vs_single = test::tolerance_for(DType::kF32);
  if (w > 1) {
    const test::Tolerance t = decode_test::out_tolerance(g.rule);
    vs_single = {2 * t.atol, 2 * t.rtol};
  }
  EXPECT_TRUE(test::all_close(
      combined, rank_heads(test::to_doubles(single_out), requests, w, rank, kLatent), vs_single))
      << "DCP vs single-GPU decode, rank " << rank;

  // (b) The fp64 oracle, by the decode GPU tests' rule.
  const std::vector<double> want = rank_heads(g.oracle.out, requests, w, rank, kLatent);
  EXPECT_TRUE(test::all_close(combined, want, decode_test::out_tolerance(g.rule)))
      << "DCP out vs oracle, rank " << rank;
  EXPECT_LT(decode_test::cos_diff(test::to_doubles(combined), want), decode_test::cos_bar(g.rule))
      << "DCP out: cosine distance to the oracle, rank " << rank;
  // The LSE of every head over all the keys, from the partial LSEs all ranks gathered.
  EXPECT_TRUE(test::all_close(combined_lse(on_host(gathered_lse)).view(), g.oracle.lse,
                              decode_test::kLseTolerance))
      << "combined lse (from gathered_lse) vs oracle, rank " << rank;

  // Context chunks: the whole cached length of every request as context.
  const std::vector<int32_t> contexts(g.seq_lens.begin(), g.seq_lens.end());
  const Tensor exchange =
      on_gpu(test::nan_tensor({kWorkspaceTokens, kEntry}, host_local.cache.view().dtype), device);
  const Tensor dst = on_gpu(test::nan_tensor({kWorkspaceTokens, kEntry}, DType::kBF16), device);
  auto to_tensor = [](const std::vector<int32_t>& v) {
    return test::int_tensor(std::vector<int64_t>(v.begin(), v.end()),
                            {static_cast<int64_t>(v.size())}, DType::kI32);
  };
  for (const DcpContextChunk& chunk : plan_dcp_context_chunks(
           contexts, c.block_size, kWorkspaceTokens, ChunkPolicy::kPacked, dcp)) {
    const Tensor cu = on_gpu(to_tensor(chunk.local.cu_seq_lens), device);
    const Tensor starts = on_gpu(to_tensor(chunk.local.starts), device);
    const Tensor rows = on_gpu(to_tensor(chunk.gathered_row), device);
    dist::dcp_gather_context_chunk(comm, cache, table,
                                   {cu.view(), starts.view(), rows.view(), chunk.rows_per_rank},
                                   exchange, dst, c.kv, kKScale);
    const int64_t total = chunk.global.total_tokens;
    Tensor want_rows = test::nan_tensor({total, kEntry}, DType::kBF16);
    ops::gather_and_maybe_dequant_cache(
        g.full.cache, want_rows, g.full.block_table, to_tensor(chunk.global.cu_seq_lens),
        to_tensor(chunk.global.token_to_seq), total, c.kv, kKScale, to_tensor(chunk.global.starts));
    const Tensor got = on_host(dst);
    EXPECT_TRUE(
        test::all_close(got.view().narrow(0, 0, total), test::to_doubles(want_rows), {0, 0}))
        << "context chunk, rank " << rank;
  }
  EXPECT_NO_THROW(ops::check_device_errors(Device::cuda(device)));
}

class DcpNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    const int count = gpu_count();
    if (count < 1) GTEST_SKIP() << "DCP over NCCL needs a GPU, found none";
    comms_.resize(count);
    ASSERT_EQ(ncclCommInitAll(comms_.data(), count, nullptr), ncclSuccess);
  }
  void TearDown() override {
    for (ncclComm_t comm : comms_) ncclCommDestroy(comm);
  }
  std::vector<ncclComm_t> comms_;
};

TEST_F(DcpNccl, DecodeMatchesTheSingleGpuAndTheOracleContextTheCpu) {
  const int64_t w = static_cast<int64_t>(comms_.size());
  uint64_t stream = 2000;
  for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3}) {
    for (int64_t block_size : {16, 64}) {
      for (int64_t interleave : {1, 16, 64}) {
        const Config c{kv, block_size, interleave};
        SCOPED_TRACE(std::string(kv_cache_dtype_name(kv)) + " block_size " +
                     std::to_string(block_size) + " interleave " + std::to_string(interleave) +
                     ", W " + std::to_string(w));
        const auto start = std::chrono::steady_clock::now();
        auto rng = test::make_rng(++stream);
        const Global g = make_global(c, w, rng);
        std::vector<std::thread> ranks;
        for (int64_t rank = 0; rank < w; ++rank) {
          ranks.emplace_back([&, rank] {
            const auto comm = dist::make_nccl_communicator(comms_[rank], static_cast<int>(rank));
            run_rank(*comm, c, g, stream);
          });
        }
        for (std::thread& t : ranks) t.join();
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
        std::cout << "[dcp_nccl_test] " << kv_cache_dtype_name(kv) << " block_size " << block_size
                  << " interleave " << interleave << ", W " << w << ": " << took.count() << " s"
                  << std::endl;
      }
    }
  }
}

#else

TEST(DcpNccl, DecodeMatchesTheSingleGpuAndTheOracleContextTheCpu) {
  GTEST_SKIP() << "this build has no NCCL communicator (MLAKIT_WITH_NCCL off); " << gpu_count()
               << " GPUs visible";
}

#endif  // MLAKIT_WITH_NCCL

}  // namespace
}  // namespace mlakit
