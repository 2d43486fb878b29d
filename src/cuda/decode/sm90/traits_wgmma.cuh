// Compile-time shape of the sm90 wgmma decode kernel (kernel_wgmma.cuh): 64 query rows per CTA over
// a native 16-bit, an fp8_e4m3 or an fp8_ds_mla cache. Plain constants and offsets; the CuTe
// layouts that describe the same memory to the tensor cores are in kernel_wgmma.cuh.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "cuda/decode/sm90/cache_tensor_map.hpp"
#include "cuda/decode/sm90/params.cuh"
#include "cuda/decode/sm90/traits.cuh"
#include "mlakit/kv_cache.hpp"

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
  static constexpr bool kRawE4m3 = false;   // q tile of 16-bit units, dims in order
  static constexpr bool kRawDsMla = false;  // (the 16-row raw fp8_ds_mla path is mma.sync only)
  static constexpr bool kRawQ16 = false;    // (so is a 16-bit q over raw tiles)
  static constexpr CacheFormat kFormat = kFormat_;
  // fp8 caches: TMA lands a tile's raw e4m3 bytes in the upper part of its stage, and a third
  // warpgroup converts them in place, column block by column block, into the 16-bit operand tile
  // the native kernel reads (sections "fp8_e4m3 tiles" and "fp8_ds_mla tiles" of
  // docs/kernels/decode_sm90.md).
  static constexpr bool kConvert =
      kFormat == CacheFormat::kFp8E4m3 || kFormat == CacheFormat::kFp8DsMla;
  // fp8_ds_mla: the 512 NoPE values are e4m3 with one f32 scale per 128 values and key (converted
  // as e4m3 * scale rounded to E, as kernel.cuh's convert_tile does), the 64 rope values are stored
  // in E already: TMA lands them directly in the operand tile's ninth column block, unconverted.
  static constexpr bool kScaledTiles = kFormat == CacheFormat::kFp8DsMla;
  static constexpr int kLaunchThreads = kThreads + (kConvert ? kWarpgroupThreads : 0);
  // The cache's TMA maps (cache_tensor_map.hpp): one for native and fp8_e4m3 entries; NoPE bytes,
  // scales and rope values for fp8_ds_mla.
  using CacheMaps = std::conditional_t<kScaledTiles, DsMlaTensorMaps, CUtensorMap>;

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
  // fp8_ds_mla: the tile scales of the tile in each stage, f32 [kStages][64 keys][4] (a key's
  // entry bytes 512..527 as stored, one scale per 128 NoPE values), landed by one TMA box per page
  // beside the stage's raw blocks (the stage itself has no room left: see kRawOffsetInStage).
  static constexpr int kScalesPerKey = static_cast<int>(kDsMlaNumTiles);  // 4
  static constexpr int kScaleKeyBytes =                                   // 16: 4 f32
      kScaledTiles ? kScalesPerKey * static_cast<int>(sizeof(float)) : 0;
  // Column blocks (64 values) one scale covers (128 values): block b's scale is b / 2.
  static constexpr int kBlocksPerScale = static_cast<int>(kDsMlaTileSize) / (kSwizzleBytes / 2);
  static constexpr int kScaleStageBytes = kBlockN * kScaleKeyBytes;  // 1 KiB
  static constexpr int kScaleOffset = kRowMaxOffset + kRowStatBytes;
  // One mbarrier per (stage, 128-byte column block), 8 bytes each, [kStages][kColumnBlocks]: its
  // phase completes when that column block of the stage's tile has landed, so the scores' MMAs
  // of a block start while the tile's later blocks are still on their way (fp8_ds_mla: block 0's
  // also counts the tile's scales, which every converted block needs and block 0 is read first).
  static constexpr int kColumnBlocks = kRowBytes / kSwizzleBytes;  // 9: 8 of values, 1 of rope
  static constexpr int kFullBarrierOffset = kScaleOffset + kStages * kScaleStageBytes;
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
  // completes when the converting warpgroup's 128 threads have written that block's 16-bit values
  // (fp8_ds_mla: blocks 0-7; its rope block 8 lands in E, and the scores wait for its TMA
  // mbarrier).
  static constexpr int kConvertedBarrierOffset = kQBarrierOffset + 8;
  static constexpr int kSmemBytes =
      kConvertedBarrierOffset + (kConvert ? kStages * kColumnBlocks * 8 : 0) + kBaseAlignment;

  // ---- fp8 tiles: the convert warpgroup writes the 16-bit column blocks [0, kConvertedBlocks) (8
  // KiB each, block b at b * kBlockN * kSwizzleBytes) from raw column blocks of 64 keys x 64 e4m3
  // bytes (rows of 64 bytes, unswizzled, 4 KiB) that TMA lands at kRawOffsetInStage + 4 KiB * b,
  // i.e. so that the raw blocks end where the converted ones do: fp8_e4m3 converts all 9 blocks
  // (raw in the stage's last 36 KiB, [36, 72) KiB), fp8_ds_mla the 8 NoPE blocks (raw in [32, 64)
  // KiB; its rope block [64, 72) KiB lands in E by TMA and is never overwritten). The 16-bit block
  // b >= 4 overwrites the raw blocks 2b - 9 and 2b - 8 (fp8_e4m3) or 2b - 8 and 2b - 7
  // (fp8_ds_mla), so the convert warpgroup works in phases separated by its own barrier: raw block
  // b is read in phase raw_read_phase(b) (into registers when it is written later) and its 16-bit
  // block written in phase converted_write_phase(b), always after every raw block it overwrites was
  // read by every thread (conversion_schedule_is_safe). Phase 0 streams blocks 0-3, which overwrite
  // nothing, and reads 4 and 5; phase 1 writes 4, 5 and reads 6, 7; phase 2 writes 6, 7 (and
  // fp8_e4m3 reads 8; phase 3 writes 8): 3 barriers and 4 fence-and-arrive rounds per tile (2 and 3
  // for fp8_ds_mla) instead of 5 and 9 block by block (which left ~0.9 us of conversion latency per
  // tile on the critical path: docs/perf-notes.md item 15).
  static constexpr int kRawBlockBytes = kBlockN * kSwizzleBytes / 2;    // 4 KiB
  static constexpr int kConvertedBlockBytes = kBlockN * kSwizzleBytes;  // 8 KiB
  // Column blocks the convert warpgroup writes: none (native), all 9 (fp8_e4m3), the 8 NoPE ones.
  static constexpr int kConvertedBlocks = !kConvert      ? 0
                                          : kScaledTiles ? kDimV * 2 / kSwizzleBytes
                                                         : kColumnBlocks;
  static constexpr int kRawOffsetInStage =  // fp8_e4m3 36 KiB, fp8_ds_mla 32 KiB
      kConvertedBlocks * (kConvertedBlockBytes - kRawBlockBytes);
  // Phases of the conversion: the last writes the last block (fp8_e4m3 4, fp8_ds_mla 3).
  static constexpr int kConvertPhases = kConvertedBlocks > 8 ? 4 : 3;
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
  // operand block itself (native; fp8_ds_mla's rope block) or the raw block (fp8).
  __host__ __device__ static constexpr int landed_key_bytes(int block) {
    return block < kConvertedBlocks ? kSwizzleBytes / 2 : kSwizzleBytes;
  }
  __host__ __device__ static constexpr int landed_block_offset(int block) {
    return block < kConvertedBlocks ? kRawOffsetInStage + block * kRawBlockBytes
                                    : block * kConvertedBlockBytes;
  }
  // The same offset in rows of the block's landed keys (landed_key_bytes(b) each).
  __host__ __device__ static constexpr int landed_block_row(int block) {
    return landed_block_offset(block) / landed_key_bytes(block);
  }
  // The cache column (in the map's elements) of column block b's box: 64 values per block (e4m3
  // bytes or 16-bit values); fp8_ds_mla's rope map starts at the rope values, its NoPE map at 0.
  __host__ __device__ static constexpr int landed_block_column(int block) {
    return (kScaledTiles && block >= kConvertedBlocks ? 0 : block) * (kSwizzleBytes / 2);
  }
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
  // Every 16-bit block is written in a later phase than every raw block it overlaps is read (so
  // after the barrier that ends that phase), no block is written before it is read, the raw
  // blocks held in registers at once use distinct slots, and the raw blocks stay clear of the
  // blocks TMA lands unconverted (fp8_ds_mla's rope, where P goes later).
  static constexpr bool conversion_schedule_is_safe() {
    if (kRawOffsetInStage + kConvertedBlocks * kRawBlockBytes >
        kConvertedBlocks * kConvertedBlockBytes) {
      return false;
    }
    for (int b = 0; b < kConvertedBlocks; ++b) {
      if (raw_read_phase(b) > converted_write_phase(b)) return false;
      const int begin = b * kConvertedBlockBytes, end = begin + kConvertedBlockBytes;
      for (int r = 0; r < kConvertedBlocks; ++r) {
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
  static constexpr bool landed_rows_are_whole() {
    for (int b = 0; b < kColumnBlocks; ++b) {
      if (landed_block_offset(b) % landed_key_bytes(b) != 0) return false;
    }
    return true;
  }
  static_assert(landed_rows_are_whole(), "landed_block_row is exact");
  static_assert(!kScaledTiles || (kConvertedBlocks == kColumnBlocks - 1 &&
                                  landed_block_offset(kConvertedBlocks) == kPInStageOffset),
                "fp8_ds_mla: the rope block (P's block later) lands in E, after the 8 NoPE ones");
  static_assert(!kScaledTiles || (kScaleKeyBytes == kDsMlaRopeOffset - kDsMlaScaleOffset &&
                                  kScalesPerKey * kDsMlaTileSize == kDimV &&
                                  kConvertedBlocks * kSwizzleBytes / 2 == kDsMlaNopeBytes),
                "fp8_ds_mla entries: 512 NoPE bytes, then 4 f32 scales of 128 values each");
  // TMA writes shared memory at 128-byte aligned addresses; the smallest scale box (block size 8)
  // is 8 keys x 16 bytes = 128 bytes, so every page's box of the scale ring starts aligned.
  static_assert(kScaleOffset % 128 == 0 && kScaleStageBytes % 128 == 0 &&
                    kMinBoxSlots * kScaleKeyBytes % 128 == 0,
                "scale boxes land on 128-byte boundaries");
};

}  // namespace mlakit::cuda::decode_sm90
