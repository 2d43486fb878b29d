// Host side of the sm90 decode: CUDA-specific checks, kernel arguments, the configuration choice
// and the grids (decode, then combine when a request has more than one split).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/check.hpp"
#include "cuda/common/device_errors.hpp"
#include "cuda/decode/decode.hpp"
#include "cuda/decode/schedule.hpp"
#include "cuda/decode/sm90/combine.cuh"
#include "cuda/decode/sm90/instantiations.cuh"
#include "cuda/decode/sm90/launch_plan.hpp"
#include "cuda/decode/sm90/params.cuh"
#include "cuda/decode/sm90/ptx.cuh"
#include "cuda/decode/sm90/traits.cuh"
#include "cuda/decode/sm90/traits_wgmma.cuh"
#include "cuda/decode/tile_shape.hpp"
#include "mlakit/kv_cache.hpp"

namespace mlakit::cuda {

using detail::require;
using namespace decode_sm90;

namespace {

constexpr const char* kOp = "mla_decode";
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
// Longest seq_len the kernel accepts: int32 key arithmetic keeps 2^14 of headroom for the
// round-up of split chunks (at most 64 keys per split, kMaxDecodeSplits = 256 splits).
constexpr int64_t kMaxSeqLen = kInt32Max - (int64_t{1} << 14);

void check_cuda(cudaError_t status, const char* what) {
  require(status == cudaSuccess, ErrorCode::kBackend, kOp, ": ", what,
          " failed: ", cudaGetErrorString(status));
}

// Makes the tensors' device current for the launch and restores the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

RuntimeDType runtime_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return RuntimeDType::kF32;
    case DType::kF16:
      return RuntimeDType::kF16;
    case DType::kBF16:
      return RuntimeDType::kBF16;
    default:
      return RuntimeDType::kFp8E4m3;  // kFp8E4m3 and kU8 (validated before)
  }
}

// Data pointer and the byte strides of dims [0, dims) are multiples of 16.
bool rows_16b_aligned(const TensorView& t, int dims) {
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  for (int d = 0; d < dims; ++d) {
    if (t.strides[d] * t.element_size() % 16 != 0) return false;
  }
  return true;
}

void check_supported(const DecodeProblem& pr, const DecodeSchedule& schedule) {
  require(pr.kv_lora_rank == kDimV && pr.entry_dim == kDimQK, ErrorCode::kUnsupported, kOp,
          ": the CUDA kernel supports kv_lora_rank 512 with qk_rope_head_dim 64 (576-wide "
          "entries), got ",
          pr.kv_lora_rank, " + ", pr.entry_dim - pr.kv_lora_rank);
  if (pr.kv_dtype == KvCacheDType::kAuto) {
    require(is_float16(pr.kv_cache.dtype), ErrorCode::kUnsupported, kOp,
            ": the CUDA kernel reads f16 or bf16 caches for kv_cache_dtype auto, got ",
            dtype_name(pr.kv_cache.dtype));
  }
  const int64_t batch = pr.q.size(0), s = schedule.max_splits;
  require(s >= 1 && s <= kMaxDecodeSplits, ErrorCode::kInvalidArgument, kOp,
          ": on CUDA, schedule.max_splits is the uniform split count and must be in [1, ",
          kMaxDecodeSplits, "], got ", s, " (plan with plan_decode_splits_cuda)");
  for (int64_t b = 0; b < batch; ++b) {
    require(schedule.num_splits(b) == s, ErrorCode::kInvalidArgument, kOp,
            ": on CUDA the schedule must be uniform (every request max_splits = ", s,
            " splits; plan with plan_decode_splits_cuda), but request ", b, " has ",
            schedule.num_splits(b));
  }
  require(rows_16b_aligned(pr.kv_cache, 2), ErrorCode::kInvalidArgument, kOp,
          ": on CUDA, kv_cache entries must start on 16-byte boundaries (data pointer and the "
          "block and slot strides in bytes multiples of 16)");
  require(rows_16b_aligned(pr.out, 3), ErrorCode::kInvalidArgument, kOp,
          ": on CUDA, rows of out must start on 16-byte boundaries (data pointer and strides of "
          "dims 0-2 in bytes multiples of 16)");
  require(s == 1 || reinterpret_cast<uintptr_t>(pr.workspace) % 16 == 0,
          ErrorCode::kInvalidArgument, kOp,
          ": on CUDA, split_workspace must start on a 16-byte boundary");
  const int64_t rows = pr.q.size(1) * pr.q.size(2);
  const int64_t ctas = batch * s * ((rows + kDecodeRowsSmall - 1) / kDecodeRowsSmall);
  require(ctas <= kInt32Max && batch * rows <= kInt32Max, ErrorCode::kUnsupported, kOp,
          ": batch x splits x row tiles and batch x s_q x N must fit in one grid (2^31 - 1 CTAs), "
          "got batch ",
          batch, ", ", s, " splits, ", rows, " rows per request");
}

DecodeKernelParams make_params(const DecodeProblem& pr, int64_t splits) {
  DecodeKernelParams k{};
  const TensorView &q = pr.q, &cache = pr.kv_cache, &bt = pr.block_table, &out = pr.out,
                   &lse = pr.lse;
  k.q = q.data;
  k.q_stride_batch = q.strides[0];
  k.q_stride_query = q.strides[1];
  k.q_stride_head = q.strides[2];
  k.q_dtype = runtime_dtype(q.dtype);
  k.q_rows_16b_aligned = rows_16b_aligned(q, 3);

  k.cache = static_cast<const uint8_t*>(cache.data);
  k.cache_stride_block_bytes = cache.strides[0] * cache.element_size();
  k.cache_stride_slot_bytes = cache.strides[1] * cache.element_size();
  k.num_blocks = static_cast<int32_t>(std::min(cache.size(0), kInt32Max));
  k.block_size = static_cast<int32_t>(std::min(cache.size(1), kInt32Max));

  k.block_table = static_cast<const int32_t*>(bt.data);
  k.block_table_stride_batch = bt.strides[0];
  k.block_table_stride_col = bt.strides[1];
  k.seq_lens = static_cast<const int32_t*>(pr.seq_lens.data);
  k.seq_lens_stride = pr.seq_lens.strides[0];
  const int64_t width = bt.size(1), block_size = cache.size(1);
  k.max_seq_len =
      static_cast<int32_t>(width > kMaxSeqLen / block_size ? kMaxSeqLen : width * block_size);

  k.out = out.data;
  k.out_stride_batch = out.strides[0];
  k.out_stride_query = out.strides[1];
  k.out_stride_head = out.strides[2];
  k.out_dtype = runtime_dtype(out.dtype);
  k.lse = static_cast<float*>(lse.data);
  k.lse_stride_batch = lse.strides[0];
  k.lse_stride_query = lse.strides[1];
  k.lse_stride_head = lse.strides[2];

  k.batch = static_cast<int32_t>(q.size(0));
  k.s_q = static_cast<int32_t>(q.size(1));
  k.num_heads = static_cast<int32_t>(q.size(2));
  k.rows = k.s_q * k.num_heads;
  k.row_tiles = static_cast<int32_t>((k.rows + decode_rows_per_cta(k.rows) - 1) /
                                     decode_rows_per_cta(k.rows));
  k.num_splits = static_cast<int32_t>(splits);
  const int64_t partial_rows = static_cast<int64_t>(k.batch) * splits * k.rows;
  k.partial_out = pr.workspace;
  k.partial_lse = splits > 1 ? pr.workspace + partial_rows * kDimV : nullptr;

  constexpr float kLog2e = 1.4426950408889634f;
  k.score_scale_log2 = pr.score_scale * kLog2e;
  k.value_scale = pr.value_scale;
  return k;
}

template <CacheFormat kFormat, class Element>
void launch_for_rows(const LaunchPlan& plan, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(plan.decode_ctas));
  if (plan.rows_per_cta == kDecodeRowsSmall) {
    launch_decode_kernel<Config<kDecodeRowsSmall, kFormat, Element>>(plan.decode, grid, stream);
  } else if constexpr (kFormat == CacheFormat::kNative) {
    // 64 rows over a 16-bit cache: compute-bound, the wgmma kernel (kernel_wgmma.cuh).
    launch_decode_wgmma_kernel<WgmmaConfig<Element>>(plan.decode, grid, stream);
  } else {
    launch_decode_kernel<Config<kDecodeRowsLarge, kFormat, Element>>(plan.decode, grid, stream);
  }
}

template <CacheFormat kFormat>
void launch_for_format(const LaunchPlan& plan, cudaStream_t stream) {
  if (plan.bf16_mma) {
    launch_for_rows<kFormat, Bf16Mma>(plan, stream);
  } else {
    launch_for_rows<kFormat, F16Mma>(plan, stream);
  }
}

}  // namespace

namespace decode_sm90 {

LaunchPlan plan_launch(const DecodeProblem& problem, const DecodeSchedule& schedule) {
  check_supported(problem, schedule);
  LaunchPlan plan;
  const int64_t batch = problem.q.size(0), rows = problem.q.size(1) * problem.q.size(2);
  if (batch == 0 || rows == 0) return plan;
  const int64_t splits = schedule.max_splits;
  plan.decode = make_params(problem, splits);
  plan.rows_per_cta = static_cast<int>(decode_rows_per_cta(rows));
  plan.decode_ctas = batch * splits * plan.decode.row_tiles;
  // The MMA element type: the cache's own for 16-bit caches, the rope dtype for fp8_ds_mla (its
  // rope values are copied as stored), and for fp8_e4m3 f16 unless q is bf16 or f32 (e4m3 -> f16
  // is one exact instruction; a bf16 or f32 q keeps bf16's range).
  switch (problem.kv_dtype) {
    case KvCacheDType::kAuto:
      plan.format = CacheFormat::kNative;
      plan.bf16_mma = problem.kv_cache.dtype == DType::kBF16;
      break;
    case KvCacheDType::kFp8E4m3:
      plan.format = CacheFormat::kFp8E4m3;
      plan.bf16_mma = problem.q.dtype == DType::kBF16 || problem.q.dtype == DType::kF32;
      break;
    case KvCacheDType::kFp8DsMla:
      plan.format = CacheFormat::kFp8DsMla;
      plan.bf16_mma = problem.rope_dtype == DType::kBF16;
      break;
  }
  if (splits > 1) {
    const DecodeKernelParams& k = plan.decode;
    CombineParams& c = plan.combine;
    c.partial_out = k.partial_out;
    c.partial_lse = k.partial_lse;
    c.out = k.out;
    c.out_stride_batch = k.out_stride_batch;
    c.out_stride_query = k.out_stride_query;
    c.out_stride_head = k.out_stride_head;
    c.out_dtype = k.out_dtype;
    c.lse = k.lse;
    c.lse_stride_batch = k.lse_stride_batch;
    c.lse_stride_query = k.lse_stride_query;
    c.lse_stride_head = k.lse_stride_head;
    c.batch = k.batch;
    c.num_heads = k.num_heads;
    c.rows = k.rows;
    c.num_splits = k.num_splits;
    plan.combine_ctas = batch * rows;  // one CTA per (request, row)
  }
  return plan;
}

}  // namespace decode_sm90

void mla_decode(const DecodeProblem& problem, const DecodeSchedule& schedule, Stream stream) {
  LaunchPlan plan = plan_launch(problem, schedule);
  if (plan.decode_ctas == 0) return;
  DeviceGuard guard(problem.q.device.index);
  plan.decode.error_word = device_error_word(kOp);
  const auto cuda_stream = static_cast<cudaStream_t>(stream.handle);
  switch (plan.format) {
    case CacheFormat::kNative:
      launch_for_format<CacheFormat::kNative>(plan, cuda_stream);
      break;
    case CacheFormat::kFp8E4m3:
      launch_for_format<CacheFormat::kFp8E4m3>(plan, cuda_stream);
      break;
    case CacheFormat::kFp8DsMla:
      launch_for_format<CacheFormat::kFp8DsMla>(plan, cuda_stream);
      break;
  }
  check_cuda(cudaGetLastError(), "decode kernel launch");
  if (plan.combine_ctas > 0) {
    launch_combine_kernel(plan.combine, dim3(static_cast<unsigned>(plan.combine_ctas)),
                          cuda_stream);
    check_cuda(cudaGetLastError(), "combine kernel launch");
  }
}

}  // namespace mlakit::cuda
