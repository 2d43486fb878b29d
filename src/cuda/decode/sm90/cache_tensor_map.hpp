// The TMA descriptions of the wgmma decode kernel's copies (kernel_wgmma.cuh):
//  - a paged latent cache: a 3-D tensor (576 values, block_size slots, num_blocks pages),
//    innermost first, read in boxes of 64 values x min(block_size, 64) slots of one page; 16-bit
//    values (native) 128-byte swizzled, the wgmma operand layout (traits_wgmma.cuh), or e4m3
//    bytes (fp8_e4m3) unswizzled, rows of 64 bytes, which the kernel converts;
//  - an fp8_ds_mla cache (656-byte entries): three 3-D tensors over the same pages, (512 NoPE
//    bytes), (4 f32 scales) at entry byte 512 and (64 16-bit rope values) at entry byte 528, read
//    in boxes of 64 bytes (unswizzled), 4 scales (16 bytes) and 64 values (128-byte swizzled, the
//    operand layout) x min(block_size, 64) slots;
//  - q: a 4-D tensor (576 values, N heads, s_q queries, B requests), read in boxes of 64 values x
//    min(N, 64) heads x 64 / min(N, 64) queries: one box per column block of a CTA's 64 rows
//    (rows r = j N + n), rows past the request's s_q N zero-filled by TMA; 128-byte swizzled.
#pragma once

#include <cuda.h>

#include <optional>

#include "cuda/decode/sm90/params.cuh"

namespace mlakit::cuda::decode_sm90 {

// Slots of one TMA box: a 64-key tile is one box of a page (block_size a multiple of 64) or
// 64 / block_size whole pages (block_size 8, 16 or 32: the 8-row swizzle pattern stays whole).
inline int cache_box_slots(int block_size) { return block_size < 64 ? block_size : 64; }
// The fewest slots of a box (block_size 8): the most pages a 64-key tile spans is 64 / 8.
inline constexpr int kMinBoxSlots = 8;

// True when the cache can be read by TMA boxes: block_size in {8, 16, 32} or a multiple of 64,
// base address and both strides multiples of 16 bytes, at least one page (for every entry format:
// the fp8_ds_mla maps start 512 and 528 bytes into a 16-byte aligned entry, 16-byte multiples
// too). Otherwise the launcher runs the mma.sync kernel, which copies key by key.
bool cache_tensor_map_supported(const DecodeKernelParams& p);

// Builds the map of a `format` cache (kNative or kFp8E4m3; host, a driver call). Requires
// cache_tensor_map_supported(p); throws mlakit::Error(kBackend) if the driver refuses it.
CUtensorMap make_cache_tensor_map(const DecodeKernelParams& p, CacheFormat format);

// The three maps of an fp8_ds_mla cache, passed to the kernel as one __grid_constant__ argument.
struct DsMlaTensorMaps {
  CUtensorMap nope;    // UINT8 (512, block_size, num_blocks), boxes 64 x slots, unswizzled
  CUtensorMap scales;  // FLOAT32 (4, block_size, num_blocks) at entry byte 512, boxes 4 x slots
  CUtensorMap rope;    // UINT16 (64, block_size, num_blocks) at entry byte 528, 64 x slots, SW128
};

// Builds them (host, driver calls). Requires cache_tensor_map_supported(p); throws
// mlakit::Error(kBackend) if the driver refuses one.
DsMlaTensorMaps make_ds_mla_tensor_maps(const DecodeKernelParams& p);

// q's map when TMA can load the kernel's q tiles as they are: q already in the MMA element type
// `element` (no conversion), 64 rows of whole heads (N a multiple or a divisor of 64), base and
// strides multiples of 16 bytes, and the driver takes the description; else nullopt (the kernel's
// threads load and convert q).
std::optional<CUtensorMap> make_q_tensor_map(const DecodeKernelParams& p, RuntimeDType element);

}  // namespace mlakit::cuda::decode_sm90
