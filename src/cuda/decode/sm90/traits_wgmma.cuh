// Compile-time shape of the sm90 wgmma decode kernel (kernel_wgmma.cuh): 64 query rows per CTA with
// a native 16-bit cache. Plain constants and offsets; the CuTe layouts that describe the same
// memory to the tensor cores are in kernel_wgmma.cuh.
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

template <class Element_>
struct WgmmaConfig : TileCopy<CacheFormat::kNative> {
  using Element = Element_;  // Bf16Mma or F16Mma
  static constexpr int kBlockM = static_cast<int>(kDecodeRowsLarge);
  static constexpr int kWarpgroups = kThreads / 128;  // 2: a warpgroup is 4 warps
  // S = q K^T: warpgroup g computes keys [32 g, 32 g + 32) of all 64 rows (wgmma m64n32k16).
  static constexpr int kKeysPerWarpgroup = kBlockN / kWarpgroups;
  // O += P V: warpgroup g owns V columns [256 g, 256 g + 256) (wgmma m64n256k16, the widest N).
  static constexpr int kColsPerWarpgroup = kDimV / kWarpgroups;

  // Two stages: one is computed while the next tile's copy is in flight (72 KiB each; a third
  // does not fit next to the 72 KiB q tile).
  static constexpr int kStages = 2;
  static constexpr int kTilesAhead = kStages - 1;

  // ---- Shared memory plan (byte offsets; operand tiles 1024-byte aligned for the swizzle).
  static constexpr int kQBytes = kBlockM * kRowBytes;           // 72 KiB, [64][576] SW128
  static constexpr int kPBytes = kBlockM * kPRowBytes;          // 8 KiB, [64][64] SW128
  static constexpr int kPartBytes = kWarpgroups * kBlockM * 4;  // f32 [warpgroups][64]
  static constexpr int kStageOffset = 0;                        // [kStages][64][576] SW128
  static constexpr int kQOffset = kStageOffset + kStages * kTileBytes;
  static constexpr int kPOffset = kQOffset + kQBytes;
  static constexpr int kRowMaxOffset = kPOffset + kPBytes;  // tile max per warpgroup and row
  static constexpr int kRowSumOffset = kRowMaxOffset + kPartBytes;  // row sum per warpgroup
  // The kernel rounds the dynamic shared-memory base up to the 1024-byte swizzle alignment (the
  // hardware swizzles by absolute address bits), which may skip up to this much.
  static constexpr int kBaseAlignment = 1024;
  static constexpr int kSmemBytes = kRowSumOffset + kPartBytes + kBaseAlignment;

  // Byte offset of 16-byte chunk `chunk` of row `row` in the q tile or a K tile (both 64 rows).
  __host__ __device__ static constexpr uint32_t operand_offset(int row, int chunk) {
    return sw128_k_offset<kBlockM>(row, chunk);
  }

  static_assert(kBlockM == kBlockN, "q and K tiles share one operand layout (64 rows)");
  static_assert(kBlockM == kDecodeRowsLarge, "tile_shape.hpp's 64-row CTA");
  static_assert(kRowBytes % kSwizzleBytes == 0 && kBlockN * 2 == kSwizzleBytes,
                "576 columns are whole swizzle blocks; a P row (64 keys) is exactly one");
  static_assert(kTileBytes % kBaseAlignment == 0 && kQOffset % kBaseAlignment == 0 &&
                    kPOffset % kBaseAlignment == 0,
                "SW128 operand tiles start on 1024-byte boundaries");
  static_assert(kSmemBytes <= kSmemLimit, "shared-memory plan exceeds 227 KiB");
};

}  // namespace mlakit::cuda::decode_sm90
