// Host side of the sm90 decode: CUDA-specific checks, kernel arguments, the configuration choice
// and the grids (plan, decode, then combine when the schedule can split a request).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/check.hpp"
#include "cuda/common/device_errors.hpp"
#include "cuda/common/runtime.hpp"
#include "cuda/decode/decode.hpp"
#include "cuda/decode/schedule.hpp"
#include "cuda/decode/sm90/cache_tensor_map.hpp"
#include "cuda/decode/sm90/combine.cuh"
#include "cuda/decode/sm90/instantiations.cuh"
#include "cuda/decode/sm90/launch_plan.hpp"
#include "cuda/decode/sm90/params.cuh"
#include "cuda/decode/sm90/plan.cuh"
#include "cuda/decode/sm90/ptx.cuh"
#include "cuda/decode/sm90/traits.cuh"
#include "cuda/decode/sm90/traits_wgmma.cuh"
#include "cuda/decode/tile_shape.hpp"
#include "cuda/decode/work_plan.hpp"
#include "mlakit/kv_cache.hpp"

namespace mlakit::cuda {

using detail::require;
using namespace decode_sm90;

namespace {

constexpr const char* kOp = "mla_decode";
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
// Longest seq_len the kernel accepts: int32 key positions run up to a tile (64 keys) past a
// segment's end; 2^14 keeps ample headroom below 2^31.
constexpr int64_t kMaxSeqLen = kInt32Max - (int64_t{1} << 14);

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

// The CUDA-specific checks; returns the work plan's sizes.
DevicePlanSizes check_supported(const DecodeProblem& pr, const DecodeSchedule& schedule) {
  require(pr.kv_lora_rank == kDimV && pr.entry_dim == kDimQK, ErrorCode::kUnsupported, kOp,
          ": the CUDA kernel supports kv_lora_rank 512 with qk_rope_head_dim 64 (576-wide "
          "entries), got ",
          pr.kv_lora_rank, " + ", pr.entry_dim - pr.kv_lora_rank);
  if (pr.kv_dtype == KvCacheDType::kAuto) {
    require(is_float16(pr.kv_cache.dtype), ErrorCode::kUnsupported, kOp,
            ": the CUDA kernel reads f16 or bf16 caches for kv_cache_dtype auto, got ",
            dtype_name(pr.kv_cache.dtype));
  }
  const int64_t batch = pr.q.size(0), s_q = pr.q.size(1), heads = pr.q.size(2);
  const DevicePlanSizes sizes = device_plan_sizes(schedule, s_q * heads, kDimV, kOp);
  const DeviceDecodeSchedule& d = schedule.device;
  require(d.batch == batch && d.s_q == s_q && d.num_heads == heads, ErrorCode::kInvalidArgument,
          kOp, ": the schedule was planned for batch ", d.batch, ", s_q ", d.s_q, ", num_heads ",
          d.num_heads, " but q has batch ", batch, ", s_q ", s_q, ", num_heads ", heads,
          " (plan with plan_mla_decode for this shape)");
  require(rows_16b_aligned(pr.kv_cache, 2), ErrorCode::kInvalidArgument, kOp,
          ": on CUDA, kv_cache entries must start on 16-byte boundaries (data pointer and the "
          "block and slot strides in bytes multiples of 16)");
  require(rows_16b_aligned(pr.out, 3), ErrorCode::kInvalidArgument, kOp,
          ": on CUDA, rows of out must start on 16-byte boundaries (data pointer and strides of "
          "dims 0-2 in bytes multiples of 16)");
  require(batch == 0 || reinterpret_cast<uintptr_t>(pr.workspace) % 16 == 0,
          ErrorCode::kInvalidArgument, kOp,
          ": on CUDA, split_workspace must start on a 16-byte boundary");
  const int64_t rows = s_q * heads;
  const int64_t row_tiles = (rows + kDecodeRowsSmall - 1) / kDecodeRowsSmall;
  require(
      d.num_parts * row_tiles <= kInt32Max && sizes.bounds.max_split_requests * rows <= kInt32Max,
      ErrorCode::kUnsupported, kOp,
      ": parts x row tiles and split requests x s_q x N must fit in one grid (2^31 - 1 CTAs), "
      "got ",
      d.num_parts, " parts, ", sizes.bounds.max_split_requests, " split requests, ", rows,
      " rows per request");
  return sizes;
}

// The longest seq_len the kernels accept: what the block table addresses, capped by the schedule's
// bound and by kMaxSeqLen.
int32_t kernel_max_seq_len(int64_t table_width, int64_t block_size,
                           const DecodeSchedule& schedule) {
  const int64_t table_len =
      table_width > kMaxSeqLen / block_size ? kMaxSeqLen : table_width * block_size;
  return static_cast<int32_t>(std::min(table_len, schedule.device.max_seq_len));
}

DecodeKernelParams make_params(const DecodeProblem& pr, const DecodeSchedule& schedule,
                               const WorkspaceLayout& layout) {
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
  k.max_seq_len = kernel_max_seq_len(bt.size(1), cache.size(1), schedule);

  k.out = out.data;
  k.out_stride_batch = out.strides[0];
  k.out_stride_query = out.strides[1];
  k.out_stride_head = out.strides[2];
  k.out_dtype = runtime_dtype(out.dtype);
  k.lse = static_cast<float*>(lse.data);
  k.lse_stride_batch = lse.strides[0];
  k.lse_stride_query = lse.strides[1];
  k.lse_stride_head = lse.strides[2];

  float* const ws = pr.workspace;
  k.part_begin = reinterpret_cast<const int32_t*>(ws + layout.part_begin);
  k.segments = reinterpret_cast<const SegmentRecord*>(ws + layout.segments);
  k.partial_out = ws + layout.partial_out;
  k.partial_lse = ws + layout.partial_lse;
  k.partial_dtype = k.out_dtype;

  k.batch = static_cast<int32_t>(q.size(0));
  k.s_q = static_cast<int32_t>(q.size(1));
  k.num_heads = static_cast<int32_t>(q.size(2));
  k.rows = k.s_q * k.num_heads;
  k.row_tiles = static_cast<int32_t>((k.rows + decode_rows_per_cta(k.rows) - 1) /
                                     decode_rows_per_cta(k.rows));
  k.num_parts = static_cast<int32_t>(schedule.device.num_parts);
  k.heads_div = make_fast_divisor(static_cast<uint32_t>(k.num_heads));
  k.block_size_div = make_fast_divisor(static_cast<uint32_t>(k.block_size));
  k.row_tiles_div = make_fast_divisor(static_cast<uint32_t>(k.row_tiles));

  constexpr float kLog2e = 1.4426950408889634f;
  k.score_scale_log2 = pr.score_scale * kLog2e;
  k.value_scale = pr.value_scale;
  k.q_scales = pr.q_scales.data;
  k.q_scales_stride = pr.q_scales.stride;
  k.k_scales = pr.k_scales.data;
  k.k_scales_stride = pr.k_scales.stride;
  k.softmax_scale = pr.softmax_scale;
  k.q_scale = pr.q_scale;
  k.k_scale = pr.k_scale;
  k.q_scale_applies = pr.q_scale_applies;
  k.k_scale_applies = pr.k_scale_applies;
  return k;
}

// The plan kernel's arguments: it reads the seq_lens the decode reads (with the decode's bound)
// and writes the workspace regions the decode and the combine read.
PlanParams make_plan_params(const TensorView& seq_lens, int32_t max_seq_len,
                            const DecodeSchedule& schedule, const DevicePlanSizes& sizes,
                            float* workspace) {
  const DeviceDecodeSchedule& d = schedule.device;
  PlanParams p{};
  p.seq_lens = static_cast<const int32_t*>(seq_lens.data);
  p.seq_lens_stride = seq_lens.strides[0];
  p.batch = static_cast<int32_t>(d.batch);
  p.max_seq_len = max_seq_len;
  p.num_parts = static_cast<int32_t>(d.num_parts);
  p.rows = static_cast<int32_t>(d.s_q * d.num_heads);
  p.batch_invariant = d.batch_invariant;
  p.bounds = sizes.bounds;
  const WorkspaceLayout& l = sizes.layout;
  p.header = reinterpret_cast<int32_t*>(workspace);
  p.part_begin = reinterpret_cast<int32_t*>(workspace + l.part_begin);
  p.segments = reinterpret_cast<SegmentRecord*>(workspace + l.segments);
  p.segment_part = reinterpret_cast<int32_t*>(workspace + l.segment_part);
  p.splits = reinterpret_cast<SplitRecord*>(workspace + l.splits);
  return p;
}

template <CacheFormat kFormat, class Element>
void launch_for_rows(const LaunchPlan& plan, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(plan.decode_ctas));
  if (plan.rows_per_cta == kDecodeRowsSmall) {
    launch_decode_kernel<Config<kDecodeRowsSmall, kFormat, Element>>(plan.decode, grid, stream);
    return;
  }
  // 64 rows: compute-bound, the wgmma kernel (kernel_wgmma.cuh) for every cache format, whose TMA
  // copies need whole swizzle patterns per page and 16-byte aligned strides; other caches (an odd
  // block_size, a strided view) take the mma.sync kernel. An fp8 q (RawE4m3Mma with 16 rows)
  // becomes an f16 q tile there, as e4m3 -> f16 is exact.
  using WgmmaElement = std::conditional_t<std::is_same_v<Element, RawE4m3Mma>, F16Mma, Element>;
  if (cache_tensor_map_supported(plan.decode)) {
    launch_decode_wgmma_kernel<WgmmaConfig<WgmmaElement, kFormat>>(plan.decode, grid, stream);
    return;
  }
  launch_decode_kernel<Config<kDecodeRowsLarge, kFormat, Element>>(plan.decode, grid, stream);
}

template <CacheFormat kFormat>
void launch_for_format(const LaunchPlan& plan, cudaStream_t stream) {
  if constexpr (kFormat == CacheFormat::kFp8E4m3) {
    if (plan.raw_e4m3) {
      launch_for_rows<kFormat, RawE4m3Mma>(plan, stream);
      return;
    }
    if (plan.raw_e4m3_q16) {  // 16 rows only (plan_launch)
      launch_decode_kernel<Config<kDecodeRowsSmall, kFormat, RawE4m3Q16Mma>>(
          plan.decode, dim3(static_cast<unsigned>(plan.decode_ctas)), stream);
      return;
    }
  }
  if constexpr (kFormat == CacheFormat::kFp8DsMla) {
    if (plan.raw_ds_mla) {  // 16 rows only (plan_launch)
      const dim3 grid(static_cast<unsigned>(plan.decode_ctas));
      if (plan.bf16_mma) {
        launch_decode_kernel<Config<kDecodeRowsSmall, kFormat, RawDsMlaMma<Bf16Mma>>>(plan.decode,
                                                                                      grid, stream);
      } else {
        launch_decode_kernel<Config<kDecodeRowsSmall, kFormat, RawDsMlaMma<F16Mma>>>(plan.decode,
                                                                                     grid, stream);
      }
      return;
    }
  }
  if (plan.bf16_mma) {
    launch_for_rows<kFormat, Bf16Mma>(plan, stream);
  } else {
    launch_for_rows<kFormat, F16Mma>(plan, stream);
  }
}

}  // namespace

namespace decode_sm90 {

LaunchPlan plan_launch(const DecodeProblem& problem, const DecodeSchedule& schedule) {
  const DevicePlanSizes sizes = check_supported(problem, schedule);
  LaunchPlan plan;
  const int64_t batch = problem.q.size(0), rows = problem.q.size(1) * problem.q.size(2);
  if (batch == 0 || rows == 0) return plan;
  plan.decode = make_params(problem, schedule, sizes.layout);
  plan.plan = make_plan_params(problem.seq_lens, plan.decode.max_seq_len, schedule, sizes,
                               problem.workspace);
  plan.rows_per_cta = static_cast<int>(decode_rows_per_cta(rows));
  plan.decode_ctas = schedule.device.num_parts * plan.decode.row_tiles;
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
      // An fp8 q in 16-byte rows, or a 16-bit one with 16 rows per CTA: the raw tiles are read in
      // place (kernel_e4m3.cuh); an f32 q, or a 16-bit one with 64 rows, take converted tiles.
      plan.raw_e4m3 =
          plan.decode.q_dtype == RuntimeDType::kFp8E4m3 && plan.decode.q_rows_16b_aligned;
      plan.raw_e4m3_q16 =
          plan.rows_per_cta == kDecodeRowsSmall && plan.decode.q_rows_16b_aligned &&
          (plan.decode.q_dtype == RuntimeDType::kBF16 || plan.decode.q_dtype == RuntimeDType::kF16);
      break;
    case KvCacheDType::kFp8DsMla:
      plan.format = CacheFormat::kFp8DsMla;
      plan.bf16_mma = problem.rope_dtype == DType::kBF16;
      // A 16-bit q in 16-byte rows with 16 rows per CTA: the raw tiles are read in place
      // (kernel_ds_mla.cuh); an f32 or fp8 q, or 64 rows, take the converted tiles.
      plan.raw_ds_mla =
          plan.rows_per_cta == kDecodeRowsSmall && plan.decode.q_rows_16b_aligned &&
          (plan.decode.q_dtype == RuntimeDType::kBF16 || plan.decode.q_dtype == RuntimeDType::kF16);
      break;
  }
  if (sizes.bounds.max_split_requests > 0) {
    const DecodeKernelParams& k = plan.decode;
    CombineParams& c = plan.combine;
    c.partial_out = k.partial_out;
    c.partial_dtype = k.partial_dtype;
    c.partial_lse = k.partial_lse;
    c.splits = plan.plan.splits;
    c.num_split_requests = plan.plan.header + kHeaderSplitRequests;
    c.out = k.out;
    c.out_stride_batch = k.out_stride_batch;
    c.out_stride_query = k.out_stride_query;
    c.out_stride_head = k.out_stride_head;
    c.out_dtype = k.out_dtype;
    c.lse = k.lse;
    c.lse_stride_batch = k.lse_stride_batch;
    c.lse_stride_query = k.lse_stride_query;
    c.lse_stride_head = k.lse_stride_head;
    c.num_heads = k.num_heads;
    c.rows = k.rows;
    const int64_t row_ctas = sizes.bounds.max_split_requests * rows;  // (request, row) pairs
    const bool invariant = schedule.device.batch_invariant;
    plan.combine_by_warps = combine_by_warps(row_ctas, plan.decode_ctas, invariant);
    // Batch-invariant: one CTA per row and one slice whatever the batch, so the order of a row's
    // sums is fixed (the slice count decides which segments each thread adds).
    c.column_slices =
        invariant || plan.combine_by_warps ? 1 : combine_column_slices(row_ctas, plan.decode_ctas);
    plan.combine_ctas = plan.combine_by_warps ? (row_ctas + kCombineWarpRows - 1) / kCombineWarpRows
                                              : row_ctas * c.column_slices;
  }
  return plan;
}

}  // namespace decode_sm90

void mla_decode(const DecodeProblem& problem, const DecodeSchedule& schedule, Stream stream) {
  LaunchPlan plan = plan_launch(problem, schedule);
  if (plan.decode_ctas == 0) return;
  DeviceGuard guard(problem.q.device, kOp);
  plan.decode.error_word = plan.plan.error_word = device_error_word(kOp);
  const auto cuda_stream = static_cast<cudaStream_t>(stream.handle);
  if (!schedule.device.planned_ahead) {
    launch_plan_kernel(plan.plan, cuda_stream);
  }
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
  if (plan.combine_ctas > 0) {
    launch_combine_kernel(plan.combine, plan.combine_by_warps,
                          dim3(static_cast<unsigned>(plan.combine_ctas)), cuda_stream);
  }
}

void mla_decode_plan_ahead(const DecodeSchedule& schedule, const TensorView& block_table,
                           const TensorView& seq_lens, int64_t block_size, float* workspace,
                           Stream stream) {
  const DeviceDecodeSchedule& d = schedule.device;
  if (d.batch == 0) return;
  const DevicePlanSizes sizes = device_plan_sizes(schedule, d.s_q * d.num_heads, kDimV, kOp);
  require(reinterpret_cast<uintptr_t>(workspace) % 16 == 0, ErrorCode::kInvalidArgument, kOp,
          ": on CUDA, split_workspace must start on a 16-byte boundary");
  DeviceGuard guard(seq_lens.device, kOp);
  PlanParams p =
      make_plan_params(seq_lens, kernel_max_seq_len(block_table.size(1), block_size, schedule),
                       schedule, sizes, workspace);
  p.error_word = device_error_word(kOp);
  launch_plan_kernel(p, static_cast<cudaStream_t>(stream.handle));
}

}  // namespace mlakit::cuda
