"""Helpers shared by the compat modules: scales read on the device or on the host, host reads of
index tensors, and argument checks.

Reading a tensor's value on the host is what the CPU path does. For CUDA tensors it is a
device-to-host copy that synchronises the stream and cannot be captured in a CUDA graph, so a
scale given as a CUDA tensor goes to the library as a tensor and its kernels read it
(scale_arg); index tensors read with host_ints still synchronise (docs/python.md).
"""

import torch

from .. import ops as _ops

FP8_E4M3_MAX = 448.0  # why: largest finite float8_e4m3fn value (1.75 * 2^8), the fp8 range


def fail(op, message, error=ValueError):
    """Raises `error` with the message form of the compat layer: 'mlakit.compat.<op>: ...'."""
    raise error(f"mlakit.compat.{op}: {message}")


def host_scale(value, op, name):
    """A scale given as a Python number or a one-element tensor, as a Python float (read on the
    host: a CUDA tensor synchronises)."""
    try:
        return _ops.to_float(value, name)
    except (TypeError, ValueError) as e:
        fail(op, str(e).removeprefix("mlakit: "), type(e))


def scale_arg(value, op, name):
    """A scale as the mlakit op should take it: a tensor on a CUDA device as it is (the kernel
    reads it; never read here), anything else as a Python float read on the host (host_scale)."""
    if isinstance(value, torch.Tensor) and value.device.type == "cuda":
        return value
    return host_scale(value, op, name)


def host_ints(tensor, op, name, length=None):
    """A one-dimensional integer tensor's first `length` values (all by default) as Python ints,
    read on the host (a CUDA tensor synchronises)."""
    if tensor.dim() != 1:
        fail(op, f"{name} must be one-dimensional, got shape {tuple(tensor.shape)}")
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        fail(op, f"{name} must hold integers, got {tensor.dtype}", TypeError)
    if length is not None and tensor.shape[0] < length:
        fail(op, f"{name} needs at least {length} entries, got {tensor.shape[0]}")
    values = tensor if length is None else tensor[:length]
    return [int(v) for v in values.tolist()]


def require_dtype(op, name, tensor, dtypes):
    """TypeError naming the accepted dtypes unless tensor.dtype is one of them."""
    if tensor.dtype not in dtypes:
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        fail(op, f"{name} must have dtype {names}, got {str(tensor.dtype).removeprefix('torch.')}",
             TypeError)


def require_ndim(op, name, tensor, ndim, layout):
    """ValueError unless tensor has `ndim` dimensions (`layout` describes them)."""
    if tensor.dim() != ndim:
        fail(op, f"{name} must be {layout}, got shape {tuple(tensor.shape)}")
