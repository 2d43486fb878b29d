// PTX wrappers the sm90 decode is built from: cp.async copies, bulk copies onto mbarriers
// (cuda/common/mbarrier.cuh), ldmatrix fragment loads, the m16n8k16 tensor-core MMA in bf16 and
// f16, ex2, byte permutes and fp8 e4m3 -> 16-bit conversion.
//
// A classic include guard instead of #pragma once: tests/cuda/decode_emulated_test.cpp defines it
// and supplies host versions of these functions (and of mbarrier.cuh's), to run the kernel source
// on the CPU.
#ifndef MLAKIT_CUDA_DECODE_SM90_PTX_CUH
#define MLAKIT_CUDA_DECODE_SM90_PTX_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/device_errors.hpp"
#include "cuda/common/fast_exp2.cuh"
#include "cuda/common/mbarrier.cuh"

namespace mlakit::cuda::decode_sm90 {

// Sets `bit` (a DeviceErrorBit) in the device error word.
__device__ __forceinline__ void report_device_error(uint32_t* error_word, uint32_t bit) {
  atomicOr(error_word, bit);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses L1 (the cache is streamed once). With `valid` false
// nothing is read and the 16 bytes are zero-filled (src-size 0); `src` must still be a mapped
// address, so callers pass the cache base then.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Bulk copy (no tensor map) of `bytes` contiguous bytes from global `src` to shared address `dst`
// (both 16-byte aligned, `bytes` a multiple of 16); the bytes complete a transaction on the
// mbarrier `mbar` (whose phase must announce them: mbarrier_arrive_expect_tx).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t mbar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(mbar)
      : "memory");
}
// Orders this thread's earlier shared-memory stores before later async-proxy accesses of the same
// bytes (a bulk copy into a ring stage whose rows were zeroed by stores).
__device__ __forceinline__ void fence_stores_before_bulk_copies() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Four 8x8 16-bit matrices; lanes 8i..8i+7 give the row addresses of matrix i, and lane l receives
// elements (l / 4, 2 (l % 4) + {0, 1}) of each (transposed: (2 (l % 4) + {0, 1}, l / 4)).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two e4m3 values -> two f16 in one register (the lower byte in the low half); exact (e4m3 NaN
// stays NaN). The pair is the low (bytes 0, 1) or high (bytes 2, 3) half of `word`: unpacked in
// PTX, so ptxas reads the high half in place (F2FP ... R.H1) instead of shifting it down first (one
// SHF per high pair, on every conversion chain). `high` must be known at compile time after
// inlining.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t word, bool high) {
  uint32_t r;
  if (high) {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}\n"
        : "=r"(r)
        : "r"(word));
  } else {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}\n"
        : "=r"(r)
        : "r"(word));
  }
  return r;
}
// The bytes of `v` picked by the four selector nibbles of `selector` (lowest first; PTX prmt).
__device__ __forceinline__ uint32_t byte_perm(uint32_t v, uint32_t selector) {
  return __byte_perm(v, 0u, selector);
}
__device__ __forceinline__ float2 f16x2_to_float2(uint32_t v) {
  __half2 h;
  memcpy(&h, &v, sizeof(h));
  return __half22float2(h);
}

// The element type both MMA operands have: every tile the tensor cores read is in it. Fragment
// registers hold two elements, the lower-indexed one in the low half.
struct Bf16Mma {
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t r;
    memcpy(&r, &v, sizeof(r));
    return r;
  }
  // The e4m3 pair in the low or high half of `word` (e4m3x2_to_f16x2).
  __device__ __forceinline__ static uint32_t from_e4m3x2(uint32_t word, bool high) {
    // e4m3 -> f16 -> f32 -> bf16: exact
    const float2 f = f16x2_to_float2(e4m3x2_to_f16x2(word, high));
    return pack(f.x, f.y);
  }
  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

struct F16Mma {
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    uint32_t r;
    memcpy(&r, &v, sizeof(r));
    return r;
  }
  __device__ __forceinline__ static uint32_t from_e4m3x2(uint32_t word, bool high) {
    return e4m3x2_to_f16x2(word, high);
  }
  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// f16 MMAs fed straight from raw fp8_e4m3 tiles (kernel_e4m3.cuh): an fp8 q is converted once per
// segment, and each warp converts the K and V fragments it loads in registers. (sm_90 has no
// native e4m3 mma.sync: the m16n8k32 e4m3 form compiles to a conversion of both operands per MMA
// plus two f16 MMAs.)
struct RawE4m3Mma : F16Mma {};

// The same MMAs over raw fp8_e4m3 tiles for a 16-bit q (16 rows): q in f16 times a per-row power
// of two (prepare_raw_q, kernel_e4m3.cuh), undone on the scores.
struct RawE4m3Q16Mma : F16Mma {};

// f16 MMAs fed straight from raw fp8_ds_mla tiles (kernel_ds_mla.cuh) for a 16-bit q: the NoPE
// scores as four per-scale-group chains over raw e4m3 K (scaled in f32 after the MMAs), the rope
// chain in the rope dtype `Rope` (Bf16Mma or F16Mma), P V over raw e4m3 V with P scaled per key.
template <class Rope>
struct RawDsMlaMma : F16Mma {
  using RopeMma = Rope;
};

}  // namespace mlakit::cuda::decode_sm90

#endif  // MLAKIT_CUDA_DECODE_SM90_PTX_CUH
