// The sm90 decode kernels' own source (plan_kernel.cuh, kernel.cuh, combine_kernel.cuh) run on
// the CPU, with the host launch plan (plan_launch) of the library, against the fp64 oracle: the
// kernels' logic — the work plan from seq_lens, segment loops, the copy pipeline, page lookups,
// masking, online softmax, fragment layouts, epilogue, combine, batch invariance — is checked on
// machines without a GPU.
//
// Emulated execution model: each CTA runs as 256 fibers (ucontext) on one OS thread; a warp's 32
// fibers meet at every warp collective (ldmatrix, mma, shuffle), whose last arriving lane computes
// every lane's result by the PTX ISA's fragment definitions; __syncthreads is a 256-fiber barrier.
// cp.async copies are deferred until the cp.async.wait_group that covers them, the latest moment
// the hardware allows, so a stage read before its wait shows stale data. Shared memory is filled
// with 0xff (NaN) at each CTA's start. The fp8 -> f16 conversion and the MMA element packing use
// the CUDA headers' host implementations; MMA products accumulate in f32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>
#include <ucontext.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <utility>
#include <vector>

using std::isnan;

// ---- the emulated execution model
// ------------------------------------------------------------------

namespace emu {

constexpr int kCtaThreads = 256;  // both kernels run 256 threads per CTA
constexpr int kWarpSize = 32;
constexpr size_t kStackBytes = 64 * 1024;  // the kernels keep < 2 KiB of locals per thread

struct Barrier {
  int count = 0;
  uint64_t generation = 0;
};

struct PendingCopy {
  uint32_t dst;
  const void* src;
  bool valid;
};

// A bulk copy issued onto an mbarrier: it lands when the barrier's phase completes.
struct BulkCopy {
  uint32_t dst;
  const void* src;
  uint32_t bytes;
};

// An mbarrier: a phase completes at the first wait after all `expected` arrivals, when its bulk
// copies land (as late as the hardware may deliver them); their bytes must equal the announced
// ones.
struct MBarrier {
  int expected = 0, pending = 0;
  int64_t announced = 0;
  uint64_t completed = 0;  // phases completed; the current phase's parity is completed % 2
  std::vector<BulkCopy> copies;
  Barrier gate;  // its generation advances when the arrivals are in or a phase completes
};

struct Fiber {
  ucontext_t context;
  std::vector<char> stack;
  bool done = false;
  const Barrier* blocked_on = nullptr;  // the barrier this fiber waits at, if any
  uint64_t blocked_generation = 0;
  unsigned parity = 0;      // of this thread's warp collectives (double-buffered exchange slots)
  unsigned cta_parity = 0;  // of its __syncthreads_or calls
  std::vector<PendingCopy> open_group;
  std::deque<std::vector<PendingCopy>> groups;  // committed, not yet waited for
};

// One warp's exchange slots, two of each so that a lane may enter the next collective while
// others still read the results of this one.
struct Warp {
  Barrier barrier;
  uint32_t addr[2][kWarpSize];
  uint32_t regs_out[2][kWarpSize][4];
  uint32_t a[2][kWarpSize][4], b[2][kWarpSize][2];
  float c[2][kWarpSize][4];
  float value[2][kWarpSize];
};

struct Cta {
  std::vector<Fiber> fibers;
  Warp warps[kCtaThreads / kWarpSize];
  Barrier barrier;
  int or_accumulator[2] = {0, 0}, or_result[2] = {0, 0};
  std::map<uint32_t, MBarrier> mbarriers;  // by shared-memory address
  ucontext_t scheduler;
  int current = 0;
  unsigned block = 0;
  std::function<void()> body;
};

inline Cta* cta = nullptr;
inline uint8_t* shared_base = nullptr;

inline Fiber& self() { return cta->fibers[cta->current]; }
inline unsigned thread_id() { return static_cast<unsigned>(cta->current); }
inline unsigned lane() { return thread_id() % kWarpSize; }
inline Warp& warp() { return cta->warps[thread_id() / kWarpSize]; }

inline void yield() { swapcontext(&self().context, &cta->scheduler); }

// Arrives at `b` (of n participants); the last arrival runs `last` before releasing the others.
template <class Fn>
void arrive_and_wait(Barrier& b, int n, const Fn& last) {
  const uint64_t generation = b.generation;
  if (++b.count == n) {
    last();
    b.count = 0;
    ++b.generation;
    return;
  }
  Fiber& f = self();
  f.blocked_on = &b;
  f.blocked_generation = generation;
  while (b.generation == generation) yield();
  f.blocked_on = nullptr;
}

inline void fiber_entry() {
  cta->body();
  Fiber& f = self();
  EXPECT_TRUE(f.open_group.empty() && f.groups.empty())
      << "thread " << thread_id() << " exits with cp.async copies it never waited for";
  f.done = true;
}

// A fiber that starts in fiber_entry and returns to `scheduler`. Out of line: getcontext returns
// twice, which must not happen in a function with live loop variables (-Wclobbered).
[[gnu::noinline]] inline void init_fiber(Fiber& f, ucontext_t* scheduler) {
  f.stack.resize(kStackBytes);
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = f.stack.data();
  f.context.uc_stack.ss_size = f.stack.size();
  f.context.uc_link = scheduler;
  makecontext(&f.context, fiber_entry, 0);
}

// Runs `body` as blockIdx.x = block on 256 fibers; returns false on a deadlock.
inline bool run_cta(unsigned block, const std::function<void()>& body) {
  Cta c;
  c.block = block;
  c.body = body;
  c.fibers.resize(kCtaThreads);
  cta = &c;
  for (Fiber& f : c.fibers) init_fiber(f, &c.scheduler);
  // Round robin over the fibers that can run (not finished, not waiting at a barrier that has not
  // opened); a pass in which none can run is a deadlock.
  bool all_done = false;
  while (!all_done) {
    all_done = true;
    bool ran = false;
    for (int i = 0; i < kCtaThreads; ++i) {
      Fiber& f = c.fibers[i];
      if (f.done) continue;
      all_done = false;
      if (f.blocked_on != nullptr && f.blocked_on->generation == f.blocked_generation) continue;
      ran = true;
      c.current = i;
      swapcontext(&c.scheduler, &f.context);
    }
    if (!all_done && !ran) {
      cta = nullptr;
      return false;
    }
  }
  cta = nullptr;
  return true;
}

inline float bf16_bits(uint32_t bits) { return __bfloat162float(__ushort_as_bfloat16(bits)); }
inline float f16_bits(uint32_t bits) { return __half2float(__ushort_as_half(bits)); }

// D = A B + C of one m16n8k16 MMA for lane `l`, from every lane's fragments (PTX ISA layouts).
template <bool kBf16>
void mma_lane(const Warp& w, unsigned p, int l, float (&d)[4]) {
  auto elem = [](uint32_t reg, int which) {
    const uint32_t bits = (reg >> (16 * which)) & 0xffffu;
    return kBf16 ? bf16_bits(bits) : f16_bits(bits);
  };
  float a[16][16], b[16][8];
  for (int t = 0; t < kWarpSize; ++t) {
    const int g = t / 4, q = t % 4;
    for (int h = 0; h < 2; ++h) {
      a[g][2 * q + h] = elem(w.a[p][t][0], h);
      a[g + 8][2 * q + h] = elem(w.a[p][t][1], h);
      a[g][2 * q + 8 + h] = elem(w.a[p][t][2], h);
      a[g + 8][2 * q + 8 + h] = elem(w.a[p][t][3], h);
      b[2 * q + h][g] = elem(w.b[p][t][0], h);
      b[2 * q + 8 + h][g] = elem(w.b[p][t][1], h);
    }
  }
  const int g = l / 4, q = l % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), col = 2 * q + e % 2;
    float sum = w.c[p][l][e];
    for (int k = 0; k < 16; ++k) sum += a[row][k] * b[k][col];
    d[e] = sum;
  }
}

template <bool kBf16>
void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Warp& w = warp();
  Fiber& f = self();
  const unsigned p = f.parity;
  const int l = static_cast<int>(lane());
  for (int i = 0; i < 4; ++i) w.a[p][l][i] = a[i], w.c[p][l][i] = d[i];
  w.b[p][l][0] = b0;
  w.b[p][l][1] = b1;
  float out[kWarpSize][4];
  arrive_and_wait(w.barrier, kWarpSize, [&] {
    for (int t = 0; t < kWarpSize; ++t) {
      float r[4];
      mma_lane<kBf16>(w, p, t, r);
      for (int e = 0; e < 4; ++e) out[t][e] = r[e];
    }
    for (int t = 0; t < kWarpSize; ++t)
      for (int e = 0; e < 4; ++e) w.c[p][t][e] = out[t][e];  // results replace the inputs
  });
  for (int e = 0; e < 4; ++e) d[e] = w.c[p][l][e];
  f.parity ^= 1;
}

// ldmatrix .x4 (.trans): lanes 8i..8i+7 address the rows of matrix i.
inline void ldmatrix(uint32_t (&r)[4], uint32_t addr, bool trans) {
  Warp& w = warp();
  Fiber& f = self();
  const unsigned p = f.parity;
  const int l = static_cast<int>(lane());
  w.addr[p][l] = addr;
  arrive_and_wait(w.barrier, kWarpSize, [&] {
    for (int t = 0; t < kWarpSize; ++t) {
      for (int m = 0; m < 4; ++m) {
        uint16_t e[2];
        for (int h = 0; h < 2; ++h) {
          // non-trans: row t / 4, column 2 (t % 4) + h; trans: row 2 (t % 4) + h, column t / 4
          const int row = trans ? 2 * (t % 4) + h : t / 4;
          const int col = trans ? t / 4 : 2 * (t % 4) + h;
          const uint32_t row_addr = w.addr[p][8 * m + row];
          if (row_addr % 16 != 0) ADD_FAILURE() << "ldmatrix row address " << row_addr;
          std::memcpy(&e[h], shared_base + row_addr + 2 * col, 2);
        }
        w.regs_out[p][t][m] = static_cast<uint32_t>(e[0]) | (static_cast<uint32_t>(e[1]) << 16);
      }
    }
  });
  for (int m = 0; m < 4; ++m) r[m] = w.regs_out[p][l][m];
  f.parity ^= 1;
}

inline float shfl_xor(float v, int mask) {
  Warp& w = warp();
  Fiber& f = self();
  const unsigned p = f.parity;
  const int l = static_cast<int>(lane());
  w.value[p][l] = v;
  arrive_and_wait(w.barrier, kWarpSize, [] {});
  const float r = w.value[p][l ^ mask];
  f.parity ^= 1;
  return r;
}

inline uint32_t reduce_add(uint32_t v) {
  Warp& w = warp();
  Fiber& f = self();
  const unsigned p = f.parity;
  w.value[p][lane()] = std::bit_cast<float>(v);
  arrive_and_wait(w.barrier, kWarpSize, [] {});
  uint32_t sum = 0;
  for (int t = 0; t < kWarpSize; ++t) sum += std::bit_cast<uint32_t>(w.value[p][t]);
  f.parity ^= 1;
  return sum;
}

inline MBarrier& mbarrier_at(uint32_t addr) {
  auto it = cta->mbarriers.find(addr);
  if (it == cta->mbarriers.end()) {
    ADD_FAILURE() << "mbarrier at " << addr << " used before its init";
    return cta->mbarriers[addr];
  }
  return it->second;
}

inline void mbarrier_arrive(uint32_t addr, uint32_t bytes) {
  MBarrier& m = mbarrier_at(addr);
  m.announced += bytes;
  if (--m.pending < 0) ADD_FAILURE() << "more arrivals than the mbarrier's count";
  if (m.pending == 0) ++m.gate.generation;
}

inline void mbarrier_wait(uint32_t addr, uint32_t parity) {
  MBarrier& m = mbarrier_at(addr);
  while ((m.completed & 1u) == parity) {
    if (m.pending == 0) {
      int64_t landed = 0;
      for (const BulkCopy& c : m.copies) {
        std::memcpy(shared_base + c.dst, c.src, c.bytes);
        landed += c.bytes;
      }
      if (landed != m.announced) {
        ADD_FAILURE() << "mbarrier phase announced " << m.announced << " bytes, copies brought "
                      << landed;
      }
      m.copies.clear();
      m.announced = 0;
      m.pending = m.expected;
      ++m.completed;
      ++m.gate.generation;
      break;
    }
    Fiber& f = self();
    const uint64_t generation = m.gate.generation;
    f.blocked_on = &m.gate;
    f.blocked_generation = generation;
    while (m.gate.generation == generation) yield();
    f.blocked_on = nullptr;
  }
}

inline void sync_threads() {
  arrive_and_wait(cta->barrier, kCtaThreads, [] {});
}

inline int sync_threads_or(int predicate) {
  Fiber& f = self();
  const unsigned p = f.cta_parity;
  if (predicate) cta->or_accumulator[p] = 1;
  arrive_and_wait(cta->barrier, kCtaThreads, [p] {
    cta->or_result[p] = cta->or_accumulator[p];
    cta->or_accumulator[p] = 0;
  });
  f.cta_parity ^= 1;
  return cta->or_result[p];
}

inline void copy_group(const std::vector<PendingCopy>& group) {
  for (const PendingCopy& c : group) {
    if (c.valid) {
      std::memcpy(shared_base + c.dst, c.src, 16);
    } else {
      std::memset(shared_base + c.dst, 0, 16);
    }
  }
}

struct Index {
  unsigned x;
};

}  // namespace emu

// ---- CUDA builtins the kernel source uses, on the emulated model
// ---------------------------------

#define threadIdx (::emu::Index{::emu::thread_id()})
#define blockIdx (::emu::Index{::emu::cta->block})
#define __launch_bounds__(...)
inline void __syncthreads() { emu::sync_threads(); }
inline int __syncthreads_or(int predicate) { return emu::sync_threads_or(predicate); }
inline float __shfl_xor_sync(unsigned /*mask*/, float v, int mask) {
  return emu::shfl_xor(v, mask);
}
inline unsigned __reduce_add_sync(unsigned /*mask*/, unsigned v) { return emu::reduce_add(v); }
inline float __log2f(float x) { return std::log2(x); }
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// ---- host versions of ptx.cuh
// ----------------------------------------------------------------------

// The library's launch plan lives in mlakit::cuda::decode_sm90; the kernel headers below compile
// into decode_sm90_emulated instead, so that their host-compiled functions cannot clash (or be
// merged by the linker) with the library's kernel stubs of the same names.
#include "cuda/common/device_errors.hpp"
#include "cuda/decode/sm90/launch_plan.hpp"
#include "cuda/decode/sm90/params.cuh"
namespace mlakit::cuda::decode_sm90_emulated {
using namespace ::mlakit::cuda::decode_sm90;  // the kernel arguments and the cache formats
}
#define decode_sm90 decode_sm90_emulated
#include "cuda/decode/sm90/traits.cuh"  // kSmemLimit, for the bulk copies' bounds check

#define MLAKIT_CUDA_DECODE_SM90_PTX_CUH  // kernel.cuh's include of ptx.cuh becomes a no-op
#define MLAKIT_CUDA_COMMON_MBARRIER_CUH  // and ptx.cuh's of mbarrier.cuh
namespace mlakit::cuda::decode_sm90 {

inline void mbarrier_init(uint32_t mbar, int count) {
  emu::MBarrier& m = emu::cta->mbarriers[mbar];
  m = emu::MBarrier{};
  m.expected = m.pending = count;
}
inline void fence_mbarrier_init() {}
inline void mbarrier_arrive_expect_tx(uint32_t mbar, uint32_t bytes) {
  emu::mbarrier_arrive(mbar, bytes);
}
inline void mbarrier_wait(uint32_t mbar, uint32_t parity) { emu::mbarrier_wait(mbar, parity); }
inline void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t mbar) {
  if (dst % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0 || bytes % 16 != 0) {
    ADD_FAILURE() << "bulk copy not in 16-byte units";
  }
  if (dst + bytes > kSmemLimit) ADD_FAILURE() << "bulk copy past shared memory";
  emu::mbarrier_at(mbar).copies.push_back({dst, src, bytes});
}
inline void fence_stores_before_bulk_copies() {}

inline uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(static_cast<const uint8_t*>(p) - emu::shared_base);
}
inline void cp_async_16(uint32_t dst, const void* src, bool valid) {
  if (dst % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) {
    ADD_FAILURE() << "cp.async addresses not 16-byte aligned";
  }
  emu::self().open_group.push_back({dst, src, valid});
}
inline void cp_async_commit() {
  emu::Fiber& f = emu::self();
  f.groups.push_back(std::move(f.open_group));
  f.open_group.clear();
}
template <int kPending>
void cp_async_wait() {
  emu::Fiber& f = emu::self();
  while (static_cast<int>(f.groups.size()) > kPending) {
    emu::copy_group(f.groups.front());
    f.groups.pop_front();
  }
}
inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) { emu::ldmatrix(r, addr, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) { emu::ldmatrix(r, addr, true); }
inline float fast_exp2(float x) { return std::exp2(x); }
// The CTAs run one after another on one thread: a plain OR is the atomic.
inline void report_device_error(uint32_t* error_word, uint32_t bit) { *error_word |= bit; }
inline uint32_t e4m3x2_to_f16x2(uint32_t word, bool high) {
  const auto two = static_cast<__nv_fp8x2_storage_t>(high ? word >> 16 : word & 0xffffu);
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}
inline float2 f16x2_to_float2(uint32_t v) {
  return make_float2(emu::f16_bits(v & 0xffffu), emu::f16_bits(v >> 16));
}
struct Bf16Mma {
  static uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t r;
    std::memcpy(&r, &v, sizeof(r));
    return r;
  }
  static uint32_t from_e4m3x2(uint32_t word, bool high) {
    const float2 f = f16x2_to_float2(e4m3x2_to_f16x2(word, high));
    return pack(f.x, f.y);
  }
  static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    emu::mma<true>(d, a, b0, b1);
  }
};
struct F16Mma {
  static uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    uint32_t r;
    std::memcpy(&r, &v, sizeof(r));
    return r;
  }
  static uint32_t from_e4m3x2(uint32_t word, bool high) { return e4m3x2_to_f16x2(word, high); }
  static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    emu::mma<false>(d, a, b0, b1);
  }
};
struct RawE4m3Mma : F16Mma {};
struct RawE4m3Q16Mma : F16Mma {};
template <class Rope>
struct RawDsMlaMma : F16Mma {
  using RopeMma = Rope;
};
inline uint32_t byte_perm(uint32_t v, uint32_t selector) {
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t pick = (selector >> (4 * i)) & 7u;  // bytes 4-7 would come from the zero word
    const uint32_t byte = pick < 4 ? (v >> (8 * pick)) & 0xffu : 0u;
    r |= byte << (8 * i);
  }
  return r;
}

}  // namespace mlakit::cuda::decode_sm90

#include "cuda/decode/sm90/kernel.cuh"
#undef __shared__
#define __shared__ static  // __shared__ arrays: one copy for all fibers of the CTA
#include "cuda/decode/sm90/combine_kernel.cuh"
#include "cuda/decode/sm90/plan_kernel.cuh"
#undef __shared__

// The kernel's `extern __shared__ uint8_t smem[]`.
namespace mlakit::cuda::decode_sm90 {
alignas(128) uint8_t smem[kSmemLimit];
}
#undef decode_sm90

#include "cuda/decode/schedule.hpp"
#include "cuda/decode_test_support.hpp"
#include "cuda/work_plan_reference.hpp"

namespace mlakit {
namespace {

using namespace decode_test;
namespace sm90 = cuda::decode_sm90_emulated;

template <class Kernel, class Params>
void run_grid(Kernel kernel, const Params& params, int64_t ctas) {
  for (int64_t block = 0; block < ctas; ++block) {
    std::memset(sm90::smem, 0xff, sizeof(sm90::smem));
    emu::shared_base = sm90::smem;
    ASSERT_TRUE(emu::run_cta(static_cast<unsigned>(block), [&] { kernel(params); }))
        << "deadlock in CTA " << block;
  }
}

template <sm90::CacheFormat kFormat, class Element>
void run_decode_rows(const cuda::decode_sm90::LaunchPlan& plan) {
  if (plan.rows_per_cta == 16) {
    run_grid(sm90::mla_decode_sm90_kernel<sm90::Config<16, kFormat, Element>>, plan.decode,
             plan.decode_ctas);
  } else {
    run_grid(sm90::mla_decode_sm90_kernel<sm90::Config<64, kFormat, Element>>, plan.decode,
             plan.decode_ctas);
  }
}

template <sm90::CacheFormat kFormat>
void run_decode_format(const cuda::decode_sm90::LaunchPlan& plan) {
  if constexpr (kFormat == sm90::CacheFormat::kFp8E4m3) {
    if (plan.raw_e4m3) {
      run_decode_rows<kFormat, sm90::RawE4m3Mma>(plan);
      return;
    }
    if (plan.raw_e4m3_q16) {  // 16 rows only
      run_grid(sm90::mla_decode_sm90_kernel<sm90::Config<16, kFormat, sm90::RawE4m3Q16Mma>>,
               plan.decode, plan.decode_ctas);
      return;
    }
  }
  if constexpr (kFormat == sm90::CacheFormat::kFp8DsMla) {
    if (plan.raw_ds_mla) {  // 16 rows only
      if (plan.bf16_mma) {
        run_grid(sm90::mla_decode_sm90_kernel<
                     sm90::Config<16, kFormat, sm90::RawDsMlaMma<sm90::Bf16Mma>>>,
                 plan.decode, plan.decode_ctas);
      } else {
        run_grid(sm90::mla_decode_sm90_kernel<
                     sm90::Config<16, kFormat, sm90::RawDsMlaMma<sm90::F16Mma>>>,
                 plan.decode, plan.decode_ctas);
      }
      return;
    }
  }
  if (plan.bf16_mma) {
    run_decode_rows<kFormat, sm90::Bf16Mma>(plan);
  } else {
    run_decode_rows<kFormat, sm90::F16Mma>(plan);
  }
}

// The launch sequence of cuda::mla_decode, emulated: launch plan (the library's), plan kernel,
// decode, combine. Returns the error word the kernels set.
uint32_t emulate(const DecodeProblem& problem, const DecodeSchedule& schedule) {
  cuda::decode_sm90::LaunchPlan plan = cuda::decode_sm90::plan_launch(problem, schedule);
  uint32_t error_word = 0;
  if (plan.decode_ctas == 0) return error_word;
  plan.decode.error_word = plan.plan.error_word = &error_word;
  run_grid(sm90::mla_decode_plan_kernel, plan.plan, 1);
  switch (plan.format) {
    case sm90::CacheFormat::kNative:
      run_decode_format<sm90::CacheFormat::kNative>(plan);
      break;
    case sm90::CacheFormat::kFp8E4m3:
      run_decode_format<sm90::CacheFormat::kFp8E4m3>(plan);
      break;
    case sm90::CacheFormat::kFp8DsMla:
      run_decode_format<sm90::CacheFormat::kFp8DsMla>(plan);
      break;
  }
  if (plan.combine_ctas > 0) {
    run_grid(plan.combine_by_warps ? sm90::mla_decode_combine_warp_kernel
                                   : sm90::mla_decode_combine_kernel,
             plan.combine, plan.combine_ctas);
  }
  return error_word;
}

// A schedule of the emulation: `parts` parts (the GPU would take one per SM per row tile), and
// every seq_len bounded by max_seq_len (0: the block table's width x block size).
struct Sched {
  int64_t parts = 1;
  bool invariant = false;
  int64_t max_seq_len = 0;
};

struct Outputs {
  Tensor out_storage, lse_storage, workspace;
  TensorView out, lse;
  uint32_t error_word = 0;  // the device error word after the launch
};

// The op's argument bundle, as src/ops/decode.cpp's validation builds it; outputs and workspace
// start as NaN.
// q_scale / k_scale as tensors (DecodeParams::q_scale_tensor): data nullptr takes the Case's.
struct ScaleTensors {
  DecodeScaleTensor q, k;
};

Outputs run_emulated(const Case& c, const HostInputs& in, const Sched& sched,
                     const ScaleTensors& scales = {}) {
  Outputs o;
  o.out_storage = test::nan_tensor({c.batch(), c.s_q, c.heads, kRank + c.out_pad}, c.out_dtype);
  o.lse_storage = test::nan_tensor({c.batch(), c.s_q, c.heads + c.out_pad}, DType::kF32);
  o.out = o.out_storage.view().narrow(3, 0, kRank);
  o.lse = o.lse_storage.view().narrow(2, 0, c.heads);
  const int64_t max_len =
      sched.max_seq_len > 0 ? sched.max_seq_len : in.block_table.size(1) * c.block_size;
  const DecodeSchedule s = cuda::device_decode_schedule(c.batch(), c.s_q, c.heads, max_len,
                                                        sched.parts, sched.invariant);
  o.workspace = test::nan_tensor(
      {std::max<int64_t>(1, ops::mla_decode_workspace_elems(s, c.s_q, c.heads, kRank))},
      DType::kF32);
  DecodeProblem p;
  p.q = in.q;
  p.kv_cache = in.cache;
  p.block_table = in.block_table;
  p.seq_lens = in.seq_lens;
  p.out = o.out;
  p.lse = o.lse;
  p.workspace = o.workspace.data<float>();
  p.kv_dtype = c.kv_dtype;
  p.kv_lora_rank = kRank;
  p.entry_dim = kDim;
  p.rope_dtype = c.kv_dtype == KvCacheDType::kFp8DsMla ? c.cache_dtype : DType::kBF16;
  const bool fp8_values = c.kv_dtype == KvCacheDType::kFp8E4m3;
  p.score_scale =
      kDeepSeekScale * (is_fp8(c.q_dtype) ? c.q_scale : 1.0f) * (fp8_values ? c.k_scale : 1.0f);
  p.value_scale = fp8_values ? c.k_scale : 1.0f;
  p.q_scales = scales.q;
  p.k_scales = scales.k;
  p.softmax_scale = kDeepSeekScale;
  p.q_scale = c.q_scale;
  p.k_scale = c.k_scale;
  p.q_scale_applies = is_fp8(c.q_dtype);
  p.k_scale_applies = fp8_values;
  o.error_word = emulate(p, s);
  return o;
}

// The emulated decode of `in` under each schedule against the oracle (out, lse, cosine to the exact
// values) and the outputs' pads.
void check_inputs(const Case& c, const HostInputs& in, const std::vector<Sched>& schedules) {
  SCOPED_TRACE(c.name());
  const Expected kernel_ref = reference(c, in.q_kernel, in.k_kernel);
  const Expected exact_ref = c.exact_inputs() ? kernel_ref : reference(c, in.q_exact, in.k_exact);
  for (const Sched& s : schedules) {
    SCOPED_TRACE(testing::Message() << "parts " << s.parts << (s.invariant ? " invariant" : ""));
    const Outputs o = run_emulated(c, in, s);
    EXPECT_EQ(o.error_word, 0u) << "good indices must not be reported";
    EXPECT_TRUE(test::all_close(o.out, kernel_ref.out, out_tolerance(c))) << "out vs oracle";
    EXPECT_TRUE(test::all_close(o.lse, kernel_ref.lse, kLseTolerance)) << "lse vs oracle";
    EXPECT_LT(cos_diff(test::to_doubles(o.out), exact_ref.out), cos_bar(c));
    // Pads of the strided outputs keep their NaN.
    const std::vector<double> out = test::to_doubles(o.out_storage.view());
    for (size_t i = 0; i < out.size(); ++i) {
      if (static_cast<int64_t>(i) % (kRank + c.out_pad) >= kRank) {
        ASSERT_TRUE(std::isnan(out[i])) << "out pad element " << i << " was written";
      }
    }
  }
}

void check_case(const Case& c, uint64_t stream, const std::vector<Sched>& schedules) {
  auto rng = test::make_rng(stream);
  check_inputs(c, make_inputs(c, rng), schedules);
}

// Balanced schedules over `parts` parts, and batch-invariant ones over the first of them.
std::vector<Sched> balanced(std::initializer_list<int64_t> parts) {
  std::vector<Sched> s;
  for (int64_t p : parts) s.push_back({p, false, 0});
  return s;
}

// ---- the plan kernel ---------------------------------------------------------------------------

// The plan kernel's records for `lens` (max_len bounds them), emulated, against the host
// assembly of the same plan.
void expect_plan_kernel_matches_host(const std::vector<int32_t>& lens, int32_t max_len,
                                     int64_t parts, bool invariant) {
  const int64_t batch = static_cast<int64_t>(lens.size());
  const HostWorkPlan want = host_work_plan(lens, max_len, parts, invariant);

  const cuda::WorkPlanBounds bounds = cuda::work_plan_bounds(batch, parts, invariant, max_len);
  const cuda::WorkspaceLayout layout = cuda::workspace_layout(parts, bounds, 16, kRank);
  std::vector<int32_t> ws(static_cast<size_t>(layout.partial_lse), -7);  // poison
  cuda::decode_sm90::PlanParams p{};
  p.seq_lens = lens.data();
  p.seq_lens_stride = 1;
  p.batch = static_cast<int32_t>(batch);
  p.max_seq_len = max_len;
  p.num_parts = static_cast<int32_t>(parts);
  p.rows = 16;  // host_work_plan's default
  p.batch_invariant = invariant;
  p.bounds = bounds;
  p.header = ws.data();
  p.part_begin = ws.data() + layout.part_begin;
  p.segments = reinterpret_cast<cuda::SegmentRecord*>(ws.data() + layout.segments);
  p.segment_part = ws.data() + layout.segment_part;
  p.splits = reinterpret_cast<cuda::SplitRecord*>(ws.data() + layout.splits);
  uint32_t error_word = 0;
  p.error_word = &error_word;
  run_grid(sm90::mla_decode_plan_kernel, p, 1);

  EXPECT_EQ(error_word, 0u);
  ASSERT_EQ(ws[cuda::kHeaderSegments], static_cast<int32_t>(want.segments.size()));
  ASSERT_EQ(ws[cuda::kHeaderSplitRequests], static_cast<int32_t>(want.splits.size()));
  ASSERT_EQ(ws[cuda::kHeaderPartials], static_cast<int32_t>(want.partials));
  for (size_t i = 0; i < want.segments.size(); ++i) {
    const cuda::SegmentRecord& got = p.segments[i];
    const cuda::SegmentRecord& w = want.segments[i];
    ASSERT_TRUE(got.request == w.request && got.key_begin == w.key_begin &&
                got.key_end == w.key_end && got.slot == w.slot)
        << "segment " << i;
    ASSERT_EQ(p.segment_part[i], want.segment_part[i]) << "segment " << i;
  }
  for (size_t i = 0; i < want.splits.size(); ++i) {
    ASSERT_EQ(p.splits[i].request, want.splits[i].request) << i;
    ASSERT_EQ(p.splits[i].first_slot, want.splits[i].first_slot) << i;
    ASSERT_EQ(p.splits[i].num_segments, want.splits[i].num_segments) << i;
  }
  for (int64_t part = 0; part <= parts; ++part) {
    ASSERT_EQ(p.part_begin[part], want.part_begin[part]) << "part " << part;
  }
}

TEST(MlaDecodeEmulated, PlanKernelMatchesTheHostPlan) {
  auto rng = test::make_rng(50);
  for (bool invariant : {false, true}) {
    for (int64_t parts : {1, 3, 66, 256}) {
      for (int64_t batch : {1, 7, 300, 700}) {
        SCOPED_TRACE(testing::Message()
                     << (invariant ? "invariant" : "balanced") << " P " << parts << " B " << batch);
        const int32_t max_len = 5000;
        std::uniform_int_distribution<int32_t> len(-2, max_len + 2);  // a few bad ones
        std::vector<int32_t> lens;
        for (int64_t b = 0; b < batch; ++b) lens.push_back(len(rng));
        expect_plan_kernel_matches_host(lens, max_len, parts, invariant);
      }
    }
  }
}

// Equal lengths with B = P or 2 P: the plan keeps every request whole (no partial, no combine).
TEST(MlaDecodeEmulated, PlanKernelKeepsEqualRequestsWhole) {
  auto rng = test::make_rng(51);
  for (int64_t parts : {3, 66, 132}) {
    for (int64_t per_part : {1, 2}) {
      SCOPED_TRACE(testing::Message() << "P " << parts << " B " << parts * per_part);
      const int32_t max_len = 9000;
      const std::vector<int32_t> lens(static_cast<size_t>(parts * per_part),
                                      std::uniform_int_distribution<int32_t>(1, max_len)(rng));
      const HostWorkPlan want = host_work_plan(lens, max_len, parts, false);
      EXPECT_TRUE(want.whole);
      EXPECT_EQ(want.partials, 0);
      expect_plan_kernel_matches_host(lens, max_len, parts, false);
    }
  }
}

// A plan that would not fit its bounds (which work_plan_bounds excludes; here the bounds are cut
// by hand) is reported and replaced by an empty one: nothing is written past a region.
TEST(MlaDecodeEmulated, PlanKernelNeverOutgrowsItsBounds) {
  const std::vector<int32_t> lens = {3000, 10, 700, 0, 4000};
  const int64_t parts = 7, max_len = 4096;
  const HostWorkPlan want = host_work_plan(lens, max_len, parts, false);
  for (int cut = 0; cut < 3; ++cut) {
    SCOPED_TRACE(testing::Message() << "cut " << cut);
    cuda::WorkPlanBounds bounds = cuda::work_plan_bounds(5, parts, false, max_len);
    if (cut == 0) bounds.max_segments = static_cast<int64_t>(want.segments.size()) - 1;
    if (cut == 1) bounds.max_partials = want.partials - 1;
    if (cut == 2) bounds.max_split_requests = static_cast<int64_t>(want.splits.size()) - 1;
    const cuda::WorkspaceLayout layout = cuda::workspace_layout(parts, bounds, 16, kRank);
    const int64_t guard = 64;  // words past the plan's regions that must stay untouched
    std::vector<int32_t> ws(static_cast<size_t>(layout.partial_lse + guard), -7);
    cuda::decode_sm90::PlanParams p{};
    p.seq_lens = lens.data();
    p.seq_lens_stride = 1;
    p.batch = 5;
    p.max_seq_len = static_cast<int32_t>(max_len);
    p.num_parts = static_cast<int32_t>(parts);
    p.bounds = bounds;
    p.header = ws.data();
    p.part_begin = ws.data() + layout.part_begin;
    p.segments = reinterpret_cast<cuda::SegmentRecord*>(ws.data() + layout.segments);
    p.segment_part = ws.data() + layout.segment_part;
    p.splits = reinterpret_cast<cuda::SplitRecord*>(ws.data() + layout.splits);
    uint32_t error_word = 0;
    p.error_word = &error_word;
    run_grid(sm90::mla_decode_plan_kernel, p, 1);
    EXPECT_EQ(error_word, uint32_t{cuda::kDecodePlanOverflow});
    EXPECT_EQ(ws[cuda::kHeaderSegments], 0);
    EXPECT_EQ(ws[cuda::kHeaderSplitRequests], 0);
    for (int64_t part = 0; part <= parts; ++part) EXPECT_EQ(p.part_begin[part], 0) << part;
    for (int64_t i = layout.partial_lse; i < layout.partial_lse + guard; ++i) {
      ASSERT_EQ(ws[i], -7) << "word " << i << " past the plan's regions was written";
    }
  }
}

// ---- decode against the oracle -----------------------------------------------------------------

// 16-row CTAs: lengths around tile and page boundaries, an empty request; one part (no combine),
// three and twenty parts (cuts inside requests, parts left empty).
TEST(MlaDecodeEmulated, Bf16SixteenRows) {
  Case c;
  c.seq_lens = {65, 130, 0};
  c.block_size = 16;
  check_case(c, 100, balanced({1, 3, 20}));
}

// The combine's column slices (combine.cuh): few split rows beside the decode's CTAs take 4 or 2
// slices, many take 1; one request cut over 16 parts with 16 rows (4 slices) and over 32 parts with
// 128 rows (2).
TEST(MlaDecodeEmulated, CombineColumnSlices) {
  using sm90::combine_column_slices;
  EXPECT_EQ(combine_column_slices(16, 16), 4);     // B 1, 16 rows, 16 parts
  EXPECT_EQ(combine_column_slices(128, 64), 2);    // B 1, 128 rows (2 row tiles), 32 parts
  EXPECT_EQ(combine_column_slices(128, 132), 4);   // B 1, 128 rows, 66 parts x 2 row tiles
  EXPECT_EQ(combine_column_slices(8320, 132), 1);  // B 128 varied lengths, 128 rows
  EXPECT_EQ(combine_column_slices(512, 132), 1);   // B 32, 16 rows, 132 parts
  Case c;
  c.seq_lens = {900};
  check_case(c, 1100, balanced({16}));
  Case d;
  d.seq_lens = {900};
  d.heads = 128;
  d.out_dtype = DType::kF16;
  check_case(d, 1101, balanced({32}));
}

// The combine with a warp per row (combine.cuh): chosen when the split rows outnumber 4 combine
// CTAs per decode CTA, never in batch-invariant mode; cut requests with 16 and 128 rows over few
// parts merge through it (and the batch-invariant schedules of the same cases through the CTA
// shape).
TEST(MlaDecodeEmulated, CombineByWarps) {
  using sm90::combine_by_warps;
  EXPECT_TRUE(combine_by_warps(8320, 132, false));  // B 128 varied lengths, 128 rows
  EXPECT_FALSE(combine_by_warps(8320, 132, true));
  EXPECT_FALSE(combine_by_warps(512, 132, false));  // B 32, 16 rows, 132 parts
  EXPECT_TRUE(combine_by_warps(1024, 132, false));  // B 64, 16 rows, 132 parts
  Case c;
  c.seq_lens = {300, 700, 1000, 5};
  check_case(c, 1200, {{2, false, 0}, {3, false, 0}, {2, true, 0}});
  Case d;
  d.seq_lens = {640, 70, 900};
  d.heads = 128;
  d.out_dtype = DType::kBF16;
  check_case(d, 1201, {{2, false, 0}, {2, true, 0}});
}

// 64-row CTAs: s_q 4 x 16 heads, bottom-right causal across segment boundaries.
TEST(MlaDecodeEmulated, Bf16SixtyFourRowsCausal) {
  Case c;
  c.seq_lens = {100, 7};
  c.s_q = 4;
  c.out_dtype = DType::kBF16;
  check_case(c, 200, balanced({1, 2}));
}

// Rows of a 64-row CTA partly padding (s_q 2 x 24 heads = 48), f16 cache, page 128.
TEST(MlaDecodeEmulated, F16PartialRowTile) {
  Case c;
  c.seq_lens = {70};
  c.s_q = 2;
  c.heads = 24;
  c.block_size = 128;
  c.cache_dtype = c.q_dtype = DType::kF16;
  c.out_dtype = DType::kF16;
  check_case(c, 300, balanced({2}));
}

// Two 64-row tiles per request (128 heads); s_q 8 with requests of s_q and s_q + 1 keys (query 0
// sees one or two keys); one long request cut by nineteen part boundaries.
TEST(MlaDecodeEmulated, RowTilesSpeculativeQueriesAndManyParts) {
  Case heads128;
  heads128.seq_lens = {70, 0};
  heads128.heads = 128;
  heads128.out_dtype = DType::kBF16;
  check_case(heads128, 250, balanced({2}));
  Case spec;
  spec.seq_lens = {9, 8, 0};
  spec.s_q = 8;
  spec.heads = 8;
  spec.block_size = 16;
  check_case(spec, 251, balanced({1, 2}));
  Case long_one;
  long_one.seq_lens = {1000};
  check_case(long_one, 252, balanced({20}));
}

TEST(MlaDecodeEmulated, Fp8CacheWithScales) {
  Case c;  // f16 MMAs (fp8 q), 16 rows, four raw stages
  c.seq_lens = {100, 64};
  c.kv_dtype = KvCacheDType::kFp8E4m3;
  c.q_dtype = DType::kFp8E4m3;
  c.q_scale = 2.0f;
  c.k_scale = 3.0f;
  c.block_size = 16;
  check_case(c, 400, balanced({1, 2}));
  Case bf16_q = c;  // bf16 MMAs, 64 rows
  bf16_q.q_dtype = DType::kBF16;
  bf16_q.seq_lens = {70};
  bf16_q.heads = 32;
  bf16_q.out_dtype = DType::kBF16;
  check_case(bf16_q, 401, balanced({1}));
}

// An fp8 q over fp8_e4m3 in 16-byte rows reads the raw tiles in place (kernel_e4m3.cuh):
// 16 and 64 rows, a partial 64-row tile, causal s_q 2, a strided q; a q row that is not 16-byte
// aligned takes the converting path instead. All against the fp64 oracle.
TEST(MlaDecodeEmulated, Fp8QueryOverRawE4m3Tiles) {
  uint64_t stream = 420;
  Case c;
  c.kv_dtype = KvCacheDType::kFp8E4m3;
  c.q_dtype = DType::kFp8E4m3;
  c.q_scale = 0.5f;
  c.k_scale = 1.5f;
  c.seq_lens = {200, 3, 0, 64};
  c.block_size = 32;
  c.out_dtype = DType::kBF16;
  check_case(c, stream++, {{3}, {2, true}});
  Case rows64 = c;  // 2 row tiles of 64, causal within the split
  rows64.heads = 64;
  rows64.s_q = 2;
  rows64.seq_lens = {130, 2, 65};
  rows64.out_dtype = DType::kF32;
  check_case(rows64, stream++, {{4}, {2, true}});
  Case partial = c;  // 20 rows: one 64-row tile, 44 rows past the end
  partial.heads = 20;
  partial.seq_lens = {77, 128};
  partial.q_pad = 16;  // strided q, still 16-byte rows
  check_case(partial, stream++, {{2}});
  Case unaligned = c;  // 584-byte q rows: the converting path
  unaligned.q_pad = 8;
  check_case(unaligned, stream++, {{2}});
}

TEST(MlaDecodeEmulated, DsMlaCache) {
  Case c;  // bf16, 16 rows, three raw stages
  c.seq_lens = {90, 3};
  c.kv_dtype = KvCacheDType::kFp8DsMla;
  c.k_scale = 5.0f;  // must not apply
  check_case(c, 500, balanced({2}));
  Case f16 = c;  // f16, 64 rows, one raw stage; fp8 q with the rope dtype from out
  f16.cache_dtype = DType::kF16;
  f16.q_dtype = DType::kFp8E4m3;
  f16.out_dtype = DType::kF16;
  f16.s_q = 2;
  f16.seq_lens = {130};
  check_case(f16, 501, balanced({1}));
}

// Raw tiles of both fp8 formats under a 16-bit q (16 rows): a bf16 q past f16's range (|q| up to
// ~1e5, the rows' power-of-two factors bring it into f16), rows of very different magnitudes (one
// row's NoPE dims scaled by 2^-40), and keys whose magnitudes differ by up to 2^8 from token to
// token (fp8_ds_mla: the tile scales, so the value-scale bound m changes from tile to tile),
// against the oracle.
TEST(MlaDecodeEmulated, RawTilesRangesOfQAndScales) {
  uint64_t stream = 1400;
  for (KvCacheDType kv : {KvCacheDType::kFp8DsMla, KvCacheDType::kFp8E4m3})
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      Case c;
      c.kv_dtype = kv;
      c.q_dtype = c.cache_dtype = c.out_dtype = dtype;
      c.seq_lens = {150, 70};
      ASSERT_TRUE(c.raw_ds_mla() || kv == KvCacheDType::kFp8E4m3);
      auto rng = test::make_rng(stream++);
      std::vector<RequestValues> requests;
      for (int32_t len : c.seq_lens) requests.push_back(random_request(c, len, rng));
      for (RequestValues& r : requests) {
        for (int64_t row = 0; row < c.s_q * c.heads; ++row) {
          // bf16: rows up to 3e4 x N(0, 1); f16 must stay in its range: 30 at most
          const float magnitude = row == 1                ? std::ldexp(1.0f, -40)
                                  : dtype == DType::kBF16 ? 3e4f
                                                          : 30.0f;
          for (int64_t i = 0; i < kDim; ++i) r.q[row * kDim + i] *= i < kRank ? magnitude : 1.0f;
        }
        for (int32_t s = 0; s < r.seq_len; ++s) {
          const float spread = std::ldexp(1.0f, (s * 7) % 9 - 4);  // 2^-4 .. 2^4
          for (int64_t i = 0; i < kRank; ++i) r.keys[s * kDim + i] *= spread;
        }
      }
      check_inputs(c, batch_inputs(c, requests, rng), balanced({1, 3}));
    }
}

// The 16-row fp8 paths over every page shape: raw fp8_ds_mla tiles (a 16-bit q) land by bulk
// copies, one per run of a page's slots in a tile (one per key when the slots are not contiguous),
// raw e4m3 tiles (an fp8 or a 16-bit q) and converted ones (an f32 q over fp8_e4m3) by cp.async.
// Pages of 1, 24 and 128 slots, lengths ending mid-tile and mid-page (the keys past a segment are
// zeroed by the threads over the NaN-initialized shared memory), a strided cache whose slots are
// not contiguous, and a block id outside the cache inside a run of fp8_ds_mla keys (zeroed, not
// read).
TEST(MlaDecodeEmulated, Fp8PagesOfEveryShape) {
  uint64_t stream = 1500;
  for (int64_t bs : {1, 24, 128}) {
    for (int64_t cache_pad : {0, 16}) {
      for (const Case& c : fp8_page_shape_cases({150, 0, 65, 2}, bs, cache_pad)) {
        check_case(c, stream++, balanced({1, 3}));
      }
    }
  }
  Case c;
  c.seq_lens = {90, 100};
  c.kv_dtype = KvCacheDType::kFp8DsMla;
  c.block_size = 16;
  auto rng = test::make_rng(stream);
  HostInputs in = make_inputs(c, rng);
  const Expected ref = reference(c, in.q_kernel, in.k_kernel);
  in.block_table.data<int32_t>()[1 * in.block_table.size(1) + 2] =
      static_cast<int32_t>(in.cache.size(0));  // keys 32-47 of request 1
  const Outputs o = run_emulated(c, in, {2});
  EXPECT_EQ(o.error_word, uint32_t{cuda::kDecodeBadIndex});
  const int64_t row = c.s_q * c.heads;
  const std::vector<double> out = test::to_doubles(o.out), lse = test::to_doubles(o.lse);
  for (int64_t i = row * kRank; i < 2 * row * kRank; ++i) ASSERT_TRUE(std::isnan(out[i])) << i;
  for (int64_t i = row; i < 2 * row; ++i) ASSERT_TRUE(std::isnan(lse[i])) << i;
  const std::vector<double> want(ref.out.begin(), ref.out.begin() + row * kRank);
  EXPECT_TRUE(test::all_close(o.out.narrow(0, 0, 1), want, out_tolerance(c)));
}

// A NaN cache value (e4m3 0xff) makes every row that sees it NaN (out and lse); the other requests
// stay exact. bf16 and f16, 16- and 64-row CTAs.
TEST(MlaDecodeEmulated, NanCacheValuesPropagate) {
  Case base;
  base.seq_lens = {40, 70};
  base.block_size = 16;
  for_each_nan_cache_case(base, {16, 64}, 37, 300, 1300,
                          [](const Case& c, const HostInputs& in, const Expected& ref) {
                            const Outputs o = run_emulated(c, in, {2, false, 0});
                            expect_nan_request_only(c, o.out, o.lse, ref, 1);
                          });
}

// Unaligned q rows (scalar loads), an f32 q converted to bf16, strided out and lse.
TEST(MlaDecodeEmulated, StridedAndConvertedQuery) {
  Case c;
  c.seq_lens = {40, 0};
  c.s_q = 2;
  c.heads = 4;
  c.q_pad = 1;
  c.out_pad = 8;
  c.q_dtype = DType::kF32;
  check_case(c, 600, balanced({1, 2}));
}

// ---- varied lengths under the work-balanced and the batch-invariant plans ----------------------

// Lengths 0, s_q (the shortest valid: seq_lens count the new tokens too), s_q + 1, k * 64 +- 1,
// one long among short ones; s_q 1..4 over 16 heads (16, 32, 48, 64 rows); the parts cut requests
// anywhere, several segments run in one CTA, and segments of one request land in different CTAs.
TEST(MlaDecodeEmulated, VariedLengthsAndQueryCounts) {
  uint64_t stream = 1000;
  for (int64_t s_q : {1, 2, 3, 4}) {
    Case c;
    const auto shortest = static_cast<int32_t>(s_q);
    c.seq_lens = {0, shortest, 63, 65, 129, shortest + 1, 191, 0};
    c.s_q = s_q;
    c.block_size = 16;
    c.out_dtype = s_q % 2 == 0 ? DType::kBF16 : DType::kF32;
    check_case(c, stream++, {{1}, {3}, {5}, {2, true}});
  }
  Case one_long;
  one_long.seq_lens = {1, 2, 640, 1, 0, 3, 1};
  check_case(one_long, stream++, {{4}, {7}, {3, true}});
}

// 64 and 128 heads (one and two 64-row tiles) with varied lengths, every cache format.
TEST(MlaDecodeEmulated, VariedLengthsManyHeadsAllFormats) {
  uint64_t stream = 1100;
  for (int64_t heads : {64, 128}) {
    Case c;
    c.seq_lens = {130, 1, 0, 65};
    c.heads = heads;
    c.out_dtype = DType::kBF16;
    check_case(c, stream++, {{3}, {2, true}});
  }
  Case fp8;
  fp8.seq_lens = {1, 127, 0, 64, 200};
  fp8.kv_dtype = KvCacheDType::kFp8E4m3;
  fp8.k_scale = 2.0f;
  fp8.block_size = 16;
  check_case(fp8, stream++, {{4}, {3, true}});
  Case ds_mla;
  ds_mla.seq_lens = {63, 0, 129, 2};  // s_q 2: the shortest valid request has 2 keys
  ds_mla.kv_dtype = KvCacheDType::kFp8DsMla;
  ds_mla.s_q = 2;
  check_case(ds_mla, stream++, {{3}, {2, true}});
  Case ds_mla_64 = ds_mla;
  ds_mla_64.heads = 64;
  ds_mla_64.s_q = 1;
  check_case(ds_mla_64, stream++, {{3}});
}

// A request longer than one batch-invariant piece (16 tiles): three pieces, merged in order.
TEST(MlaDecodeEmulated, BatchInvariantPiecesOfALongRequest) {
  Case c;
  c.seq_lens = {2100, 5};
  c.block_size = 64;
  check_case(c, 1200, {{1, true}, {4, true}});
}

// Request r's out and lse bits alone and inside random batches of companions (other lengths,
// positions and part counts): the batch-invariant plan cuts it the same way, each piece is computed
// by the same code whichever CTA runs it, and the combine sums in a fixed order.
void check_batch_invariance(Case c, int32_t r_len, int batches, int max_companions,
                            uint64_t stream) {
  SCOPED_TRACE(c.name());
  auto rng = test::make_rng(stream);
  const RequestValues r = random_request(c, r_len, rng);
  c.seq_lens = {r_len};
  const HostInputs alone_in = batch_inputs(c, {r}, rng);
  const Outputs alone = run_emulated(c, alone_in, {1, true, 0});
  const Expected want = reference(c, alone_in.q_kernel, alone_in.k_kernel);
  EXPECT_TRUE(test::all_close(alone.out, want.out, out_tolerance(c))) << "r alone vs oracle";
  const std::vector<double> alone_out = test::to_doubles(alone.out);
  const std::vector<double> alone_lse = test::to_doubles(alone.lse);
  const int64_t rows = c.s_q * c.heads;
  std::uniform_int_distribution<int> companions(1, max_companions);
  std::uniform_int_distribution<int32_t> other_len(0, 300);
  std::uniform_int_distribution<int64_t> parts(1, 6);
  for (int trial = 0; trial < batches; ++trial) {
    std::vector<RequestValues> batch;
    const int n = companions(rng);
    for (int i = 0; i < n; ++i) {
      batch.push_back(random_request(c, valid_seq_len(other_len(rng), c.s_q), rng));
    }
    const size_t at = std::uniform_int_distribution<size_t>(0, batch.size())(rng);
    batch.insert(batch.begin() + static_cast<std::ptrdiff_t>(at), r);
    Case bc = c;
    bc.seq_lens.clear();
    for (const RequestValues& v : batch) bc.seq_lens.push_back(v.seq_len);
    const HostInputs in = batch_inputs(bc, batch, rng);
    const int64_t p = parts(rng);
    SCOPED_TRACE(testing::Message() << "trial " << trial << ": r at " << at << " of "
                                    << batch.size() << ", parts " << p);
    const Outputs o = run_emulated(bc, in, {p, true, 0});
    const std::vector<double> out = test::to_doubles(o.out.narrow(0, at, 1));
    const std::vector<double> lse = test::to_doubles(o.lse.narrow(0, at, 1));
    ASSERT_EQ(out.size(), alone_out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(std::memcmp(&out[i], &alone_out[i], sizeof(double)), 0)
          << "out element " << i << ": " << out[i] << " vs " << alone_out[i] << " alone";
    }
    for (int64_t i = 0; i < rows; ++i) {
      ASSERT_EQ(std::memcmp(&lse[i], &alone_lse[i], sizeof(double)), 0)
          << "lse " << i << ": " << lse[i] << " vs " << alone_lse[i] << " alone";
    }
  }
}

TEST(MlaDecodeEmulated, BatchInvariantRequestIsBitwiseTheSameInAnyBatch) {
  Case c;  // 16 rows, bf16 out, a request of three pieces
  c.out_dtype = DType::kBF16;
  check_batch_invariance(c, 2000, 4, 6, 1300);
  Case many = c;  // 64-row CTAs, s_q 2 (causal within the last piece), f32 out, fp8 cache
  many.heads = 32;
  many.s_q = 2;
  many.out_dtype = DType::kF32;
  many.kv_dtype = KvCacheDType::kFp8E4m3;
  many.block_size = 16;
  check_batch_invariance(many, 1100, 3, 4, 1301);
}

// ---- bad indices -------------------------------------------------------------------------------

// A block id past the cache, a negative one, a seq_len beyond the table: those requests' rows are
// NaN and the error word is set; the good request stays exact. Also a seq_len within the table
// but above the schedule's max_seq_len.
TEST(MlaDecodeEmulated, BadIndicesGiveNanRows) {
  Case c;
  c.seq_lens = {50, 100, 20, 40};
  c.block_size = 16;
  auto rng = test::make_rng(700);
  HostInputs in = make_inputs(c, rng);
  const Expected ref = reference(c, in.q_kernel, in.k_kernel);
  const int64_t width = in.block_table.size(1);
  int32_t* table = in.block_table.data<int32_t>();
  table[1 * width + 5] = static_cast<int32_t>(in.cache.size(0));  // one past the last block
  table[3 * width + 1] = -1;
  in.seq_lens.data<int32_t>()[2] = static_cast<int32_t>(width * c.block_size + 1);
  const int64_t row = c.s_q * c.heads;
  for (const Sched& s : std::vector<Sched>{{1}, {2}, {3, true}}) {
    SCOPED_TRACE(testing::Message() << "parts " << s.parts << (s.invariant ? " invariant" : ""));
    const Outputs o = run_emulated(c, in, s);
    EXPECT_EQ(o.error_word, uint32_t{cuda::kDecodeBadIndex});
    const std::vector<double> out = test::to_doubles(o.out), lse = test::to_doubles(o.lse);
    for (int64_t i = row * kRank; i < 4 * row * kRank; ++i) ASSERT_TRUE(std::isnan(out[i])) << i;
    for (int64_t i = row; i < 4 * row; ++i) ASSERT_TRUE(std::isnan(lse[i])) << i;
    const std::vector<double> want(ref.out.begin(), ref.out.begin() + row * kRank);
    EXPECT_TRUE(test::all_close(o.out.narrow(0, 0, 1), want, out_tolerance(c)));
  }
  // seq_len 100 of request 1 is within the table but above a schedule bound of 64.
  Case bounded;
  bounded.seq_lens = {50, 100};
  bounded.block_size = 16;
  const HostInputs good = make_inputs(bounded, rng);
  const Expected good_ref = reference(bounded, good.q_kernel, good.k_kernel);
  const Outputs o = run_emulated(bounded, good, {2, false, 64});
  EXPECT_EQ(o.error_word, uint32_t{cuda::kDecodeBadIndex});
  const std::vector<double> out = test::to_doubles(o.out);
  for (int64_t i = row * kRank; i < 2 * row * kRank; ++i) ASSERT_TRUE(std::isnan(out[i])) << i;
  const std::vector<double> want(good_ref.out.begin(), good_ref.out.begin() + row * kRank);
  EXPECT_TRUE(test::all_close(o.out.narrow(0, 0, 1), want, out_tolerance(bounded)));
}

// seq_lens count the s_q new tokens too: a seq_len in (0, s_q) is inconsistent metadata, so its
// rows become NaN and the error word is set, while the other requests stay exact.
TEST(MlaDecodeEmulated, SeqLenShorterThanTheQueriesGivesNanRows) {
  Case c;
  c.seq_lens = {50, 30};
  c.s_q = 4;
  c.heads = 4;
  c.block_size = 16;
  auto rng = test::make_rng(710);
  HostInputs in = make_inputs(c, rng);
  const Expected ref = reference(c, in.q_kernel, in.k_kernel);
  in.seq_lens.data<int32_t>()[1] = 3;
  const int64_t row = c.s_q * c.heads;
  for (const Sched& s : std::vector<Sched>{{1}, {2}, {3, true}}) {
    SCOPED_TRACE(testing::Message() << "parts " << s.parts << (s.invariant ? " invariant" : ""));
    const Outputs o = run_emulated(c, in, s);
    EXPECT_EQ(o.error_word, uint32_t{cuda::kDecodeBadIndex});
    const std::vector<double> out = test::to_doubles(o.out), lse = test::to_doubles(o.lse);
    for (int64_t i = row * kRank; i < 2 * row * kRank; ++i) ASSERT_TRUE(std::isnan(out[i])) << i;
    for (int64_t i = row; i < 2 * row; ++i) ASSERT_TRUE(std::isnan(lse[i])) << i;
    const std::vector<double> want(ref.out.begin(), ref.out.begin() + row * kRank);
    EXPECT_TRUE(test::all_close(o.out.narrow(0, 0, 1), want, out_tolerance(c)));
  }
}

// Scale tensors read by the kernel (make_work_item): with one value per request, request b's rows
// are bitwise those of the host-scale launch with (q_scales[b], k_scales[b]) (which the tests
// above check against the oracle), for raw e4m3 tiles and the converting path, 16- and 64-row
// CTAs, split and whole requests. A value that is not finite and > 0 makes its request's rows NaN
// and sets kDecodeBadScale; the other requests keep their bits.
// An fp8 q over an fp8_e4m3 cache (raw e4m3 tiles), f32 out.
Case fp8_case(std::vector<int32_t> seq_lens, int64_t block_size) {
  Case c;
  c.kv_dtype = KvCacheDType::kFp8E4m3;
  c.q_dtype = DType::kFp8E4m3;
  c.seq_lens = std::move(seq_lens);
  c.block_size = block_size;
  c.out_dtype = DType::kF32;
  return c;
}

TEST(MlaDecodeEmulated, PerRequestScaleTensorsEqualTheHostScalesBitwise) {
  const float q_scales[] = {0.5f, 2.0f, 0.25f};
  const float k_scales[] = {1.5f, 0.75f, 3.0f};
  const Case fp8 = fp8_case({130, 0, 70}, 32);
  Case rows64 = fp8;
  rows64.heads = 64;
  Case bf16_q = fp8;  // q_scale does not apply: read, checked, not multiplied
  bf16_q.q_dtype = DType::kBF16;
  uint64_t stream = 800;
  for (const Case& c : {fp8, rows64, bf16_q}) {
    SCOPED_TRACE(c.name());
    auto rng = test::make_rng(stream++);
    const HostInputs in = make_inputs(c, rng);
    const int64_t rows = c.s_q * c.heads;
    for (const Sched& sched : std::vector<Sched>{{1}, {3}}) {
      SCOPED_TRACE(testing::Message() << "parts " << sched.parts);
      const Outputs tensor = run_emulated(c, in, sched, {{q_scales, 1}, {k_scales, 1}});
      EXPECT_EQ(tensor.error_word, 0u);
      for (int64_t b = 0; b < c.batch(); ++b) {
        Case host = c;
        host.q_scale = q_scales[b];
        host.k_scale = k_scales[b];
        const Outputs want = run_emulated(host, in, sched);
        const std::vector<double> got_out = test::to_doubles(tensor.out.narrow(0, b, 1));
        const std::vector<double> want_out = test::to_doubles(want.out.narrow(0, b, 1));
        const std::vector<double> got_lse = test::to_doubles(tensor.lse.narrow(0, b, 1));
        const std::vector<double> want_lse = test::to_doubles(want.lse.narrow(0, b, 1));
        ASSERT_EQ(got_out.size(), static_cast<size_t>(rows * kRank));
        for (size_t i = 0; i < got_out.size(); ++i) {
          ASSERT_EQ(got_out[i], want_out[i]) << "request " << b << " element " << i;
        }
        for (size_t i = 0; i < got_lse.size(); ++i) {
          ASSERT_EQ(got_lse[i], want_lse[i]) << "request " << b << " row " << i;
        }
      }
      // One value for all requests (stride 0), the other scale from the host float.
      Case host = c;
      host.q_scale = q_scales[1];
      const Outputs one = run_emulated(c, in, sched, {{q_scales + 1, 0}, {}});
      const Outputs want = run_emulated(host, in, sched);
      const std::vector<double> a = test::to_doubles(one.out), w = test::to_doubles(want.out);
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], w[i]) << "one value, element " << i;
    }
  }
}

TEST(MlaDecodeEmulated, BadScaleTensorValueGivesNanRowsOfItsRequest) {
  const Case c = fp8_case({90, 40, 33}, 16);
  auto rng = test::make_rng(820);
  const HostInputs in = make_inputs(c, rng);
  const Expected ref = reference(c, in.q_kernel, in.k_kernel);
  const int64_t row = c.s_q * c.heads;
  for (float bad : {std::nanf(""), 0.0f, -1.0f, std::numeric_limits<float>::infinity()}) {
    const float q_scales[] = {c.q_scale, bad, c.q_scale};
    const float k_scales[] = {c.k_scale, c.k_scale, bad};
    for (int which = 0; which < 2; ++which) {  // request 1's q_scale, request 2's k_scale
      SCOPED_TRACE(testing::Message() << "bad " << bad << (which ? " k_scale" : " q_scale"));
      const Outputs o = run_emulated(
          c, in, {2},
          which == 0 ? ScaleTensors{{q_scales, 1}, {}} : ScaleTensors{{}, {k_scales, 1}});
      EXPECT_EQ(o.error_word, uint32_t{cuda::kDecodeBadScale});
      const int64_t nan_request = which == 0 ? 1 : 2;
      const std::vector<double> out = test::to_doubles(o.out), lse = test::to_doubles(o.lse);
      for (int64_t i = nan_request * row * kRank; i < (nan_request + 1) * row * kRank; ++i) {
        ASSERT_TRUE(std::isnan(out[i])) << i;
      }
      for (int64_t i = nan_request * row; i < (nan_request + 1) * row; ++i) {
        ASSERT_TRUE(std::isnan(lse[i])) << i;
      }
      const std::vector<double> want(ref.out.begin(), ref.out.begin() + row * kRank);
      EXPECT_TRUE(test::all_close(o.out.narrow(0, 0, 1), want, out_tolerance(c)));
    }
  }
}

}  // namespace
}  // namespace mlakit
