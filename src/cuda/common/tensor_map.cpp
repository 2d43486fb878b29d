#include "cuda/common/tensor_map.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "core/check.hpp"
#include "cuda/common/runtime.hpp"

namespace mlakit::cuda {

namespace {

constexpr int kDriverVersion = 12000;  // the cuTensorMapEncodeTiled signature of CUDA 12.0
constexpr int kMaxRank = 5;            // TMA's tiled maps (rank 1..5)

// The driver's cuTensorMapEncodeTiled, looked up once; nullptr when the driver has none.
PFN_cuTensorMapEncodeTiled_v12000 encode_function(const char* op) {
  static const PFN_cuTensorMapEncodeTiled_v12000 function = [op] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    check_cuda(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, kDriverVersion,
                                                cudaEnableDefault, &found),
               op, "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    return found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry)
               : nullptr;
  }();
  if (function == nullptr) {
    detail::fail(ErrorCode::kBackend,
                 detail::str_cat(op, ": the driver has no cuTensorMapEncodeTiled"));
  }
  return function;
}

}  // namespace

CUresult encode_tiled_tensor_map(const char* op, CUtensorMap& map, CUtensorMapDataType type,
                                 int rank, const void* base, const cuuint64_t* dims,
                                 const cuuint64_t* strides_bytes, const cuuint32_t* box,
                                 CUtensorMapSwizzle swizzle) {
  detail::require(rank >= 1 && rank <= kMaxRank, ErrorCode::kInternal, op,
                  ": a TMA map has 1 to 5 dimensions");
  const cuuint32_t element_strides[kMaxRank] = {1, 1, 1, 1, 1};
  return encode_function(op)(&map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base),
                             dims, strides_bytes, box, element_strides,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace mlakit::cuda
