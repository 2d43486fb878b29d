// Elementwise kernels: copy with dtype conversion, raw byte moves, zero fill, fp8 quantization.
// Each thread handles one unit per grid-stride step; consecutive threads take consecutive units
// of a row, so a warp's accesses are contiguous (16-byte units: 512 bytes per warp access).
#pragma once

#include <cstdint>

#include "cuda/common/pack.cuh"
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

// dst pack = Out(op(In(src pack))), kVec elements a unit.
template <class In, class Out, int kVec, class Op>
__global__ void convert_kernel(const __grid_constant__ ElementwiseParams p, Op op) {
  for_each_unit(p.layout, [&](int64_t s, int64_t d) {
    convert_pack<In, Out, kVec>(p.src + s, p.dst + d, op);
  });
}

}  // namespace mlakit::cuda
