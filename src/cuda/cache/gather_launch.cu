// Grids and dispatch of gather_and_maybe_dequant_cache and cp_gather_cache (gather_kernel.cuh).
#include <algorithm>

#include "cuda/cache/gather_kernel.cuh"
#include "cuda/cache/launch.hpp"
#include "cuda/cache/launch_common.cuh"
#include "cuda/common/device_errors.hpp"
#include "cuda/common/runtime.hpp"

namespace mlakit::cuda {

namespace {

constexpr const char* kGatherOp = "gather_and_maybe_dequant_cache";
constexpr const char* kCpGatherOp = "cp_gather_cache";
constexpr const char* kGatherRowsOp = "gather_rows_and_maybe_dequant";

// The fields both gathers fill alike: the source cache, the dst rows, the request index and the
// error word.
template <class Params>
Params gather_params(const char* op, const TensorView& src_cache, const TensorView& dst,
                     const RequestIndex& index) {
  Params p;
  p.cache = cache_layout(src_cache);
  p.dst = static_cast<char*>(dst.data);
  p.dst_row_bytes = dst.strides[0] * dst.element_size();
  p.index = index;
  p.row_bytes = dst.shape[1] * dst.element_size();
  p.error_word = device_error_word(op);
  return p;
}

// Widest access (<= 16 bytes) of a raw row copy: every entry start, dst row start and the row
// length are a multiple of it.
template <class Params>
int64_t raw_row_unit(const Params& p) {
  return entry_alignment(p.cache, {address(p.dst), static_cast<uint64_t>(p.dst_row_bytes),
                                   static_cast<uint64_t>(p.row_bytes)});
}

template <class Kernel>
void launch_gather(Kernel kernel, const char* name, const GatherParams& p, cudaStream_t stream) {
  const int64_t blocks = grid_blocks(p.num_tokens, kWarpsPerBlock);
  kernel<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(p);
  check_launch(kGatherOp, name);
}

void gather_raw(const GatherParams& p, cudaStream_t stream) {
  dispatch_access_width(raw_row_unit(p), [&](auto width) {
    constexpr int kUnit = decltype(width)::value;
    launch_gather(gather_raw_kernel<kUnit>, "gather_raw_kernel", p, stream);
  });
}

// dst[t, i] = Out(op(In(entry[i]))) in packs of 16 bytes on the wider side when aligned; Op is
// Identity or MultiplyBy (by p.scale, gather_convert_kernel).
template <class In, class Out, class Op>
void gather_convert(const GatherParams& p, cudaStream_t stream) {
  constexpr int64_t kIn = sizeof(typename In::Storage), kOut = sizeof(typename Out::Storage);
  // Values per pack: the wider of the two sides moves 16 bytes.
  constexpr int kVec = static_cast<int>(16 / std::max(kIn, kOut));
  const bool fits = p.width % kVec == 0 && entry_alignment(p.cache, {}, kVec * kIn) == kVec * kIn &&
                    common_alignment({address(p.dst), static_cast<uint64_t>(p.dst_row_bytes)},
                                     kVec * kOut) == kVec * kOut;
  if (fits) {
    return launch_gather(gather_convert_kernel<In, Out, kVec, Op>, "gather_convert_kernel<vector>",
                         p, stream);
  }
  launch_gather(gather_convert_kernel<In, Out, 1, Op>, "gather_convert_kernel<scalar>", p, stream);
}

void gather_ds_mla(DType out, const GatherParams& p, cudaStream_t stream) {
  dispatch_float16(kGatherOp, out, [&](auto out_elem) {
    using Out = decltype(out_elem);
    // 16: codes are read and dst rows written with 16-byte accesses.
    const bool aligned =
        entry_alignment(p.cache, {address(p.dst), static_cast<uint64_t>(p.dst_row_bytes)}) == 16;
    if (aligned) {
      return launch_gather(gather_ds_mla_kernel<Out, true>, "gather_ds_mla_kernel<aligned>", p,
                           stream);
    }
    launch_gather(gather_ds_mla_kernel<Out, false>, "gather_ds_mla_kernel<unaligned>", p, stream);
  });
}

// Launches the gather kernel that dequantizes `src_dtype` entries (kv_dtype, p.scale) into dst's
// dtype.
void launch_dequant_gather(const GatherParams& p, DType src_dtype, DType dst_dtype,
                           KvCacheDType kv_dtype, cudaStream_t s) {
  switch (kv_dtype) {
    case KvCacheDType::kAuto:
      if (src_dtype == dst_dtype) return gather_raw(p, s);
      return dispatch_float(kGatherOp, src_dtype, [&](auto in) {
        dispatch_float(kGatherOp, dst_dtype, [&](auto out) {
          gather_convert<decltype(in), decltype(out), Identity>(p, s);
        });
      });
    case KvCacheDType::kFp8E4m3:
      return dispatch_float(kGatherOp, dst_dtype, [&](auto out) {
        gather_convert<E4m3, decltype(out), MultiplyBy>(p, s);
      });
    case KvCacheDType::kFp8DsMla:
      return gather_ds_mla(dst_dtype, p, s);
  }
}

}  // namespace

void gather_and_maybe_dequant_cache(const TensorView& src_cache, const TensorView& dst,
                                    const TensorView& block_table, const TensorView& cu_seq_lens,
                                    const TensorView& token_to_seq, int64_t num_tokens,
                                    KvCacheDType kv_dtype, ScaleSource scale,
                                    const std::optional<TensorView>& seq_starts, Stream stream) {
  if (num_tokens == 0) return;
  DeviceGuard guard(dst.device, kGatherOp);
  auto p = gather_params<GatherParams>(
      kGatherOp, src_cache, dst,
      request_index(block_table, cu_seq_lens, seq_starts, cu_seq_lens.shape[0] - 1));
  p.token_to_seq = static_cast<const int32_t*>(token_to_seq.data);
  p.token_to_seq_stride = token_to_seq.strides[0];
  p.num_tokens = num_tokens;
  p.width = static_cast<int>(dst.shape[1]);
  p.scale = scale;
  launch_dequant_gather(p, src_cache.dtype, dst.dtype, kv_dtype, as_cuda_stream(stream));
}

void gather_rows_and_maybe_dequant(const TensorView& src, const TensorView& dst,
                                   const TensorView& row_index, KvCacheDType kv_dtype, float scale,
                                   Stream stream) {
  const int64_t num_tokens = row_index.shape[0];
  if (num_tokens == 0) return;
  DeviceGuard guard(dst.device, kGatherRowsOp);
  // src [rows, W] seen as a cache of `rows` blocks of one entry each.
  const TensorView as_cache =
      TensorView::strided(src.data, src.dtype, {src.shape[0], 1, src.shape[1]},
                          {src.strides[0], src.shape[1], 1}, src.device);
  auto p = gather_params<GatherParams>(kGatherOp, as_cache, dst, RequestIndex{});
  p.error_word = device_error_word(kGatherRowsOp);
  p.row_index = static_cast<const int32_t*>(row_index.data);
  p.row_index_stride = row_index.strides[0];
  p.num_tokens = num_tokens;
  p.width = static_cast<int>(dst.shape[1]);
  p.scale = ScaleSource{.value = scale};
  launch_dequant_gather(p, src.dtype, dst.dtype, kv_dtype, as_cuda_stream(stream));
}

void cp_gather_cache(const TensorView& src_cache, const TensorView& dst,
                     const TensorView& block_table, const TensorView& cu_seq_lens,
                     int64_t batch_size, const std::optional<TensorView>& seq_starts,
                     Stream stream) {
  if (batch_size == 0) return;
  DeviceGuard guard(dst.device, kCpGatherOp);
  auto p = gather_params<CpGatherParams>(
      kCpGatherOp, src_cache, dst, request_index(block_table, cu_seq_lens, seq_starts, batch_size));
  p.dst_rows = dst.shape[0];
  // Splits of a request: about 4 blocks of 8 warps per SM over the whole grid (a copy needs no
  // more to saturate memory), at most 64 per request (a 64k-row request still gives each warp
  // ~128 rows) and at least 1.
  const int64_t splits =
      std::clamp<int64_t>(4 * multiprocessor_count(kCpGatherOp) / batch_size, 1, 64);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(batch_size, kMaxGridBlocks)),
                  static_cast<unsigned>(splits));
  const cudaStream_t s = as_cuda_stream(stream);
  dispatch_access_width(raw_row_unit(p), [&](auto width) {
    constexpr int kUnit = decltype(width)::value;
    cp_gather_kernel<kUnit><<<grid, kThreadsPerBlock, 0, s>>>(p);
    check_launch(kCpGatherOp, "cp_gather_kernel");
  });
}

}  // namespace mlakit::cuda
