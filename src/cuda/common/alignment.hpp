// Host-side choice of vector widths: the widest power-of-two access (<= 16 bytes) that every
// address a kernel will form is a multiple of.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace mlakit::cuda {

// Largest power of two <= max_bytes dividing every value (addresses and byte offsets); 0 divides
// by anything.
inline int64_t common_alignment(std::initializer_list<uint64_t> values, int64_t max_bytes = 16) {
  int64_t unit = max_bytes;
  for (uint64_t v : values) {
    while (unit > 1 && v % static_cast<uint64_t>(unit) != 0) unit /= 2;
  }
  return unit;
}

inline uint64_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace mlakit::cuda
