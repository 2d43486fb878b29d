// Vector accesses: a run of N elements moved with one load or store instruction when aligned.
#pragma once

#include <cstdint>

namespace mlakit::cuda {

// N elements of T, aligned to their total size, so a load of a Pack is one vector instruction
// (up to 16 bytes; a 32-byte Pack becomes two 16-byte accesses).
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// The unsigned integer (or vector of them) of exactly kBytes bytes, for raw copies.
template <int kBytes>
struct RawUnit;
template <>
struct RawUnit<1> {
  using type = uint8_t;
};
template <>
struct RawUnit<2> {
  using type = uint16_t;
};
template <>
struct RawUnit<4> {
  using type = uint32_t;
};
template <>
struct RawUnit<8> {
  using type = uint2;
};
template <>
struct RawUnit<16> {
  using type = uint4;
};

template <int kBytes>
__device__ __forceinline__ void copy_unit(const char* src, char* dst) {
  using U = typename RawUnit<kBytes>::type;
  *reinterpret_cast<U*>(dst) = *reinterpret_cast<const U*>(src);
}

// copy_unit for a width known only at run time (1, 2, 4, 8 or 16 bytes; uniform across a launch,
// so the switch costs no divergence).
__device__ __forceinline__ void copy_unit_of(int bytes, const char* src, char* dst) {
  switch (bytes) {
    case 16:
      return copy_unit<16>(src, dst);
    case 8:
      return copy_unit<8>(src, dst);
    case 4:
      return copy_unit<4>(src, dst);
    case 2:
      return copy_unit<2>(src, dst);
    default:
      return copy_unit<1>(src, dst);
  }
}

// Converts N elements In -> f32 -> op -> Out; src and dst are aligned for Pack loads/stores.
template <class In, class Out, int N, class Op>
__device__ __forceinline__ void convert_pack(const char* src, char* dst, const Op& op) {
  const Pack<typename In::Storage, N> in =
      *reinterpret_cast<const Pack<typename In::Storage, N>*>(src);
  Pack<typename Out::Storage, N> out;
#pragma unroll
  for (int i = 0; i < N; ++i) out.v[i] = Out::store(op(In::load(in.v[i])));
  *reinterpret_cast<Pack<typename Out::Storage, N>*>(dst) = out;
}

// The float -> float steps between load and store.
struct Identity {
  __device__ __forceinline__ float operator()(float x) const { return x; }
};
struct MultiplyBy {  // x * factor in f32 (dequant: fp8 * scale; quant: x * (1 / scale))
  float factor;
  __device__ __forceinline__ float operator()(float x) const { return __fmul_rn(x, factor); }
};
struct DivideBy {  // x / divisor in f32, IEEE (the cache write: e4m3(x / k_scale))
  float divisor;
  __device__ __forceinline__ float operator()(float x) const { return __fdiv_rn(x, divisor); }
};

}  // namespace mlakit::cuda
