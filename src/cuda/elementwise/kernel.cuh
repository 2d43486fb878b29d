// Elementwise kernels: copy with dtype conversion, raw byte moves, zero fill, fp8 quantization.
// Each thread handles one unit per grid-stride step; consecutive threads take consecutive units
// of a row, so a warp's accesses are contiguous (16-byte units: 512 bytes per warp access).
#pragma once

#include <cstdint>

#include "cuda/common/device_errors.cuh"
#include "cuda/common/pack.cuh"
#include "cuda/common/scale_source.cuh"
#include "cuda/elementwise/params.cuh"

namespace mlakit::cuda {

// Byte offsets of the first unit of `row` in src and dst.
__device__ __forceinline__ void row_offsets(const RowsLayout& l, int64_t row, int64_t& src,
                                            int64_t& dst) {
  src = 0;
  dst = 0;
  for (int d = l.outer_ndim - 1; d >= 0; --d) {
    const int64_t i = row % l.outer_shape[d];
    row /= l.outer_shape[d];
    src += i * l.src_outer_bytes[d];
    dst += i * l.dst_outer_bytes[d];
  }
}

// Calls fn(src_byte_offset, dst_byte_offset) for every unit, grid-stride.
template <class Fn>
__device__ __forceinline__ void for_each_unit(const RowsLayout& l, const Fn& fn) {
  const int64_t total = l.rows * l.units_per_row;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const int64_t row = i / l.units_per_row, unit = i - row * l.units_per_row;
    int64_t src, dst;
    row_offsets(l, row, src, dst);
    fn(src + unit * l.src_unit_bytes, dst + unit * l.dst_unit_bytes);
  }
}

// dst unit = src unit, kUnitBytes raw bytes (same-dtype copy).
template <int kUnitBytes>
__global__ void move_bytes_kernel(const __grid_constant__ ElementwiseParams p) {
  for_each_unit(p.layout,
                [&](int64_t s, int64_t d) { copy_unit<kUnitBytes>(p.src + s, p.dst + d); });
}

// dst unit = 0.
template <int kUnitBytes>
__global__ void zero_bytes_kernel(const __grid_constant__ ElementwiseParams p) {
  using U = typename RawUnit<kUnitBytes>::type;
  for_each_unit(p.layout, [&](int64_t, int64_t d) { *reinterpret_cast<U*>(p.dst + d) = U{}; });
}

// The quantization op of scaled_fp8_quant with a scale read where the kernel runs:
// x * (1 / scale), the reciprocal by __frcp_rn (IEEE round to nearest, as the host path's
// 1.0f / scale). A scale that is not finite and > 0 with a finite reciprocal gives NaN codes and
// kQuantBadScale. zero_gives_zero (the dynamic quant, whose scale amax(|x|) / 448 is 0 only when
// every x is +-0) turns scale 0 into code 0 for every element instead.
struct DeviceQuantScale {
  const float* scale = nullptr;  // [1] f32 on the kernel's device
  uint32_t* error_word = nullptr;
  bool zero_gives_zero = false;
};

// x * factor in f32, or +0 for every x when zero is set.
struct QuantFactor {
  float factor;
  bool zero;
  __device__ __forceinline__ float operator()(float x) const {
    return zero ? 0.0f : __fmul_rn(x, factor);
  }
};

// The op a thread applies: a plain op as it is, a device scale read once per thread.
template <class Op>
__device__ __forceinline__ const Op& resolved(const Op& op) {
  return op;
}
__device__ __forceinline__ QuantFactor resolved(const DeviceQuantScale& s) {
  const float scale = __ldg(s.scale);
  if (s.zero_gives_zero && scale == 0.0f) return {0.0f, true};
  const float inv = __frcp_rn(scale);
  if (usable_scale(scale) && usable_scale(inv)) return {inv, false};
  if (blockIdx.x == 0 && threadIdx.x == 0) raise_device_error(s.error_word, kQuantBadScale);
  return {__uint_as_float(0x7fc00000u), false};  // NaN: every code NaN
}

// dst pack = Out(op(In(src pack))), kVec elements a unit.
template <class In, class Out, int kVec, class Op>
__global__ void convert_kernel(const __grid_constant__ ElementwiseParams p, Op op) {
  const auto& f = resolved(op);
  for_each_unit(p.layout, [&](int64_t s, int64_t d) {
    convert_pack<In, Out, kVec>(p.src + s, p.dst + d, f);
  });
}

}  // namespace mlakit::cuda
