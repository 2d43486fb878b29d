"""DLPack tensor descriptions (the DLTensor of include/mlakit/dlpack.h) of NumPy arrays and torch
tensors, zero-copy: the C library reads and writes the caller's memory directly.

Torch is never imported here: a tensor is recognised through ``sys.modules`` only when the
caller has already imported torch.
"""

import ctypes
import sys

import numpy as np

# DLDeviceType and DLDataTypeCode values of the DLPack standard.
KDL_CPU = 1
KDL_CUDA = 2
KDL_INT = 0
KDL_UINT = 1
KDL_FLOAT = 2
KDL_BFLOAT = 4
KDL_FLOAT8_E4M3FN = 10


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


def dl_device(device):
    """The DLDevice of 'cpu', 'cuda', 'cuda:<index>' (or a torch.device, through its name)."""
    text = str(device)
    if text == "cpu":
        return DLDevice(KDL_CPU, 0)
    if text == "cuda":
        return DLDevice(KDL_CUDA, 0)
    if text.startswith("cuda:") and text[5:].isdigit():
        return DLDevice(KDL_CUDA, int(text[5:]))
    raise ValueError(f"mlakit: device must be 'cpu', 'cuda' or 'cuda:<index>', got {device!r}")


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


def _numpy_dtypes():
    """NumPy dtype -> (DLPack code, bits). bf16 and fp8 come from ml_dtypes when installed."""
    table = {
        np.dtype(np.float32): (KDL_FLOAT, 32),
        np.dtype(np.float16): (KDL_FLOAT, 16),
        np.dtype(np.uint8): (KDL_UINT, 8),
        np.dtype(np.int32): (KDL_INT, 32),
        np.dtype(np.int64): (KDL_INT, 64),
    }
    try:
        import ml_dtypes
    except ImportError:  # bf16 / fp8 arrays cannot exist without it
        return table
    table[np.dtype(ml_dtypes.bfloat16)] = (KDL_BFLOAT, 16)
    table[np.dtype(ml_dtypes.float8_e4m3fn)] = (KDL_FLOAT8_E4M3FN, 8)
    return table


_NUMPY_DTYPES = _numpy_dtypes()
_TORCH_DTYPES = {  # torch dtype name -> (DLPack code, bits)
    "float32": (KDL_FLOAT, 32),
    "float16": (KDL_FLOAT, 16),
    "bfloat16": (KDL_BFLOAT, 16),
    "float8_e4m3fn": (KDL_FLOAT8_E4M3FN, 8),
    "uint8": (KDL_UINT, 8),
    "int32": (KDL_INT, 32),
    "int64": (KDL_INT, 64),
}
SUPPORTED_DTYPES = "float32, float16, bfloat16, float8_e4m3fn, uint8, int32, int64"


def is_torch_tensor(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


class Described:
    """A DLTensor plus everything that must outlive the C call (shape and stride arrays, the
    array itself) and the CUDA stream of the tensor (None for host memory)."""

    __slots__ = ("tensor", "_keep", "stream", "device")

    def __init__(self, tensor, keep, stream, device):
        self.tensor = tensor
        self._keep = keep
        self.stream = stream
        self.device = device  # (DLPack device type, index)

    @property
    def ref(self):
        return ctypes.byref(self.tensor)


def _fill(data, device, shape, strides, code_bits, keep, stream):
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(ndim, 1))(*strides)
    t = DLTensor()
    t.data = data
    t.device = DLDevice(*device)
    t.ndim = ndim
    t.dtype = DLDataType(code_bits[0], code_bits[1], 1)
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    return Described(t, (shape_arr, strides_arr, keep), stream, device)


def _describe_numpy(x, name, writable):
    code_bits = _NUMPY_DTYPES.get(x.dtype)
    if code_bits is None:
        raise TypeError(f"mlakit: {name} has dtype {x.dtype}; expected one of {SUPPORTED_DTYPES}")
    if writable and not x.flags.writeable:
        raise ValueError(f"mlakit: {name} is written to but the array is read-only")
    itemsize = x.dtype.itemsize
    strides = []
    for s in x.strides:
        if s % itemsize:
            raise ValueError(
                f"mlakit: {name} has byte strides {x.strides} that are not multiples of its "
                f"element size {itemsize}"
            )
        strides.append(s // itemsize)
    return _fill(x.ctypes.data, (KDL_CPU, 0), x.shape, strides, code_bits, x, None)


def _describe_torch(x, name):
    dtype_name = str(x.dtype).replace("torch.", "")
    code_bits = _TORCH_DTYPES.get(dtype_name)
    if code_bits is None:
        raise TypeError(f"mlakit: {name} has dtype {x.dtype}; expected one of {SUPPORTED_DTYPES}")
    stream = None
    if x.device.type == "cpu":
        device = (KDL_CPU, 0)
    elif x.device.type == "cuda":
        import torch

        index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        device = (KDL_CUDA, index)
        stream = torch.cuda.current_stream(x.device).cuda_stream
    else:
        raise NotImplementedError(
            f"mlakit: {name} is on device {x.device}; mlakit takes cpu and cuda tensors"
        )
    # data_ptr() already includes the storage offset; torch strides are in elements.
    return _fill(x.data_ptr(), device, tuple(x.shape), x.stride(), code_bits, x, stream)


def current_stream(device_type, device_id):
    """torch's current CUDA stream of a CUDA device (when torch is imported), else None: the
    stream for calls that take no tensor to read it from."""
    torch = sys.modules.get("torch")
    if device_type != KDL_CUDA or torch is None:
        return None
    return torch.cuda.current_stream(device_id).cuda_stream


def describe(x, name, writable=False):
    """The DLTensor of a NumPy array or a torch tensor (no copy). `writable`: the op writes it."""
    if isinstance(x, np.ndarray):
        return _describe_numpy(x, name, writable)
    if is_torch_tensor(x):
        return _describe_torch(x, name)
    raise TypeError(
        f"mlakit: {name} must be a numpy.ndarray or a torch.Tensor, got {type(x).__name__}"
    )


def describe_optional(x, name, writable=False):
    return None if x is None else describe(x, name, writable)


def dl_dtype_of(dtype):
    """(code, bits) of a dtype given as a string ('bfloat16'), a NumPy dtype or a torch dtype."""
    text = str(dtype).replace("torch.", "")
    if text in _TORCH_DTYPES:
        return _TORCH_DTYPES[text]
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        np_dtype = None
    if np_dtype is not None and np_dtype in _NUMPY_DTYPES:
        return _NUMPY_DTYPES[np_dtype]
    raise TypeError(f"mlakit: unsupported dtype {dtype!r}; expected one of {SUPPORTED_DTYPES}")
