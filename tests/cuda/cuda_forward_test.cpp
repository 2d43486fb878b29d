// MlaAttention::forward on the GPU against the fp64 oracle: the end-to-end cases of
// tests/e2e/mla_forward_test.cpp with the layer, its cache and its inputs on cuda:0.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/mla_harness.hpp"
#include "common/test_util.hpp"

namespace mlakit::test {
namespace {

bool has_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

E2eCase gpu_case(std::string name, MlaDims dims, DType act, KvCacheDType kv, int64_t block_size,
                 std::vector<int32_t> seq_lens, std::vector<int32_t> query_lens, uint64_t stream) {
  E2eCase c;
  c.name = std::move(name);
  c.dims = dims;
  c.act_dtype = act;
  c.kv_dtype = kv;
  c.block_size = block_size;
  c.seq_lens = std::move(seq_lens);
  c.query_lens = std::move(query_lens);
  c.seed_stream = stream;
  c.device = Device::cuda(0);
  return c;
}

const MlaDims kDeepSeek16{16, 512, 64, 128, 128};

TEST(CudaForward, MixedBatchesEveryCacheFormat) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  uint64_t stream = 1000;
  for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3, KvCacheDType::kFp8DsMla}) {
    for (DType act : {DType::kBF16, DType::kF16}) {
      E2eCase c = gpu_case("mixed", kDeepSeek16, act, kv, 64, {32, 300, 48, 56, 129},
                           {1, 1, 5, 5, 129}, stream++);
      if (kv == KvCacheDType::kFp8E4m3) {
        c.q_scale = 2;
        c.k_scale = 3;
      }
      SCOPED_TRACE(std::string(kv_cache_dtype_name(kv)) + "/" + dtype_name(act));
      run_e2e_case(c);
    }
  }
}

// Decode-only steps: the queries' rope part rides on the cache write (one launch for both,
// docs/attention.md), in every cache format, alone and with layers sharing one StepPlan.
TEST(CudaForward, DecodeOnlyStepsEveryCacheFormat) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  uint64_t stream = 1050;
  for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3, KvCacheDType::kFp8DsMla}) {
    for (DType act : {DType::kBF16, DType::kF16}) {
      for (bool step_plan : {false, true}) {
        E2eCase c = gpu_case("decode_only", kDeepSeek16, act, kv, 64, {1, 65, 200, 33},
                             {1, 1, 1, 1}, stream++);
        c.step_plan = step_plan;
        c.num_layers = step_plan ? 2 : 1;
        if (kv == KvCacheDType::kFp8E4m3) {
          c.q_scale = 2;
          c.k_scale = 3;
        }
        SCOPED_TRACE(std::string(kv_cache_dtype_name(kv)) + "/" + dtype_name(act) +
                     (step_plan ? "/step plan" : ""));
        EXPECT_EQ(run_e2e_case(c).num_decodes, 4);
      }
    }
  }
}

TEST(CudaForward, SpeculativeDecodeAndBlockSizes) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  uint64_t stream = 1100;
  for (int64_t bs : {16, 32, 64, 128}) {
    E2eCase c = gpu_case("spec_decode", kDeepSeek16, DType::kBF16, KvCacheDType::kAuto, bs,
                         {40, 64, 80, 200}, {4, 4, 4, 4}, stream++);
    c.decode_threshold = 4;
    c.support = QueryLenSupport::kUniform;
    SCOPED_TRACE(bs);
    EXPECT_EQ(run_e2e_case(c).num_decodes, 4);
  }
}

TEST(CudaForward, ContextInManyChunksAndPaddedDecodes) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  E2eCase c = gpu_case("multi_chunk", kDeepSeek16, DType::kBF16, KvCacheDType::kAuto, 16,
                       {150, 8, 260, 45, 17}, {1, 8, 20, 5, 16}, 1200);
  c.workspace_tokens = 64;
  EXPECT_GE(run_e2e_case(c).context_chunks, 3);

  E2eCase padded = gpu_case("padded", kDeepSeek16, DType::kBF16, KvCacheDType::kAuto, 64,
                            {33, 64, 7}, {1, 1, 1}, 1201);
  padded.padding_requests = 2;
  padded.padding_tokens = 2;
  padded.support = QueryLenSupport::kUniform;
  run_e2e_case(padded);
}

TEST(CudaForward, OneHundredTwentyEightHeads) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  run_e2e_case(gpu_case("128_heads", MlaDims{128, 512, 64, 128, 128}, DType::kBF16,
                        KvCacheDType::kAuto, 64, {32, 40, 48, 56}, {1, 1, 5, 5}, 1300));
}

TEST(CudaForward, LayersShareOneStepPlan) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  uint64_t stream = 1400;
  for (KvCacheDType kv : {KvCacheDType::kAuto, KvCacheDType::kFp8E4m3, KvCacheDType::kFp8DsMla}) {
    E2eCase c = gpu_case("step_plan_layers", kDeepSeek16, DType::kBF16, kv, 16,
                         {150, 70, 260, 45, 17}, {1, 1, 20, 5, 16}, stream++);
    c.step_plan = true;
    c.num_layers = 3;
    c.workspace_tokens = 64;  // several context chunks
    if (kv == KvCacheDType::kFp8E4m3) {
      c.q_scale = 2;
      c.k_scale = 3;
    }
    SCOPED_TRACE(kv_cache_dtype_name(kv));
    EXPECT_GE(run_e2e_case(c).context_chunks, 3);
  }
  E2eCase padded = gpu_case("step_plan_padded_after_prefill", kDeepSeek16, DType::kBF16,
                            KvCacheDType::kAuto, 64, {33, 64, 20}, {1, 1, 20}, stream++);
  padded.step_plan = true;
  padded.padding_requests = 2;
  padded.padding_tokens = 3;
  run_e2e_case(padded);
}

}  // namespace
}  // namespace mlakit::test
