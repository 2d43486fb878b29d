// The fp8_ds_mla entry (include/mlakit/kv_cache.hpp) as the CUDA kernels split it over a warp.
#pragma once

#include <cstdint>

namespace mlakit::cuda {

inline constexpr float kE4m3Max = 448.0f;   // largest finite e4m3fn value
inline constexpr int kDsNopeValues = 512;   // fp8 NoPE values per entry (bytes [0, 512))
inline constexpr int kDsTileSize = 128;     // NoPE values per f32 scale
inline constexpr int kDsScaleOffset = 512;  // four f32 scales at bytes [512, 528)
inline constexpr int kDsRopeOffset = 528;   // 64 16-bit rope values at bytes [528, 656)
inline constexpr int kDsRopeValues = 64;
inline constexpr int kDsLatentRopeWidth = 576;  // dst row of the dequantizing gather: 512 + 64
// One warp per entry: 512 / 32 NoPE values and 128 / 32 rope bytes per lane; a tile is then
// 128 / 16 = 8 consecutive lanes.
inline constexpr int kDsValuesPerLane = kDsNopeValues / 32;
inline constexpr int kDsRopeBytesPerLane = kDsRopeValues * 2 / 32;
inline constexpr int kDsLanesPerTile = kDsTileSize / kDsValuesPerLane;
static_assert(kDsScaleOffset + 4 * 4 == kDsRopeOffset, "four f32 tile scales");
static_assert(kDsValuesPerLane == 16 && kDsLanesPerTile == 8, "shuffle offsets assume 8 lanes");

}  // namespace mlakit::cuda
