// Uniform split-KV schedule of the CUDA decode (schedule.hpp).
#include "cuda/decode/schedule.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <limits>

#include "core/check.hpp"
#include "cuda/decode/tile_shape.hpp"

namespace mlakit::cuda {

using detail::require;

namespace {

// The cost model counts time in units of one key tile's streaming time: 64 entries of 576 bf16
// values (72 KiB) at a 1/num_sms share of the memory bandwidth, about 2 us on an H200.
constexpr double kTileBytes = 64.0 * 1152.0;
// Fixed cost of one CTA: loading q, filling the copy pipeline and the epilogue.
constexpr double kCtaOverheadTiles = 1.0;
// The combine kernel's launch and tail, besides reading the partials.
constexpr double kCombineOverheadTiles = 1.0;
// One partial row: 512 f32 values and the LSE, written by the decode and read by the combine.
constexpr double kPartialRowBytes = 513.0 * 4.0;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t decode_num_splits(int64_t batch, int64_t rows_per_request, int64_t max_seq_len,
                          int64_t num_sms) {
  constexpr const char* kOp = "decode_num_splits";
  require(batch >= 0 && rows_per_request >= 0 && max_seq_len >= 0, ErrorCode::kInvalidArgument, kOp,
          ": sizes must be >= 0, got batch ", batch, ", rows ", rows_per_request, ", max_seq_len ",
          max_seq_len);
  require(num_sms > 0, ErrorCode::kInvalidArgument, kOp, ": num_sms must be > 0, got ", num_sms);
  if (batch == 0 || rows_per_request == 0) return 1;
  const int64_t tiles = std::max<int64_t>(1, ceil_div(max_seq_len, kDecodeKeyTile));
  const int64_t rows_per_cta = decode_rows_per_cta(rows_per_request);
  const int64_t ctas_per_split = batch * ceil_div(rows_per_request, rows_per_cta);
  // A CTA of a split request also writes its partial rows; the combine reads all of them back
  // spread over the whole GPU.
  const double partial_write_tiles =
      static_cast<double>(std::min(rows_per_cta, rows_per_request)) * kPartialRowBytes / kTileBytes;
  int64_t best = 1;
  double best_cost = std::numeric_limits<double>::infinity();
  for (int64_t s = 1; s <= std::min(tiles, kMaxDecodeSplits); ++s) {
    const int64_t waves = ceil_div(ctas_per_split * s, num_sms);
    double cost =
        static_cast<double>(waves) * (static_cast<double>(ceil_div(tiles, s)) + kCtaOverheadTiles +
                                      (s > 1 ? partial_write_tiles : 0.0));
    if (s > 1) {
      cost += kCombineOverheadTiles + static_cast<double>(batch * rows_per_request * s) *
                                          kPartialRowBytes /
                                          (static_cast<double>(num_sms) * kTileBytes);
    }
    if (cost < best_cost * (1.0 - 1e-9)) best = s, best_cost = cost;  // ties: fewer splits
  }
  return best;
}

DecodeSchedule uniform_decode_schedule(int64_t batch, int64_t num_splits, int64_t max_seq_len) {
  constexpr const char* kOp = "uniform_decode_schedule";
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  require(num_splits >= 1 && num_splits <= kMaxDecodeSplits, ErrorCode::kInvalidArgument, kOp,
          ": num_splits must be in [1, ", kMaxDecodeSplits, "], got ", num_splits);
  require(batch >= 0 && batch * num_splits <= kInt32Max, ErrorCode::kInvalidArgument, kOp,
          ": batch must be in [0, 2^31 / num_splits), got ", batch);
  require(max_seq_len >= 0 && max_seq_len <= kInt32Max, ErrorCode::kInvalidArgument, kOp,
          ": max_seq_len must be in [0, 2^31 - 1], got ", max_seq_len);
  const int64_t chunk =
      std::max<int64_t>(1, ceil_div(ceil_div(max_seq_len, num_splits), kDecodeKeyTile)) *
      kDecodeKeyTile;
  DecodeSchedule s;
  s.split_offsets.resize(batch + 1);
  for (int64_t b = 0; b <= batch; ++b) s.split_offsets[b] = static_cast<int32_t>(b * num_splits);
  s.split_len.assign(batch, static_cast<int32_t>(std::min(chunk, kInt32Max / 64 * 64)));
  s.total_splits = batch * num_splits;
  s.max_splits = num_splits;
  return s;
}

DecodeSchedule plan_decode_splits_cuda(int64_t batch, int64_t s_q, int64_t num_heads,
                                       int64_t max_seq_len, Device device) {
  require(device.is_cuda(), ErrorCode::kInvalidArgument,
          "plan_decode_splits_cuda: device must be a CUDA device, got ", device_name(device));
  int num_sms = 0;
  const cudaError_t status =
      cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device.index);
  require(status == cudaSuccess, ErrorCode::kBackend,
          "plan_decode_splits_cuda: cudaDeviceGetAttribute on ", device_name(device),
          " failed: ", cudaGetErrorString(status));
  const int64_t splits = decode_num_splits(batch, s_q * num_heads, max_seq_len, num_sms);
  return uniform_decode_schedule(batch, splits, max_seq_len);
}

}  // namespace mlakit::cuda
