// Grid and dispatch of concat_and_cache_mla (write_kernel.cuh).
#include <algorithm>

#include "cuda/cache/launch.hpp"
#include "cuda/cache/launch_common.cuh"
#include "cuda/cache/write_kernel.cuh"
#include "cuda/common/device_errors.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/common/runtime.hpp"

namespace mlakit::cuda {

namespace {

constexpr const char* kOp = "concat_and_cache_mla";

// A warp per token for the entries, and a thread per unit of the q rope copy (if any).
template <class Kernel>
void launch(Kernel kernel, const char* name, const CacheWriteParams& p, cudaStream_t stream) {
  const HeadRowsCopy& q = p.q_rope;
  const int64_t blocks = std::max(grid_blocks(p.num_tokens, kWarpsPerBlock),
                                  grid_blocks(q.rows * q.heads * q.units, kThreadsPerBlock));
  launch_kernel(kOp, name, kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreadsPerBlock), 0,
                stream, p);
}

void write_auto(const CacheWriteParams& p, cudaStream_t stream) {
  const int64_t unit =
      entry_alignment(p.cache, {address(p.kv_c), static_cast<uint64_t>(p.kv_c_row_bytes),
                                static_cast<uint64_t>(p.latent * p.elem_bytes), address(p.k_pe),
                                static_cast<uint64_t>(p.k_pe_row_bytes),
                                static_cast<uint64_t>(p.rope * p.elem_bytes)});
  dispatch_access_width(unit, [&](auto width) {
    constexpr int kUnit = decltype(width)::value;
    launch(write_raw_kernel<kUnit>, "write_raw_kernel", p, stream);
  });
}

// True when both input rows can be read with 16-byte loads at every `vec`-value step.
bool input_rows_aligned(const CacheWriteParams& p, int64_t vec) {
  const uint64_t bytes = static_cast<uint64_t>(vec * p.elem_bytes);
  return common_alignment({address(p.kv_c), static_cast<uint64_t>(p.kv_c_row_bytes),
                           address(p.k_pe), static_cast<uint64_t>(p.k_pe_row_bytes)},
                          bytes) == static_cast<int64_t>(bytes) &&
         p.latent % vec == 0 && p.rope % vec == 0;
}

void write_fp8(DType act, const CacheWriteParams& p, cudaStream_t stream) {
  dispatch_float(kOp, act, [&](auto in) {
    using In = decltype(in);
    // Values per pack: one 16-byte load of the input (4 f32 or 8 16-bit values).
    constexpr int kVec = 16 / sizeof(typename In::Storage);
    if (input_rows_aligned(p, kVec) && entry_alignment(p.cache, {}, kVec) == kVec) {
      return launch(write_fp8_kernel<In, kVec>, "write_fp8_kernel<vector>", p, stream);
    }
    launch(write_fp8_kernel<In, 1>, "write_fp8_kernel<scalar>", p, stream);
  });
}

void write_ds_mla(DType act, const CacheWriteParams& p, cudaStream_t stream) {
  dispatch_float16(kOp, act, [&](auto in) {
    using In = decltype(in);
    // 16: kv_c is read and entries are written with 16-byte accesses (8 values, 16 codes).
    if (input_rows_aligned(p, 8) && entry_alignment(p.cache, {}) == 16) {
      return launch(write_ds_mla_kernel<In, true>, "write_ds_mla_kernel<aligned>", p, stream);
    }
    launch(write_ds_mla_kernel<In, false>, "write_ds_mla_kernel<unaligned>", p, stream);
  });
}

// [rows, heads, width] views of one dtype, last dimension contiguous, as a raw copy in the
// widest units that every start, row and head offset and the run length are multiples of.
// No copy (rows 0) for an empty or default (0-dimensional) src.
HeadRowsCopy head_rows_copy(const TensorView& src, const TensorView& dst) {
  HeadRowsCopy c;
  if (src.ndim != 3 || src.numel() == 0) return c;
  const int64_t elem = src.element_size();
  c.src = static_cast<const char*>(src.data);
  c.src_row_bytes = src.strides[0] * elem;
  c.src_head_bytes = src.strides[1] * elem;
  c.dst = static_cast<char*>(dst.data);
  c.dst_row_bytes = dst.strides[0] * elem;
  c.dst_head_bytes = dst.strides[1] * elem;
  const int64_t run_bytes = src.shape[2] * elem;
  c.unit_bytes = static_cast<int>(common_alignment(
      {address(c.src), address(c.dst), static_cast<uint64_t>(c.src_row_bytes),
       static_cast<uint64_t>(c.src_head_bytes), static_cast<uint64_t>(c.dst_row_bytes),
       static_cast<uint64_t>(c.dst_head_bytes), static_cast<uint64_t>(run_bytes)}));
  c.rows = src.shape[0];
  c.heads = src.shape[1];
  c.units = run_bytes / c.unit_bytes;
  return c;
}

}  // namespace

void concat_and_cache_mla(const TensorView& kv_c, const TensorView& k_pe,
                          const TensorView& kv_cache, const TensorView& slot_mapping,
                          KvCacheDType kv_dtype, ScaleSource k_scale, Stream stream) {
  concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_dtype, k_scale, /*q_rope_src=*/{},
                       /*q_rope_dst=*/{}, stream);
}

void concat_and_cache_mla(const TensorView& kv_c, const TensorView& k_pe,
                          const TensorView& kv_cache, const TensorView& slot_mapping,
                          KvCacheDType kv_dtype, ScaleSource k_scale, const TensorView& q_rope_src,
                          const TensorView& q_rope_dst, Stream stream) {
  const HeadRowsCopy q_rope = head_rows_copy(q_rope_src, q_rope_dst);
  if (slot_mapping.shape[0] == 0 && q_rope.rows == 0) return;
  DeviceGuard guard(kv_cache.device, kOp);
  CacheWriteParams p;
  p.kv_c = static_cast<const char*>(kv_c.data);
  p.kv_c_row_bytes = kv_c.strides[0] * kv_c.element_size();
  p.k_pe = static_cast<const char*>(k_pe.data);
  p.k_pe_row_bytes = k_pe.strides[0] * k_pe.element_size();
  p.slot_mapping = static_cast<const int64_t*>(slot_mapping.data);
  p.slot_stride = slot_mapping.strides[0];
  p.num_tokens = slot_mapping.shape[0];
  p.cache = cache_layout(kv_cache);
  p.latent = static_cast<int>(kv_c.shape[1]);
  p.rope = static_cast<int>(k_pe.shape[1]);
  p.elem_bytes = kv_c.element_size();
  p.k_scale = k_scale;
  p.error_word = device_error_word(kOp);
  p.q_rope = q_rope;
  const cudaStream_t s = as_cuda_stream(stream);
  switch (kv_dtype) {
    case KvCacheDType::kAuto:
      return write_auto(p, s);
    case KvCacheDType::kFp8E4m3:
      return write_fp8(kv_c.dtype, p, s);
    case KvCacheDType::kFp8DsMla:
      return write_ds_mla(kv_c.dtype, p, s);
  }
}

}  // namespace mlakit::cuda
