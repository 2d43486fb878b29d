// Compile-time choices of the sm90 prefill kernel (mma.sync m16n8k16, FlashAttention-2 schedule)
// and the shared-memory plan whose sizeof is the dynamic shared memory of a block.
#pragma once

#include <cstdint>

namespace mlakit::cuda::prefill {

// Head sizes of the up-projected MLA prefill (DeepSeek V2/V3, Kimi K2): the kernel is written for
// these; other sizes are rejected on the host with kUnsupported.
constexpr int kNope = 128;                 // k_nope width P
constexpr int kRope = 64;                  // k_pe width R (one key shared by all heads)
constexpr int kHeadDimQK = kNope + kRope;  // 192: Q and K row width
constexpr int kHeadDimV = 128;             // V and out row width
constexpr int kWarpSize = 32;
// Query rows of a block: 4 warps of 16 rows (one m16 MMA row block each). 64 rather than 128
// keeps the shared memory at ~109 KiB so two blocks share an SM (one block's softmax hides the
// other's tensor-core work) and halves the wasted triangle on the causal diagonal.
constexpr int kBlockM = 64;
constexpr int kWarps = kBlockM / 16;          // 16 = rows of one m16n8k16 MMA
constexpr int kThreads = kWarps * kWarpSize;  // 128
// Keys per inner step: S = 16 x 64 per warp is 32 f32 registers, beside the 64 of the output
// accumulator (16 x 128); 128 keys would push the kernel past 200 registers.
constexpr int kBlockN = 64;
// K/V tiles in flight: the next tile is copied (cp.async) while the current one is computed.
constexpr int kStages = 2;
// Blocks per SM asked of the compiler: caps registers at 65536 / (2 * 128) = 256 per thread.
constexpr int kMinBlocksPerSm = 2;
// Elements of one 16-byte copy (cp.async / vector load) of 16-bit data.
constexpr int kChunk = 8;
// Row padding of every shared tile, in elements: 16 bytes, so consecutive rows start 16 bytes
// apart modulo 128 and the 8 row addresses of an ldmatrix hit 8 different bank groups.
constexpr int kPad = 8;
constexpr int kQKRowElems = kHeadDimQK + kPad;  // 200 elements = 400 bytes (400 % 128 = 16)
constexpr int kVRowElems = kHeadDimV + kPad;    // 136 elements = 272 bytes (272 % 128 = 16)

// 16-bit elements of q, k and v are moved as raw uint16_t (f16 and bf16 alike).
struct SharedStorage {
  uint16_t q[kBlockM][kQKRowElems];           // Q tile, loaded once
  uint16_t k[kStages][kBlockN][kQKRowElems];  // [k_nope | k_pe] per key
  uint16_t v[kStages][kBlockN][kVRowElems];
};

static_assert(kBlockM % 16 == 0 && kBlockN % 16 == 0, "MMA tiles are 16 rows / 16 keys");
static_assert(kNope % kChunk == 0 && kRope % kChunk == 0 && kHeadDimV % kChunk == 0,
              "rows are copied in 16-byte chunks");
static_assert(kHeadDimQK % 16 == 0 && kHeadDimV % 16 == 0, "MMA k-steps of 16");
static_assert((kQKRowElems * 2) % 16 == 0 && (kVRowElems * 2) % 16 == 0,
              "ldmatrix / cp.async need 16-byte aligned rows");
// 2 blocks per SM: 228 KiB per SM, 1 KiB reserved per block.
static_assert(kMinBlocksPerSm * (sizeof(SharedStorage) + 1024) <= 228 * 1024,
              "two blocks must fit one SM's shared memory");

}  // namespace mlakit::cuda::prefill
