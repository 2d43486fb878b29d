// TMA descriptions (CUtensorMap) for the sm_90a kernels: cuTensorMapEncodeTiled through the
// runtime's driver entry point (no link against libcuda). Host code.
#pragma once

#include <cuda.h>

namespace mlakit::cuda {

// Encodes into `map` a tiled map of a `rank`-dimensional tensor (1..5) at `base` (16-byte
// aligned): dims innermost first, `strides_bytes` of dims 1..rank-1 (multiples of 16), `box`
// elements per dimension, no interleave, `swizzle`, 256-byte L2 promotion, zeros out of bounds.
// Returns the driver's status (the description may be refused, e.g. for an alignment it does not
// take); throws mlakit::Error(kBackend) naming `op` when the driver has no such entry point.
CUresult encode_tiled_tensor_map(const char* op, CUtensorMap& map, CUtensorMapDataType type,
                                 int rank, const void* base, const cuuint64_t* dims,
                                 const cuuint64_t* strides_bytes, const cuuint32_t* box,
                                 CUtensorMapSwizzle swizzle);

}  // namespace mlakit::cuda
