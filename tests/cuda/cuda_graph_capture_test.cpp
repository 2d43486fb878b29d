// The CUDA ops are graph-capturable: a step of cache writes (one with the queries' rope part),
// gathers, copies, fill, fp8 quantization and a mixed-dtype batched matmul is captured on a stream,
// replayed, and must give the same bytes as the same step run eagerly (a host sync or an allocation
// in any op would invalidate the capture). A call that would have to allocate during capture throws
// instead.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "common/gemm_reference.hpp"
#include "common/test_util.hpp"
#include "cuda/elementwise/launch.hpp"
#include "gpu_test_util.hpp"
#include "mlakit/error.hpp"
#include "mlakit/kv_cache.hpp"
#include "mlakit/ops.hpp"
#include "ops/cache_write_with_q_rope.hpp"

namespace mlakit {
namespace {

using test::Mirrored;

class CudaStream {
 public:
  CudaStream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess); }
  ~CudaStream() { cudaStreamDestroy(s_); }
  cudaStream_t get() const { return s_; }
  Stream stream() const { return {s_}; }

 private:
  cudaStream_t s_ = nullptr;
};

// Device buffers of one decode-like step; outputs are reset to their poisoned bytes by reset().
struct Step {
  static constexpr int64_t kTokens = 24, kBlocks = 8, kBlockSize = 16, kHeads = 4;
  Mirrored kv_c, k_pe, slots, cache, cache_fp8, table, cu, tts, starts, gathered, cp_dst, q, q_fp8,
      o_lat, w_uv, out, zeros, cache_ds, ql;

  explicit Step(std::mt19937_64& rng)
      : kv_c(test::random_tensor(rng, {kTokens, 512}, DType::kBF16)),
        k_pe(test::random_tensor(rng, {kTokens, 64}, DType::kBF16)),
        slots(test::int_tensor(shuffled_slots(rng), {kTokens}, DType::kI64)),
        cache(test::nan_tensor({kBlocks, kBlockSize, 576}, DType::kBF16)),
        cache_fp8(test::nan_tensor({kBlocks, kBlockSize, 576}, DType::kU8)),
        table(test::int_tensor({3, 1, 2, 0, 7, 5}, {2, 3}, DType::kI32)),
        cu(test::int_tensor({0, 20, 30}, {3}, DType::kI32)),
        tts(test::int_tensor(token_to_seq(), {30}, DType::kI32)),
        starts(test::int_tensor({4, 9}, {2}, DType::kI32)),
        gathered(test::nan_tensor({30, 576}, DType::kF32)),
        cp_dst(test::nan_tensor({30, 576}, DType::kBF16)),
        q(test::random_tensor(rng, {kTokens, kHeads, 576}, DType::kBF16)),
        q_fp8(test::nan_tensor({kTokens, kHeads, 576}, DType::kU8)),
        o_lat(test::random_tensor(rng, {kTokens, kHeads, 512}, DType::kF32)),
        w_uv(test::random_tensor(rng, {kHeads, 512, 128}, DType::kBF16)),
        out(test::nan_tensor({kTokens, kHeads * 128}, DType::kBF16)),
        zeros(test::nan_tensor({kTokens, kHeads, 40}, DType::kF32)),
        cache_ds(test::nan_tensor({kBlocks, kBlockSize, kDsMlaEntryBytes}, DType::kU8)),
        ql(test::nan_tensor({kTokens, kHeads, 576}, DType::kBF16)) {}

  static std::vector<int64_t> shuffled_slots(std::mt19937_64& rng) {
    std::vector<int64_t> s(kBlocks * kBlockSize);
    std::iota(s.begin(), s.end(), 0);
    std::shuffle(s.begin(), s.end(), rng);
    s.resize(kTokens);
    s[5] = -1;  // a padding token
    return s;
  }
  static std::vector<int64_t> token_to_seq() {
    std::vector<int64_t> t(30, 0);
    for (int i = 20; i < 30; ++i) t[i] = 1;
    return t;
  }

  void run(Stream s) const {
    ops::concat_and_cache_mla(kv_c.device, k_pe.device, cache.device, slots.device,
                              KvCacheDType::kAuto, 1.0f, s);
    ops::concat_and_cache_mla(kv_c.device, k_pe.device, cache_fp8.device, slots.device,
                              KvCacheDType::kFp8E4m3, 0.5f, s);
    ops::gather_and_maybe_dequant_cache(cache_fp8.device, gathered.device, table.device, cu.device,
                                        tts.device, 30, KvCacheDType::kFp8E4m3, 0.5f,
                                        starts.device.view(), s);
    ops::cp_gather_cache(cache.device, cp_dst.device, table.device, cu.device, 2,
                         starts.device.view(), s);
    ops::copy(gathered.device.view().narrow(1, 0, 64), cp_dst.device.view().narrow(1, 512, 64), s);
    cuda::scaled_fp8_quant(q.device, q_fp8.device.view().with_dtype(DType::kFp8E4m3), 1.0f / 0.3f,
                           s);
    ops::batched_matmul(
        o_lat.device.view().transpose(0, 1), w_uv.device,
        TensorView::strided(out.device.view().data, DType::kBF16, {kHeads, kTokens, 128},
                            {128, kHeads * 128, 1}, Device::cuda(0)),
        s);
    ops::fill_zero(zeros.device.view().narrow(2, 4, 32), s);
    // The decode layer's cache write with the queries' rope part (one launch).
    ops::concat_and_cache_mla_with_q_rope(
        kv_c.device, k_pe.device, cache_ds.device, slots.device, KvCacheDType::kFp8DsMla, 1.0f,
        q.device.view().narrow(2, 128, 64), ql.device.view().narrow(2, 512, 64), s);
  }

  // Poisons the outputs again (host copies are still poisoned).
  void reset(cudaStream_t s) const {
    for (const Mirrored* m :
         {&cache, &cache_fp8, &gathered, &cp_dst, &q_fp8, &out, &zeros, &cache_ds, &ql}) {
      EXPECT_EQ(cudaMemcpyAsync(m->device.view().data, m->host.view().data,
                                test::storage_bytes(m->host), cudaMemcpyHostToDevice, s),
                cudaSuccess);
    }
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  }

  std::vector<Tensor> outputs() const {
    std::vector<Tensor> r;
    for (const Mirrored* m :
         {&cache, &cache_fp8, &gathered, &cp_dst, &q_fp8, &out, &zeros, &cache_ds, &ql})
      r.push_back(test::to_host(m->device));
    return r;
  }
};

TEST(CudaGraphCapture, CapturedStepReplaysTheEagerResult) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(301);
  const Step step(rng);
  const CudaStream stream;

  step.run(stream.stream());  // eager, also the warm-up (cuBLAS handle, scratch)
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  ops::check_device_errors(Device::cuda(0), stream.stream());
  const std::vector<Tensor> eager = step.outputs();
  step.reset(stream.get());

  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal), cudaSuccess);
  step.run(stream.stream());
  ASSERT_EQ(cudaStreamEndCapture(stream.get(), &graph), cudaSuccess)
      << "an op synchronized or allocated during capture";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    ASSERT_EQ(cudaGraphLaunch(exec, stream.get()), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    const std::vector<Tensor> replayed = step.outputs();
    for (size_t i = 0; i < eager.size(); ++i) {
      EXPECT_TRUE(test::same_bits(eager[i], replayed[i], false)) << "output " << i;
    }
  }
  ops::check_device_errors(Device::cuda(0), stream.stream());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// A mixed-dtype matmul needs scratch; the first call of a size on a stream (which may also create
// the stream's cuBLAS context) must allocate, so under capture it throws instead; after one eager
// call the same call captures. 8 MiB of bf16 scratch exceeds the initial 4 MiB and anything the
// other test of this program used (a reused stream handle cannot hide the growth).
TEST(CudaGraphCapture, MatmulThatMustAllocateRefusesCapture) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(302);
  const Mirrored a(test::random_tensor(rng, {1, 2048, 2048}, DType::kF32));
  const Mirrored w(test::random_tensor(rng, {1, 2048, 8}, DType::kBF16));
  const Mirrored c(test::nan_tensor({1, 2048, 8}, DType::kBF16));
  const CudaStream stream;
  ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal), cudaSuccess);
  try {
    ops::batched_matmul(a.device, w.device, c.device, stream.stream());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("run the same call once before capturing"),
              std::string::npos)
        << e.what();
  }
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream.get(), &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();  // a refused capture may leave an error behind; clear it

  ops::batched_matmul(a.device, w.device, c.device, stream.stream());  // warm-up: allocates
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_NO_THROW(ops::batched_matmul(a.device, w.device, c.device, stream.stream()));
  graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream.get(), &graph), cudaSuccess);
  cudaGraphDestroy(graph);
}

// A GEMM problem first seen during capture (the stream's cuBLAS context exists): its cuBLASLt
// plan is made then (host work only: descriptors and a heuristic query), and the captured call
// replays the bits of the same call run eagerly afterwards (which reuses that plan).
TEST(CudaGraphCapture, NewGemmProblemPlansDuringCapture) {
  MLAKIT_SKIP_WITHOUT_GPU();
  auto rng = test::make_rng(303);
  const Mirrored a(test::random_tensor(rng, {3, 37, 96}, DType::kBF16));
  const Mirrored w(test::random_tensor(rng, {3, 96, 72}, DType::kBF16));
  const Mirrored c(test::nan_tensor({3, 37, 72}, DType::kBF16));
  const CudaStream stream;
  ops::prepare_stream(Device::cuda(0), stream.stream());
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_NO_THROW(ops::batched_matmul(a.device, w.device, c.device, stream.stream()));
  ASSERT_EQ(cudaStreamEndCapture(stream.get(), &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream.get()), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  const Tensor replayed = test::to_host(c.device);
  EXPECT_EQ(test::count_nan(replayed.view()), 0) << "the replay left elements of c unwritten";
  ops::batched_matmul(a.device, w.device, c.device, stream.stream());
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  EXPECT_TRUE(test::same_bits(replayed, test::to_host(c.device), false));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace
}  // namespace mlakit
