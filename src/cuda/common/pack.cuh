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
