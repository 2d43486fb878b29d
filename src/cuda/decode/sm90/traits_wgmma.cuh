// Compile-time shape of the sm90 wgmma decode kernel (kernel_wgmma.cuh): 64 query rows per CTA over
// a native 16-bit or an fp8_e4m3 cache. Plain constants and offsets; the CuTe layouts that describe
// the same memory to the tensor cores are in kernel_wgmma.cuh.
#pragma once

#include <cstdint>

#include "cuda/decode/sm90/params.cuh"
#include "cuda/decode/sm90/traits.cuh"

namespace mlakit::cuda::decode_sm90 {

// wgmma operand tiles are stored K-major with the 128-byte swizzle (CuTe's Layout_K_SW128_Atom):
// a tile of `kRows` rows x 576 16-bit columns is 9 column blocks of 64 columns (128 bytes); block
// b is [kRows][128 B] at b * kRows * 128, and within each group of 8 rows (1024 bytes, 1024-byte
// aligned) 16-byte chunk c of row r sits at chunk c ^ (r % 8). wgmma's shared-memory descriptors
// read exactly this layout.
inline constexpr int kSwizzleBytes = 128;  // the swizzle span: one row of a column block
inline constexpr int kChunksPerSwizzle = kSwizzleBytes / 16;
inline constexpr int kSwizzleRows = 8;  // rows of one swizzle pattern (1024 bytes)

template <int kRows>
__host__ __device__ constexpr uint32_t sw128_k_offset(int row, int chunk) {
  const int block = chunk / kChunksPerSwizzle, in_block = chunk % kChunksPerSwizzle;
  return static_cast<uint32_t>(block * kRows * kSwizzleBytes + row * kSwizzleBytes +
                               ((in_block ^ (row % kSwizzleRows)) << 4));
}

// Warpgroup roles of the wgmma kernel (kernel_wgmma.cuh).
inline constexpr int kScoreWarpgroup = 0;    // S = q K^T, softmax, P; O columns [0, 256)
inline constexpr int kCopyWarpgroup = 1;     // the TMA copies (one thread); O columns [256, 512)
inline constexpr int kConvertWarpgroup = 2;  // fp8 caches: raw tiles -> 16-bit tiles in place
inline constexpr int kWarpgroupThreads = 128;

template <class Element_, CacheFormat kFormat_ = CacheFormat::kNative>
struct WgmmaConfig {
  using Element = Element_;  // Bf16Mma or F16Mma
  static constexpr int kBlockM = static_cast<int>(kDecodeRowsLarge);
  static constexpr int kWarpgroups = kThreads / kWarpgroupThreads;  // 2 MMA warpgroups
  // O += P V: warpgroup g owns V columns [256 g, 256 g + 256) (wgmma m64n256k16, the widest N).
  static constexpr int kColsPerWarpgroup = kDimV / kWarpgroups;
  static constexpr bool kRawE4m3 = false;  // q tile of 16-bit units, dims in order
  static constexpr CacheFormat kFormat = kFormat_;
  // fp8_e4m3: TMA lands a tile's raw e4m3 bytes in the upper half of its stage, and a third
  // warpgroup converts them in place, column block by column block, into the 16-bit operand tile
  // the native kernel reads (section "fp8_e4m3 tiles" of docs/kernels/decode_sm90.md).
  static constexpr bool kConvert = kFormat == CacheFormat::kFp8E4m3;
  static constexpr int kLaunchThreads = kThreads + (kConvert ? kWarpgroupThreads : 0);

  // Two stages of 72 KiB next to the 72 KiB q tile fill shared memory: the copy warpgroup refills
  // a stage as soon as both warpgroups are done with its tile, two tiles ahead of the scores.
  static constexpr int kStages = 2;

  // ---- Shared memory plan (byte offsets; operand tiles 1024-byte aligned for the swizzle).
  static constexpr int kQBytes = kBlockM * kRowBytes;  // 72 KiB, [64][576] SW128
  // P of a tile is written over its stage's rope columns (576 - 512 = 64 columns, the ninth
  // 128-byte column block: exactly a [64][64] SW128 tile), which only the scores read.
  static constexpr int kPInStageOffset = kDimV * 2 / kSwizzleBytes * kBlockN * kSwizzleBytes;
  static constexpr int kRowStatBytes = kBlockM * 4;  // f32 [64]
  static constexpr int kStageOffset = 0;             // [kStages][64][576] SW128
  static constexpr int kQOffset = kStageOffset + kStages * kTileBytes;
  // f32 [kStages][64]: O's rescale per row for the tile in each stage
  static constexpr int kAlphaOffset = kQOffset + kQBytes;
  static constexpr int kRowSumOffset = kAlphaOffset + kStages * kRowStatBytes;  // f32 [64]
  static constexpr int kRowMaxOffset = kRowSumOffset + kRowStatBytes;           // f32 [64]
  // One mbarrier per (stage, 128-byte column block), 8 bytes each, [kStages][kColumnBlocks]: its
  // phase completes when that column block of the stage's tile has landed, so the scores' MMAs
  // of a block start while the tile's later blocks are still on their way.
  static constexpr int kColumnBlocks = kRowBytes / kSwizzleBytes;  // 9: 8 of values, 1 of rope
  static constexpr int kFullBarrierOffset = kRowMaxOffset + kRowStatBytes;
  // A segment's rows are staged before their bulk stores in the destination's dtype, [64 rows]
  // [staged_row_bytes(value bytes)]: f32 over the (then idle) stages, 16-bit over the q tile.
  // Each row is padded by 8 values so that the 8 rows a warp's stores cover at once fall in
  // distinct bank slots (one wavefront per 128-byte store, two per 256-byte one: the minimum).
  __host__ __device__ static constexpr int staged_row_bytes(int value_bytes) {
    return (kDimV + 8) * value_bytes;
  }
  // The kernel rounds the dynamic shared-memory base up to the 1024-byte swizzle alignment (the
  // hardware swizzles by absolute address bits), which may skip up to this much.
  static constexpr int kBaseAlignment = 1024;
  // The q tile's mbarrier (8 bytes): its phase completes when a segment's q tile has landed
  // (q loaded by TMA, DecodeKernelParams::q_by_tma).
  static constexpr int kQBarrierOffset = kFullBarrierOffset + kStages * kColumnBlocks * 8;
  // fp8 caches: one more mbarrier per (stage, column block), [kStages][kColumnBlocks]: its phase
  // completes when the converting warpgroup's 128 threads have written that block's 16-bit values.
  static constexpr int kConvertedBarrierOffset = kQBarrierOffset + 8;
  static constexpr int kSmemBytes =
      kConvertedBarrierOffset + (kConvert ? kStages * kColumnBlocks * 8 : 0) + kBaseAlignment;

  // ---- fp8 tiles: raw column block b (64 keys x 64 e4m3 bytes, rows of 64 bytes, unswizzled) lies
  // at kRawOffsetInStage + b * kRawBlockBytes of the stage, the stage's last 36 KiB; its 16-bit
  // column block b (8 KiB) is written at b * kBlockN * kSwizzleBytes, over raw blocks 2b - 8 and
  // 2b - 7 (b >= 4). The convert warpgroup works in phases separated by its own barrier: raw block
  // b is read in phase raw_read_phase(b) (into registers when it is written later) and its 16-bit
  // block written in phase converted_write_phase(b), always after every raw block it overwrites
  // was read by every thread (conversion_schedule_is_safe). Phase 0 streams blocks 0-3, which
  // overwrite nothing, and reads 4 and 5; phase 1 writes 4, 5 and reads 6, 7; phase 2 writes 6,
  // 7 and reads 8; phase 3 writes 8: 3 barriers and 4 fence-and-arrive rounds per tile instead of
  // 5 and 9 block by block (which left ~0.9 us of conversion latency per tile on the critical
  // path: docs/perf-notes.md item 15).
  static constexpr int kRawBlockBytes = kBlockN * kSwizzleBytes / 2;                     // 4 KiB
  static constexpr int kConvertedBlockBytes = kBlockN * kSwizzleBytes;                   // 8 KiB
  static constexpr int kRawOffsetInStage = kTileBytes - kColumnBlocks * kRawBlockBytes;  // 36 KiB
  static constexpr int kConvertPhases = 4;
  static constexpr int kHeldBlocks = 2;  // raw blocks a thread holds in registers at once
  __host__ __device__ static constexpr int raw_read_phase(int block) {
    return block < 6 ? 0 : block < 8 ? 1 : 2;
  }
  __host__ __device__ static constexpr int converted_write_phase(int block) {
    return block < 4 ? 0 : block < 6 ? 1 : block < 8 ? 2 : 3;
  }
  // The register slot of a raw block held from its read phase to its write phase.
  __host__ __device__ static constexpr int held_slot(int block) { return block % kHeldBlocks; }
  // Where TMA lands column block b of a tile in its stage, and the bytes a key takes there: the
  // operand block itself (native) or the raw block (fp8).
  static constexpr int kLandedOffsetInStage = kConvert ? kRawOffsetInStage : 0;
  static constexpr int kLandedKeyBytes = kConvert ? kSwizzleBytes / 2 : kSwizzleBytes;
  // fp8: the launch gives each of the 384 threads 65536 / 384 -> 168 registers; the converting
  // warpgroup needs few (two held raw blocks, one in flight, 32-bit shared addresses: with 64-bit
  // generic pointers it spilled even at 88), so it gives them back and the MMA warpgroups, which
  // hold O (128 f32 each), take 232 (2 x 232 + 40 = 3 x 168; ptxas: no spills, where 245 serve
  // the native kernel's 256 threads).
  static constexpr int kConvertRegisters = 40;
  static constexpr int kMmaRegisters = 232;

  // Byte offset of 16-byte chunk `chunk` of row `row` in the q tile or a K tile (both 64 rows).
  __host__ __device__ static constexpr uint32_t operand_offset(int row, int chunk) {
    return sw128_k_offset<kBlockM>(row, chunk);
  }

  static_assert(kWarpgroups == 2, "one score and one copy warpgroup");
  static_assert(kBlockM == kBlockN, "q and K tiles share one operand layout (64 rows)");
  static_assert(kBlockM == kDecodeRowsLarge, "tile_shape.hpp's 64-row CTA");
  static_assert(kRowBytes % kSwizzleBytes == 0 && kBlockN * 2 == kSwizzleBytes,
                "576 columns are whole swizzle blocks; a P row (64 keys) is exactly one");
  static_assert(kPInStageOffset + kBlockM * kSwizzleBytes == kTileBytes,
                "P takes exactly the stage's last column block (the rope)");
  static_assert(kTileBytes % kBaseAlignment == 0 && kQOffset % kBaseAlignment == 0 &&
                    kPInStageOffset % kBaseAlignment == 0,
                "SW128 operand tiles start on 1024-byte boundaries");
  static_assert(kSmemBytes <= kSmemLimit, "shared-memory plan exceeds 227 KiB");
  static_assert(kBlockM * staged_row_bytes(4) <= kStages * kTileBytes &&
                    kBlockM * staged_row_bytes(2) <= kQBytes && staged_row_bytes(2) % 16 == 0,
                "f32 staged rows fit the stages, 16-bit ones the q tile, rows 16-byte aligned for "
                "bulk stores");
  static_assert(kFormat == CacheFormat::kNative || kFormat == CacheFormat::kFp8E4m3,
                "the wgmma kernel reads native and fp8_e4m3 caches");
  // Every 16-bit block is written in a later phase than every raw block it overlaps is read (so
  // after the barrier that ends that phase), no block is written before it is read, and the raw
  // blocks held in registers at once use distinct slots.
  static constexpr bool conversion_schedule_is_safe() {
    for (int b = 0; b < kColumnBlocks; ++b) {
      if (raw_read_phase(b) > converted_write_phase(b)) return false;
      const int begin = b * kConvertedBlockBytes, end = begin + kConvertedBlockBytes;
      for (int r = 0; r < kColumnBlocks; ++r) {
        const int raw_begin = kRawOffsetInStage + r * kRawBlockBytes;
        const bool overlap = begin < raw_begin + kRawBlockBytes && raw_begin < end;
        if (overlap && raw_read_phase(r) >= converted_write_phase(b)) return false;
        const bool both_held = r != b && raw_read_phase(r) < converted_write_phase(r) &&
                               raw_read_phase(b) < converted_write_phase(b) &&
                               raw_read_phase(r) < converted_write_phase(b) &&
                               raw_read_phase(b) < converted_write_phase(r);
        if (both_held && held_slot(r) == held_slot(b)) return false;
      }
      if (converted_write_phase(b) >= kConvertPhases) return false;
    }
    return true;
  }
  static_assert(conversion_schedule_is_safe(),
                "the in-place conversion never overwrites raw bytes before every thread read them");
  static_assert(!kConvert ||
                    kWarpgroups * kMmaRegisters + kConvertRegisters <=
                        kLaunchThreads / kWarpgroupThreads * (65536 / kLaunchThreads / 8 * 8),
                "setmaxnreg: the warpgroups' registers fit the launch's pool");
  static_assert(kRawOffsetInStage % 1024 == 0 && kRawBlockBytes % 128 == 0,
                "raw TMA boxes land on 128-byte boundaries");
};

}  // namespace mlakit::cuda::decode_sm90
