// Compile-time shape of the sm90 decode kernel: tiles, warp layout, copy mapping, pipeline depth
// and the shared-memory plan. One Config per (query rows per CTA, cache format, MMA element type).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/decode/sm90/params.cuh"
#include "cuda/decode/tile_shape.hpp"

namespace mlakit::cuda::decode_sm90 {

struct RawE4m3Mma;     // ptx.cuh: f16 MMAs over raw fp8_e4m3 tiles (an fp8 q)
struct RawE4m3Q16Mma;  // ptx.cuh: the same for a 16-bit q (16 rows)
template <class Rope>
struct RawDsMlaMma;  // ptx.cuh: f16 MMAs over raw fp8_ds_mla tiles (a 16-bit q, 16 rows)
template <class E>
inline constexpr bool kIsRawDsMla = false;
template <class Rope>
inline constexpr bool kIsRawDsMla<RawDsMlaMma<Rope>> = true;

inline constexpr int kDimQK = 576;  // L + R = 512 + 64: the q / K width (the only one supported)
inline constexpr int kDimV = 512;   // L: the V width (V = K[:, 0:512])
inline constexpr int kWarps = 8;    // 8 warps x 64 output columns cover V's 512 columns
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kBlockN = static_cast<int>(kDecodeKeyTile);  // keys per tile (tile_shape.hpp)
inline constexpr int kRowBytes = kDimQK * 2;                      // 1152: one 16-bit q or K row
inline constexpr int kRowChunks = kRowBytes / 16;                 // 72 16-byte chunks per row
inline constexpr int kTileBytes = kBlockN * kRowBytes;            // 73,728: one 16-bit K/V tile
inline constexpr int kPRowBytes = kBlockN * 2;  // 128: one row of P (64 keys, 16-bit)
// sm_90's opt-in dynamic shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin, 227
// KiB).
inline constexpr int kSmemLimit = 232448;
// Deepest copy pipeline: 3 tiles in flight already cover the ~1.5 us of HBM latency at a 1/132
// share of the bandwidth; deeper only costs shared memory.
inline constexpr int kMaxStages = 4;

constexpr int align128(int bytes) { return (bytes + 127) / 128 * 128; }

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile whose rows are `kRowBytes` long (a
// multiple of 128). Chunks are XOR-permuted inside each 128-byte group by row % 8, so the 8 rows
// that one ldmatrix phase reads (same logical chunk, 8 consecutive rows) fall into 8 different
// groups of 4 banks: conflict-free without padding.
template <int kRowBytes>
__host__ __device__ constexpr uint32_t swizzled(int row, int chunk) {
  static_assert(kRowBytes % 128 == 0, "swizzled rows must be whole 128-byte groups");
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// Byte offset of 16-byte chunk `chunk` of key `row` in a tile of raw e4m3 rows (576 bytes, 36
// chunks: not whole 128-byte groups). Chunks are XOR-permuted within aligned groups of 4 by
// (row / 2) % 4: an ldmatrix phase (same chunk of 8 consecutive rows) then meets 8 different
// 16-byte bank groups, since odd rows start half a 128-byte line (4 chunks) later.
__host__ __device__ constexpr uint32_t e4m3_swizzled(int row, int chunk) {
  return static_cast<uint32_t>(row * kDimQK + ((chunk ^ ((row >> 1) & 3)) << 4));
}

template <CacheFormat F>
inline constexpr int kRawEntryBytes = 0;
template <>
inline constexpr int kRawEntryBytes<CacheFormat::kNative> = kRowBytes;  // 576 x 16-bit
template <>
inline constexpr int kRawEntryBytes<CacheFormat::kFp8E4m3> = kDimQK;  // 576 x e4m3
template <>  // 512 e4m3 + 4 f32 tile scales + 64 x 16-bit rope (kv_cache.hpp)
inline constexpr int kRawEntryBytes<CacheFormat::kFp8DsMla> = 656;

// Copy of one key tile by all kThreads threads: kThreadsPerKey threads copy one entry, 16 bytes
// each per step, so a warp reads 4 (bf16) or 8 (fp8) entries with 128- or 64-byte contiguous runs.
// Shared by the mma.sync (Config) and wgmma (WgmmaConfig, traits_wgmma.cuh) kernels.
template <CacheFormat kFormat_>
struct TileCopy {
  static constexpr CacheFormat kFormat = kFormat_;
  static constexpr bool kConvert = kFormat != CacheFormat::kNative;
  static constexpr int kRawEntry = kRawEntryBytes<kFormat>;
  static constexpr int kRawTileBytes = kBlockN * kRawEntry;
  static constexpr int kRawChunks = kRawEntry / 16;  // 72, 36, 41
  static constexpr int kThreadsPerKey = kRawChunks >= 64 ? 8 : 4;
  static constexpr int kKeysPerPass = kThreads / kThreadsPerKey;
  static constexpr int kLoadPasses = kBlockN / kKeysPerPass;  // keys (page lookups) per thread
  static constexpr int kChunkSteps = (kRawChunks + kThreadsPerKey - 1) / kThreadsPerKey;
};

template <int kBlockM_, CacheFormat kFormat_, class Element_>
struct Config : TileCopy<kFormat_> {
  using Copy = TileCopy<kFormat_>;
  using Copy::kFormat;
  using Copy::kRawEntry;
  using Copy::kRawTileBytes;
  using Element = Element_;                 // Bf16Mma, F16Mma or RawE4m3Mma
  static constexpr int kBlockM = kBlockM_;  // query rows per CTA
  // An fp8 q over an fp8_e4m3 cache (kernel_e4m3.cuh): the raw tile is read in place and each warp
  // converts the K and V fragments it loads in registers; no tile is converted in shared memory.
  // A 16-bit q takes this path too with 16 rows (RawE4m3Q16Mma), prepared per row (kRawQ16).
  static constexpr bool kRawE4m3 =
      std::is_same_v<Element, RawE4m3Mma> || std::is_same_v<Element, RawE4m3Q16Mma>;
  // A 16-bit q over an fp8_ds_mla cache with 16 rows (kernel_ds_mla.cuh): the raw tile read in
  // place likewise, its scales applied to the scores and to P.
  static constexpr bool kRawDsMla = kIsRawDsMla<Element>;
  // A 16-bit q over raw tiles (either fp8 format, 16 rows): staged as fetched, then its raw-order
  // dims become f16 times a per-row power of two (prepare_raw_q, kernel_e4m3.cuh).
  static constexpr bool kRawQ16 = kRawDsMla || std::is_same_v<Element, RawE4m3Q16Mma>;
  static constexpr bool kConvert = Copy::kConvert && !kRawE4m3 && !kRawDsMla;  // a pass per tile
  // Raw fp8_ds_mla stages hold the entries as global memory does (656-byte rows, no swizzle), so a
  // run of a page's consecutive slots lands in one bulk copy instead of 41 16-byte cp.async per
  // entry; each ring stage's bulk copies complete on its own mbarrier (kernel_common.cuh).
  static constexpr bool kBulkCopies = kRawDsMla;
  // With 16 rows every warp needs all of q for its scores; holding q's 36 A fragments in registers
  // (144 per thread) saves re-reading 18 KiB of shared memory per warp per tile. With 64 rows the
  // O accumulator takes 128 registers per thread and q stays in shared memory.
  static constexpr bool kQInRegisters = kBlockM == 16;

  // ---- S = q K^T: warp (row group, key group) computes 16 rows x kKeysPerWarp keys over all 576.
  static constexpr int kRowGroups = kBlockM / 16;
  static constexpr int kKeyGroups = kWarps / kRowGroups;  // warps sharing one row group
  static constexpr int kKeysPerWarp = kBlockN / kKeyGroups;
  static constexpr int kScoreTiles = kKeysPerWarp / 8;  // n8 MMA tiles per warp
  // One n8 tile is a chain of 36 dependent MMAs; two accumulators (even / odd k) halve its latency.
  // Raw e4m3 tiles put a conversion before each MMA of the chain: four accumulators (k step mod 4)
  // keep four chains in flight.
  // Raw fp8_ds_mla tiles: one chain per 128-dim scale group (scaled after the MMAs) and the rope's.
  static constexpr int kScoreChains = kScoreTiles > 1 ? 1 : kRawDsMla ? 5 : kRawE4m3 ? 4 : 2;

  // ---- O += P V: warp w owns columns [64 w, 64 w + 64) of all kBlockM rows, so V is read once.
  static constexpr int kColsPerWarp = kDimV / kWarps;  // 64
  static constexpr int kColTiles = kColsPerWarp / 8;   // 8 n8 tiles
  static constexpr int kRowTiles = kBlockM / 16;       // m16 tiles

  // ---- Shared memory plan (byte offsets; every region 128-byte aligned).
  static constexpr int kConvBytes = kConvert ? kTileBytes : 0;  // converted 16-bit tile
  static constexpr int kQBytes = kQInRegisters ? 0 : kBlockM * kRowBytes;
  static constexpr int kPBytes = kBlockM * kPRowBytes;
  static constexpr int kRowStatBytes = align128(kBlockM * 4);
  static constexpr int kKeyGroupStatBytes = align128(kKeyGroups * kBlockM * 4);
  // One 8-byte mbarrier per ring stage (at most kMaxStages), in a 128-byte region.
  static constexpr int kBarrierBytes = kBulkCopies ? 128 : 0;
  static constexpr int kFixedBytes =
      kConvBytes + kQBytes + kPBytes + 2 * kKeyGroupStatBytes + 2 * kRowStatBytes + kBarrierBytes;
  static constexpr int kStages =
      std::min(kMaxStages, (kSmemLimit - kFixedBytes) / align128(kRawTileBytes));

  static constexpr int kRawOffset = 0;  // [kStages][kRawTileBytes]
  static constexpr int kConvOffset = kRawOffset + kStages * align128(kRawTileBytes);
  static constexpr int kQOffset = kConvOffset + kConvBytes;  // [kBlockM][1152] swizzled
  static constexpr int kPOffset = kQOffset + kQBytes;        // [kBlockM][128] swizzled
  static constexpr int kRowMaxOffset = kPOffset + kPBytes;   // f32 [kKeyGroups][kBlockM]
  static constexpr int kRowSumOffset = kRowMaxOffset + kKeyGroupStatBytes;  // same shape
  static constexpr int kAlphaOffset = kRowSumOffset + kKeyGroupStatBytes;   // f32 [kBlockM]
  static constexpr int kMaxFinalOffset = kAlphaOffset + kRowStatBytes;      // f32 [kBlockM]
  static constexpr int kBarrierOffset = kMaxFinalOffset + kRowStatBytes;    // u64 [kStages]
  static constexpr int kSmemBytes = kBarrierOffset + kBarrierBytes;

  // The ring stage of a segment's tile `tile`, and the mbarrier its bulk copies complete on.
  __host__ __device__ static constexpr int raw_stage_offset(int tile) {
    return kRawOffset + (tile % kStages) * align128(kRawTileBytes);
  }
  __host__ __device__ static constexpr int stage_barrier_offset(int tile) {
    return kBarrierOffset + 8 * (tile % kStages);
  }

  // Copies issued ahead of the tile being computed. Native tiles are read in place, so one stage
  // is always busy with the current tile; converted tiles free their raw stage right after the
  // conversion, so every stage can hold a tile in flight.
  static constexpr int kTilesAhead = kConvert ? kStages : kStages - 1;

  static_assert(kBlockM == 16 || kBlockM == 64, "the row layouts are written for 16 and 64 rows");
  static_assert(kBlockM == kDecodeRowsSmall || kBlockM == kDecodeRowsLarge,
                "tile_shape.hpp's row rule must name this CTA size");
  static_assert(kKeyGroups * kRowGroups == kWarps && kKeysPerWarp % 8 == 0, "S warp layout");
  static_assert(kScoreTiles == 1 || kScoreTiles % 2 == 0, "K fragments load n8 tiles in pairs");
  static_assert(kQInRegisters == (kScoreTiles == 1), "q-in-registers path loads one n8 tile");
  static_assert(kTilesAhead >= 1, "at least one tile must be in flight during compute");
  static_assert(kConvert || kStages >= 2, "native tiles need a second stage to copy into");
  static_assert(kConvert || !kQInRegisters || kBlockM * kRowBytes <= kRawTileBytes,
                "q is staged in the last ring stage before it moves to registers");
  static_assert(!kRawE4m3 || kFormat == CacheFormat::kFp8E4m3, "raw e4m3 tiles are fp8_e4m3");
  static_assert(!kRawDsMla || (kFormat == CacheFormat::kFp8DsMla && kBlockM == 16),
                "raw fp8_ds_mla tiles: 16 rows (q in registers)");
  static_assert(!kRawQ16 || kBlockM == 16, "a 16-bit q over raw tiles: 16 rows (q in registers)");
  static_assert(kSmemBytes <= kSmemLimit, "shared-memory plan exceeds 227 KiB");
  static_assert(kStages * 8 <= kBarrierBytes || !kBulkCopies, "one mbarrier per stage");
  static_assert(!kBulkCopies || kRawEntry % 16 == 0, "bulk copies move whole 16-byte units");

  // Byte offset of 16-byte chunk `chunk` of row `row` in a q or 16-bit K tile (ldmatrix operands).
  __host__ __device__ static constexpr uint32_t operand_offset(int row, int chunk) {
    return swizzled<kRowBytes>(row, chunk);
  }
  // Byte offset of chunk `chunk` of key `key` in a raw ring stage: native tiles are the MMA
  // operand, raw e4m3 tiles are read in place with their own swizzle, converted stages are plain
  // rows that only the conversion reads.
  __host__ __device__ static constexpr uint32_t raw_offset(int key, int chunk) {
    if constexpr (kConvert || kRawDsMla) {  // 656-byte rows: 8 consecutive keys hit 8 bank groups
      return static_cast<uint32_t>(key * kRawEntry + chunk * 16);
    } else if constexpr (kRawE4m3) {
      return e4m3_swizzled(key, chunk);
    } else {
      return operand_offset(key, chunk);
    }
  }
};

}  // namespace mlakit::cuda::decode_sm90
