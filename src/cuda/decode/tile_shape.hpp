// Tile shape of the sm90 decode kernel that the host-side split planner must agree with. Plain C++
// (no CUDA headers): included by the planner, the launcher and the kernel traits.
#pragma once

#include <cstdint>

namespace mlakit::cuda {

// Keys per tile: 64 keys x 576 16-bit values = 72 KiB, the largest tile of which two (M64) or three
// (M16) stages fit in the 227 KiB of shared memory, and the page size FlashMLA is tuned for. A
// split always starts at a multiple of this, so no tile straddles two splits.
inline constexpr int64_t kDecodeKeyTile = 64;

// Query rows (s_q * N of one request) per CTA: 16 when a request has at most 16 rows (one MMA row
// tile: h_q 16 at s_q 1, memory-bound), else 64 (four row tiles; an O accumulator of 64 x 512 f32
// is half of the register file, the most one CTA of 256 threads can hold).
inline constexpr int64_t kDecodeRowsSmall = 16;
inline constexpr int64_t kDecodeRowsLarge = 64;

inline constexpr int64_t decode_rows_per_cta(int64_t rows_per_request) {
  return rows_per_request <= kDecodeRowsSmall ? kDecodeRowsSmall : kDecodeRowsLarge;
}

}  // namespace mlakit::cuda
