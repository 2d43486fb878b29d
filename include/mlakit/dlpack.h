/* The DLPack tensor description (ABI of DLPack v0.8: DLDevice, DLDataType, DLTensor), written for
 * mlakit from the public specification. Field order, types and enum values are the standard's, so
 * a DLTensor made by any DLPack producer (NumPy, PyTorch, CuPy, JAX) can be passed as is.
 *
 * The include guard is the standard header's own: whichever of the two is included first wins,
 * and both describe the same layout. Only what mlakit reads is declared here (no managed tensors:
 * mlakit never takes ownership of memory).
 */
#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where the memory of a tensor lives. */
typedef enum {
  kDLCPU = 1,      /* host memory */
  kDLCUDA = 2,     /* CUDA device memory */
  kDLCUDAHost = 3, /* pinned host memory (cudaMallocHost); readable by the CPU */
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13, /* CUDA unified memory */
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
} DLDeviceType;

typedef struct {
  DLDeviceType device_type; /* 32-bit enum */
  int32_t device_id;        /* ordinal of the device; 0 for the host */
} DLDevice;

/* Type codes of DLDataType.code. The fp8 codes arrived in DLPack 1.x; they are listed so that
 * producers which already emit them (PyTorch's float8_e4m3fn) can be read. */
typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
  kDLFloat8_e3m4 = 7U,
  kDLFloat8_e4m3 = 8U,
  kDLFloat8_e4m3b11fnuz = 9U,
  kDLFloat8_e4m3fn = 10U,
  kDLFloat8_e4m3fnuz = 11U,
  kDLFloat8_e5m2 = 12U,
  kDLFloat8_e5m2fnuz = 13U,
} DLDataTypeCode;

typedef struct {
  uint8_t code;   /* a DLDataTypeCode */
  uint8_t bits;   /* bits of one lane: 8, 16, 32, 64 */
  uint16_t lanes; /* vector lanes; 1 for every tensor mlakit accepts */
} DLDataType;

typedef struct {
  void* data;           /* base address (device address for device memory) */
  DLDevice device;      /* where `data` lives */
  int32_t ndim;         /* number of dimensions */
  DLDataType dtype;     /* element type */
  int64_t* shape;       /* [ndim] sizes */
  int64_t* strides;     /* [ndim] strides in elements, or NULL for a dense row-major tensor */
  uint64_t byte_offset; /* bytes from `data` to the first element */
} DLTensor;

#ifdef __cplusplus
}
#endif

#endif /* DLPACK_DLPACK_H_ */
