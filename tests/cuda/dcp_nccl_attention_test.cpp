// MlaAttention under DCP over NCCL on every visible GPU (W = the device count; skipped, saying so,
// only without a GPU or without NCCL in the build). As dcp_nccl_test: one process,
// ncclCommInitAll, one thread per GPU running its rank. Each rank serves its N heads of a model of
// W N heads, holds its share of every request's tokens, and its forward() output on mixed batches
// must equal the single-rank layer over the whole cache on the same GPU to rounding; the e2e
// harness checks the DCP output against the fp64 oracle (the single-rank layer against the oracle
// is cuda_forward_test's check: the oracle's up-projection costs seconds a case at these sizes,
// so it runs once per rank and configuration). At W = 1 the layer ignores the communicator (a group
// of one rank is no DCP): both runs are the single-rank layer and no collective runs; the DCP path
// needs W >= 2. Each configuration prints its time. Run with NCCL_NVLS_ENABLE=0 on the lent
// machines (docs/dcp.md).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#ifdef MLAKIT_WITH_NCCL
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mla_harness.hpp"
#include "common/test_util.hpp"
#include "mlakit/dist_nccl.hpp"
#endif

namespace mlakit {
namespace {

int gpu_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

#ifdef MLAKIT_WITH_NCCL

// The batch of one configuration, the same on every rank: decodes (q_len 1) around one turn of
// the ranks and whole blocks, one long; prefills without context, with a context most ranks hold
// none of, and with a context of several 1024-row chunks.
test::E2eCase make_case(KvCacheDType kv, int64_t block_size, int64_t interleave, int64_t w,
                        int64_t rank, uint64_t stream) {
  const auto turn = static_cast<int32_t>(w * interleave);
  const auto bs = static_cast<int32_t>(block_size);
  test::E2eCase e;
  e.name = std::string(kv_cache_dtype_name(kv)) + " block_size " + std::to_string(bs) +
           " interleave " + std::to_string(interleave);
  e.dims = MlaDims{16, 512, 64, 128, 128};  // DeepSeek-V3 at TP 8
  e.act_dtype = DType::kBF16;
  e.kv_dtype = kv;
  e.k_scale = kv == KvCacheDType::kAuto ? 1.0f : 0.05f;  // N(0, 1) / 0.05 stays inside +-448
  e.q_scale = kv == KvCacheDType::kAuto ? 1.0f : 0.05f;
  e.block_size = block_size;
  e.workspace_tokens = 1024;  // a multiple of every lcm(block_size, W I) here (W <= 8)
  const std::vector<std::pair<int32_t, int32_t>> context_and_query = {
      {turn, 1}, {3 * bs, 1}, {3000, 1}, {0, 5}, {std::max(turn - 1, 1), 3}, {3500, 6}};
  for (auto [context, query] : context_and_query) {
    e.seq_lens.push_back(context + query);
    e.query_lens.push_back(query);
  }
  e.step_plan = true;
  e.seed_stream = stream;
  e.head_ranks = w;
  e.head_rank = rank;
  e.dcp_interleave = interleave;
  e.device = Device::cuda(static_cast<int>(rank));
  return e;
}

class DcpNcclAttention : public ::testing::Test {
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

TEST_F(DcpNcclAttention, EveryRankMatchesTheSingleRankLayerAndTheOracle) {
  const int64_t w = static_cast<int64_t>(comms_.size());
  uint64_t stream = 2100;
  for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3}) {
    for (int64_t block_size : {16, 64}) {
      for (int64_t interleave : {1, 16, 64}) {
        ++stream;
        const auto start = std::chrono::steady_clock::now();
        std::vector<std::thread> ranks;
        for (int64_t rank = 0; rank < w; ++rank) {
          ranks.emplace_back([&, rank] {
            ASSERT_EQ(cudaSetDevice(static_cast<int>(rank)), cudaSuccess);
            const auto comm = dist::make_nccl_communicator(comms_[rank], static_cast<int>(rank));
            test::E2eCase single = make_case(kv, block_size, interleave, w, rank, stream);
            SCOPED_TRACE(single.name + ", rank " + std::to_string(rank) + " of " +
                         std::to_string(w));
            single.check_oracle = false;  // compared with the DCP run, which is checked
            test::E2eCase dcp = single;
            dcp.name += " (DCP)";
            dcp.dcp_comm = comm.get();
            dcp.check_oracle = true;
            const test::E2eResult expected = test::run_e2e_case(single);
            const test::E2eResult got = test::run_e2e_case(dcp);
            // Other partitions (ranks, chunks) and orders of the f32 sums: equal to the rounding
            // of the bf16 output.
            EXPECT_TRUE(test::all_close(got.output, test::to_doubles(expected.output),
                                        test::tolerance_for(DType::kBF16)))
                << "DCP vs single-rank layer";
          });
        }
        for (std::thread& t : ranks) t.join();
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
        std::cout << "[dcp_nccl_attention_test] " << kv_cache_dtype_name(kv) << " block_size "
                  << block_size << " interleave " << interleave << ", W " << w << ": "
                  << took.count() << " s" << std::endl;
      }
    }
  }
}

#else

TEST(DcpNcclAttention, EveryRankMatchesTheSingleRankLayerAndTheOracle) {
  GTEST_SKIP() << "this build has no NCCL communicator (MLAKIT_WITH_NCCL off); " << gpu_count()
               << " GPUs visible";
}

#endif  // MLAKIT_WITH_NCCL

}  // namespace
}  // namespace mlakit
