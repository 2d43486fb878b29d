// ops::fill_token_to_seq on the GPU: a grid-stride loop over rows, each a binary search over
// cu_seq_lens.
#include <cstdint>

#include "cuda/cache/launch.hpp"
#include "cuda/common/runtime.hpp"

namespace mlakit::cuda {

namespace {

constexpr const char* kOp = "fill_token_to_seq";
// Threads per block: rows are independent; 256 keeps several blocks per SM for latency hiding.
constexpr int kThreads = 256;

struct TokenToSeqParams {
  const int32_t* cu_seq_lens;  // [batch + 1]
  int64_t cu_stride;
  int32_t* token_to_seq;  // [>= num_tokens]
  int64_t out_stride;
  int64_t batch;
  int64_t num_tokens;
};

// token_to_seq[t] = the last b in [0, batch) with cu_seq_lens[b] <= t, or -1 when t lies outside
// [cu_seq_lens[b], cu_seq_lens[b + 1]) (malformed offsets: the gather then skips and reports it).
__global__ void token_to_seq_kernel(const __grid_constant__ TokenToSeqParams p) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < p.num_tokens;
       t += stride) {
    int64_t lo = 0, hi = p.batch;  // the answer lies in [lo, hi)
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (p.cu_seq_lens[mid * p.cu_stride] <= t) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    const bool inside = p.batch > 0 && p.cu_seq_lens[lo * p.cu_stride] <= t &&
                        t < p.cu_seq_lens[(lo + 1) * p.cu_stride];
    p.token_to_seq[t * p.out_stride] = inside ? static_cast<int32_t>(lo) : -1;
  }
}

}  // namespace

void fill_token_to_seq(const TensorView& cu_seq_lens, const TensorView& token_to_seq,
                       int64_t num_tokens, Stream stream) {
  if (num_tokens == 0) return;
  DeviceGuard guard(token_to_seq.device, kOp);
  TokenToSeqParams p;
  p.cu_seq_lens = cu_seq_lens.data_as<const int32_t>();
  p.cu_stride = cu_seq_lens.strides[0];
  p.token_to_seq = token_to_seq.data_as<int32_t>();
  p.out_stride = token_to_seq.strides[0];
  p.batch = cu_seq_lens.shape[0] - 1;
  p.num_tokens = num_tokens;
  token_to_seq_kernel<<<static_cast<unsigned>(grid_blocks(num_tokens, kThreads)), kThreads, 0,
                        as_cuda_stream(stream)>>>(p);
  check_launch(kOp, "token_to_seq_kernel");
}

}  // namespace mlakit::cuda
