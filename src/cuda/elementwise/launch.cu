// Grids and dispatch of the elementwise kernels (kernel.cuh).
#include "core/check.hpp"
#include "cuda/common/alignment.hpp"
#include "cuda/common/device_errors.hpp"
#include "cuda/common/dispatch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda/elementwise/kernel.cuh"
#include "cuda/elementwise/launch.hpp"
#include "cuda/elementwise/layout.hpp"

namespace mlakit::cuda {

namespace {

// Why 256: 8 warps per block, enough to hide latency with ~8 resident blocks per SM and small
// enough that a few-thousand-unit tensor still spreads over many SMs.
constexpr int kThreads = 256;

// 16 bytes: the widest load or store one thread can issue (LDG.128 / STG.128).
constexpr int64_t kMaxAccessBytes = 16;

void check_element_aligned(const char* op, const char* name, const TensorView& t) {
  detail::require(address(t.data) % t.element_size() == 0, ErrorCode::kInvalidArgument, op, ": ",
                  name, " data must be aligned to its element size (", t.element_size(),
                  " bytes) on the GPU");
}

template <class Kernel, class... Args>
void launch(const char* op, const char* name, Kernel kernel, const RowsLayout& layout,
            cudaStream_t stream, const Args&... args) {
  const int64_t blocks = grid_blocks(layout.rows * layout.units_per_row, kThreads);
  launch_kernel(op, name, kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream,
                args...);
}

// An equal-dtype walk over src and dst (merged as m; src may be dst) in raw units: the widest
// access (<= 16 bytes) that both start addresses, the row length and every row stride are a
// multiple of when rows are contiguous, else one element.
struct RawUnits {
  int64_t bytes;
  RowsLayout layout;
};

RawUnits raw_units(const MergedDims& m, const TensorView& src, const TensorView& dst) {
  const int64_t elem = dst.element_size();
  if (!m.inner_contiguous()) {
    return {elem, rows_layout(m, elem, elem, m.inner(), m.src_stride[m.ndim - 1] * elem,
                              m.dst_stride[m.ndim - 1] * elem)};
  }
  uint64_t rows_bytes[2 * kMaxOuterDims] = {};
  for (int d = 0; d < m.ndim - 1; ++d) {
    rows_bytes[2 * d] = static_cast<uint64_t>(m.src_stride[d] * elem);
    rows_bytes[2 * d + 1] = static_cast<uint64_t>(m.dst_stride[d] * elem);
  }
  const int64_t unit = common_alignment(
      {address(src.data), address(dst.data), static_cast<uint64_t>(m.inner() * elem), rows_bytes[0],
       rows_bytes[1], rows_bytes[2], rows_bytes[3], rows_bytes[4], rows_bytes[5]},
      kMaxAccessBytes);
  return {unit, rows_layout(m, elem, elem, m.inner() * elem / unit, unit, unit)};
}

// Raw copy of equal-dtype views in units of the widest aligned access.
void move_bytes(const char* op, const TensorView& src, const TensorView& dst, cudaStream_t stream) {
  const RawUnits r = raw_units(merge_dims(src, dst), src, dst);
  const ElementwiseParams p{static_cast<const char*>(src.data), static_cast<char*>(dst.data),
                            r.layout};
  dispatch_access_width(r.bytes, [&](auto width) {
    constexpr int kUnit = decltype(width)::value;
    launch(op, "move_bytes_kernel", move_bytes_kernel<kUnit>, p.layout, stream, p);
  });
}

// Elements per vector unit when In is read with 16-byte loads: 4 f32 or 8 16-bit values.
template <class In>
constexpr int vector_elems() {
  return static_cast<int>(kMaxAccessBytes / sizeof(typename In::Storage));
}

// True when src and dst can be walked in packs of `vec` elements: both rows contiguous, the row
// length a multiple of vec, and every pack start aligned to the pack's size on both sides.
bool packs_fit(const MergedDims& m, const TensorView& src, const TensorView& dst, int64_t vec) {
  if (!m.inner_contiguous() || m.inner() % vec != 0) return false;
  if (address(src.data) % (vec * src.element_size()) != 0) return false;
  if (address(dst.data) % (vec * dst.element_size()) != 0) return false;
  for (int d = 0; d < m.ndim - 1; ++d) {
    if (m.src_stride[d] % vec != 0 || m.dst_stride[d] % vec != 0) return false;
  }
  return true;
}

// dst = Out(op(In(src))) element by element, in packs when they fit.
template <class In, class Out, class Op>
void convert(const char* op_name, const TensorView& src, const TensorView& dst, const Op& op,
             cudaStream_t stream) {
  const MergedDims m = merge_dims(src, dst);
  const int64_t in_bytes = src.element_size(), out_bytes = dst.element_size();
  constexpr int kVec = vector_elems<In>();
  if (packs_fit(m, src, dst, kVec)) {
    const ElementwiseParams p{
        static_cast<const char*>(src.data), static_cast<char*>(dst.data),
        rows_layout(m, in_bytes, out_bytes, m.inner() / kVec, kVec * in_bytes, kVec * out_bytes)};
    return launch(op_name, "convert_kernel<vector>", convert_kernel<In, Out, kVec, Op>, p.layout,
                  stream, p, op);
  }
  const ElementwiseParams p{
      static_cast<const char*>(src.data), static_cast<char*>(dst.data),
      rows_layout(m, in_bytes, out_bytes, m.inner(), m.src_stride[m.ndim - 1] * in_bytes,
                  m.dst_stride[m.ndim - 1] * out_bytes)};
  launch(op_name, "convert_kernel<scalar>", convert_kernel<In, Out, 1, Op>, p.layout, stream, p,
         op);
}

}  // namespace

void copy(const TensorView& src, const TensorView& dst, Stream stream) {
  constexpr const char* kOp = "copy";
  if (dst.numel() == 0) return;
  check_element_aligned(kOp, "src", src);
  check_element_aligned(kOp, "dst", dst);
  DeviceGuard guard(dst.device, kOp);
  const cudaStream_t s = as_cuda_stream(stream);
  if (src.dtype == dst.dtype) return move_bytes(kOp, src, dst, s);
  dispatch_float(kOp, src.dtype, [&](auto in) {
    dispatch_float(kOp, dst.dtype, [&](auto out) {
      convert<decltype(in), decltype(out)>(kOp, src, dst, Identity{}, s);
    });
  });
}

void fill_zero(const TensorView& dst, Stream stream) {
  constexpr const char* kOp = "fill_zero";
  if (dst.numel() == 0) return;
  check_element_aligned(kOp, "dst", dst);
  DeviceGuard guard(dst.device, kOp);
  const cudaStream_t s = as_cuda_stream(stream);
  const MergedDims m = merge_dims(dst, dst);
  const int64_t elem = dst.element_size();
  if (m.ndim == 1 && m.inner_contiguous()) {  // one dense run: a memset node, capturable
    check_cuda(cudaMemsetAsync(dst.data, 0, static_cast<size_t>(m.inner() * elem), s), kOp,
               "cudaMemsetAsync");
    return;
  }
  const RawUnits r = raw_units(m, dst, dst);
  const ElementwiseParams p{nullptr, static_cast<char*>(dst.data), r.layout};
  dispatch_access_width(r.bytes, [&](auto width) {
    constexpr int kUnit = decltype(width)::value;
    launch(kOp, "zero_bytes_kernel", zero_bytes_kernel<kUnit>, p.layout, s, p);
  });
}

void scaled_fp8_quant(const TensorView& x, const TensorView& out, float inv_scale, Stream stream) {
  constexpr const char* kOp = "scaled_fp8_quant";
  if (x.numel() == 0) return;
  check_element_aligned(kOp, "x", x);
  DeviceGuard guard(x.device, kOp);
  dispatch_float(kOp, x.dtype, [&](auto in) {
    convert<decltype(in), E4m3>(kOp, x, out, MultiplyBy{inv_scale}, as_cuda_stream(stream));
  });
}

void scaled_fp8_quant(const TensorView& x, const TensorView& out, const float* scale,
                      bool zero_scale_gives_zero, Stream stream) {
  constexpr const char* kOp = "scaled_fp8_quant";
  if (x.numel() == 0) return;
  check_element_aligned(kOp, "x", x);
  DeviceGuard guard(x.device, kOp);
  const DeviceQuantScale op{scale, device_error_word(kOp), zero_scale_gives_zero};
  dispatch_float(kOp, x.dtype, [&](auto in) {
    convert<decltype(in), E4m3>(kOp, x, out, op, as_cuda_stream(stream));
  });
}

}  // namespace mlakit::cuda
