// dcp_slot_mapping on the GPU: one thread per token (spec A.3, F-16; placement in mlakit/dcp.hpp).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/device_errors.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda/dcp/launch.hpp"

namespace mlakit::cuda {

namespace {

constexpr const char* kOp = "dcp_slot_mapping";
constexpr int kThreads = 256;  // one token a thread; 8 warps a block is a common, safe size

struct SlotParams {
  const int64_t* positions;     // [T], stride positions_stride
  const int32_t* token_to_req;  // [T], stride req_stride
  const int32_t* block_table;   // [R, width], strides table_stride[2]
  int64_t* slot_mapping;        // [T], stride slot_stride
  int64_t positions_stride, req_stride, slot_stride, table_stride[2];
  int64_t tokens, requests, width, block_size;
  int64_t world_size, rank, interleave;
  uint32_t* error_word;
};

__global__ void __launch_bounds__(kThreads)
    slot_mapping_kernel(const __grid_constant__ SlotParams p) {
  const int64_t threads = int64_t{gridDim.x} * kThreads;
  for (int64_t t = int64_t{blockIdx.x} * kThreads + threadIdx.x; t < p.tokens; t += threads) {
    const int64_t pos = p.positions[t * p.positions_stride];
    int64_t slot = -1;
    if (pos >= 0 && (pos / p.interleave) % p.world_size == p.rank) {
      const int64_t r = p.token_to_req[t * p.req_stride];
      // Local position: (p / (W I)) I + p % I (mlakit::dcp_local_position).
      const int64_t local = pos / (p.world_size * p.interleave) * p.interleave + pos % p.interleave;
      const int64_t column = local / p.block_size;
      const bool row_ok = r >= 0 && r < p.requests && column < p.width;
      const int64_t block =
          row_ok ? p.block_table[r * p.table_stride[0] + column * p.table_stride[1]] : -1;
      // A block id whose slot block * block_size + offset would wrap int64 is a bad index too
      // (the CPU path refuses it the same way): a wrapped negative slot would skip the token.
      const int64_t last_block = (INT64_MAX - (p.block_size - 1)) / p.block_size;
      if (block >= 0 && block <= last_block) {
        slot = block * p.block_size + local % p.block_size;
      } else {
        raise_device_error(p.error_word, kDcpSlotBadIndex);
      }
    }
    p.slot_mapping[t * p.slot_stride] = slot;
  }
}

}  // namespace

void dcp_slot_mapping(const TensorView& positions, const TensorView& token_to_req,
                      const TensorView& block_table, int64_t block_size, const DcpConfig& dcp,
                      const TensorView& slot_mapping, Stream stream) {
  SlotParams p{};
  p.positions = positions.data_as<const int64_t>();
  p.token_to_req = token_to_req.data_as<const int32_t>();
  p.block_table = block_table.data_as<const int32_t>();
  p.slot_mapping = slot_mapping.data_as<int64_t>();
  p.positions_stride = positions.strides[0];
  p.req_stride = token_to_req.strides[0];
  p.slot_stride = slot_mapping.strides[0];
  p.table_stride[0] = block_table.strides[0];
  p.table_stride[1] = block_table.strides[1];
  p.tokens = positions.shape[0];
  p.requests = block_table.shape[0];
  p.width = block_table.shape[1];
  p.block_size = block_size;
  p.world_size = dcp.world_size;
  p.rank = dcp.rank;
  p.interleave = dcp.interleave;
  if (p.tokens == 0) return;
  DeviceGuard guard(slot_mapping.device, kOp);
  p.error_word = device_error_word(kOp);
  const int64_t blocks = grid_blocks(p.tokens, kThreads);
  slot_mapping_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, as_cuda_stream(stream)>>>(p);
  check_launch(kOp, "slot_mapping_kernel");
}

}  // namespace mlakit::cuda
