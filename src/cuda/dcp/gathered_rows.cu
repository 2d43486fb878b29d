// dcp_gathered_rows on the GPU (spec B.7; ops.hpp): a grid-stride loop over the chunk's rows, each
// a binary search over cu_seq_lens for its request, then the owner rank's row of the all-gathered
// buffer (the formula of cpu/dcp.cpp and plan_dcp_context_chunks).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/runtime.hpp"
#include "cuda/dcp/launch.hpp"

namespace mlakit::cuda {

namespace {

constexpr const char* kOp = "dcp_gathered_rows";
// Threads per block: rows are independent; 256 keeps several blocks per SM for latency hiding.
constexpr int kThreads = 256;

struct GatheredRowsParams {
  const int32_t* cu_seq_lens;       // [np + 1], stride cu_stride
  const int32_t* seq_starts;        // [np], stride starts_stride
  const int32_t* rank_cu_seq_lens;  // [W, np + 1], strides rank_cu_stride[2]
  int32_t* row_index;               // [>= num_tokens], stride out_stride
  int64_t cu_stride, starts_stride, rank_cu_stride[2], out_stride;
  int64_t requests;  // np
  int64_t world_size, interleave, rows_per_rank, num_tokens;
};

__global__ void __launch_bounds__(kThreads)
    gathered_rows_kernel(const __grid_constant__ GatheredRowsParams p) {
  const int64_t threads = int64_t{gridDim.x} * kThreads;
  const int64_t turn = p.world_size * p.interleave;
  for (int64_t t = int64_t{blockIdx.x} * kThreads + threadIdx.x; t < p.num_tokens; t += threads) {
    int64_t lo = 0, hi = p.requests;  // the request lies in [lo, hi)
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (p.cu_seq_lens[mid * p.cu_stride] <= t) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    int64_t row = -1;
    const bool inside = p.requests > 0 && p.cu_seq_lens[lo * p.cu_stride] <= t &&
                        t < p.cu_seq_lens[(lo + 1) * p.cu_stride];
    if (inside) {
      const int64_t start = p.seq_starts[lo * p.starts_stride];
      const int64_t pos = start + t - p.cu_seq_lens[lo * p.cu_stride];
      const int64_t owner = (pos / p.interleave) % p.world_size;
      // Local position (p / (W I)) I + p % I, less the piece's local start start / W.
      const int64_t local = pos / turn * p.interleave + pos % p.interleave - start / p.world_size;
      row = owner * p.rows_per_rank +
            p.rank_cu_seq_lens[owner * p.rank_cu_stride[0] + lo * p.rank_cu_stride[1]] + local;
      const bool aligned = start >= 0 && start % turn == 0;
      if (!aligned || row < 0 || row >= p.world_size * p.rows_per_rank) row = -1;
    }
    p.row_index[t * p.out_stride] = static_cast<int32_t>(row);
  }
}

}  // namespace

void dcp_gathered_rows(const TensorView& cu_seq_lens, const TensorView& seq_starts,
                       const TensorView& rank_cu_seq_lens, int64_t rows_per_rank,
                       int64_t interleave, const TensorView& row_index, int64_t num_tokens,
                       Stream stream) {
  if (num_tokens == 0) return;
  DeviceGuard guard(row_index.device, kOp);
  GatheredRowsParams p{};
  p.cu_seq_lens = cu_seq_lens.data_as<const int32_t>();
  p.seq_starts = seq_starts.data_as<const int32_t>();
  p.rank_cu_seq_lens = rank_cu_seq_lens.data_as<const int32_t>();
  p.row_index = row_index.data_as<int32_t>();
  p.cu_stride = cu_seq_lens.strides[0];
  p.starts_stride = seq_starts.strides[0];
  p.rank_cu_stride[0] = rank_cu_seq_lens.strides[0];
  p.rank_cu_stride[1] = rank_cu_seq_lens.strides[1];
  p.out_stride = row_index.strides[0];
  p.requests = cu_seq_lens.shape[0] - 1;
  p.world_size = rank_cu_seq_lens.shape[0];
  p.interleave = interleave;
  p.rows_per_rank = rows_per_rank;
  p.num_tokens = num_tokens;
  gathered_rows_kernel<<<static_cast<unsigned>(grid_blocks(num_tokens, kThreads)), kThreads, 0,
                         as_cuda_stream(stream)>>>(p);
  check_launch(kOp, "gathered_rows_kernel");
}

}  // namespace mlakit::cuda
