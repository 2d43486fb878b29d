"""Communicators for decode context parallelism (docs/dcp.md): the two collectives a DCP layer
needs, run by Python code on the caller's own communication library. mlakit has none of its own:
while MlaAttention.forward runs, the library calls back into the communicator for each
all-gather and reduce-scatter (mlakit_communicator_create of the C ABI).

mlakit.dcp_torch.ProcessGroupCommunicator runs them on a torch.distributed ProcessGroup; other
libraries (mpi4py, ...) subclass Communicator the same way."""

import ctypes
import weakref
from dataclasses import dataclass

import numpy as np

from ._args import INT32_MAX, INT32_MIN, to_int
from ._dlpack import KDL_BFLOAT, KDL_FLOAT, KDL_FLOAT8_E4M3FN, KDL_UINT, dl_device
from ._library import CollectiveFn, CommunicatorCallbacksC, MlakitError, call, lib
from ._registry import Registry

# The element types of the collectives (DLPack code, bits) -> (name, bytes).
_DTYPES = {
    (KDL_FLOAT, 32): ("float32", 4),
    (KDL_FLOAT, 16): ("float16", 2),
    (KDL_BFLOAT, 16): ("bfloat16", 2),
    (KDL_FLOAT8_E4M3FN, 8): ("float8_e4m3fn", 1),
    (KDL_UINT, 8): ("uint8", 1),
}
# Returned to the library when the Python side fails (any non-zero value is a failure); the
# exception itself is kept on the communicator and chained to the library's error.
_FAILED = 1
_GONE = 2  # the communicator was collected while a layer still used it


@dataclass(frozen=True)
class Buffer:
    """A contiguous buffer of a collective, owned by mlakit: `count` elements of `dtype`
    ('float32', 'float16', 'bfloat16', 'float8_e4m3fn' or 'uint8') at `address` on `device`
    ('cpu' or 'cuda:<index>'). Valid only during the call it is handed to."""

    address: int
    count: int
    dtype: str
    itemsize: int
    device: str

    @property
    def nbytes(self):
        return self.count * self.itemsize

    def numpy(self):
        """The buffer as a 1-D NumPy array, zero-copy (host buffers only; bfloat16 and fp8 as
        ml_dtypes types)."""
        if self.device != "cpu":
            raise ValueError(f"mlakit: Buffer.numpy() needs a host buffer, this one is on "
                             f"{self.device}")
        raw = np.ctypeslib.as_array((ctypes.c_uint8 * self.nbytes).from_address(self.address))
        if self.dtype in ("bfloat16", "float8_e4m3fn"):
            import ml_dtypes

            return raw.view(getattr(ml_dtypes, self.dtype))
        return raw.view(np.dtype(self.dtype))


_COMMUNICATORS = Registry("Communicator", "communicator_id")


class Communicator:
    """Rank `rank` of a DCP group of `world_size` ranks whose buffers live on `device` ('cpu',
    'cuda' or 'cuda:<index>'). Subclasses implement the two collectives; the library calls them
    from the thread that runs MlaAttention.forward, in the same order on every rank, with
    buffers it has checked (contiguous, non-empty, on `device`). Pass the communicator to
    MlaAttention(..., communicator=...) of a configuration with the same dcp_world_size,
    dcp_rank and device; it must live as long as the layers (they keep a reference).

    An exception raised by a collective fails the forward call with MlakitRuntimeError (status
    'backend'), whose __cause__ is that exception. The other ranks are then left waiting in the
    collective, as with any communication library: the caller should abort the group."""

    def __init__(self, rank, world_size, device="cpu"):
        self.rank = to_int(rank, "rank", INT32_MIN, INT32_MAX)  # int32_t fields of the C struct
        self.world_size = to_int(world_size, "world_size", INT32_MIN, INT32_MAX)
        self.device = _device_name(device)
        self._error = None
        self.communicator_id = _COMMUNICATORS.add(self)
        callbacks = CommunicatorCallbacksC(self.rank, self.world_size, dl_device(self.device),
                                           _ALL_GATHER, _REDUCE_SCATTER_SUM,
                                           self.communicator_id)
        handle = ctypes.c_void_p()
        call("mlakit_communicator_create", ctypes.byref(callbacks), ctypes.byref(handle))
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.mlakit_communicator_destroy, handle)

    def all_gather(self, send, recv, stream):
        """recv = [send of rank 0 | send of rank 1 | ...] (each send.count elements). send,
        recv: Buffer; send is either recv's slice `rank` (in place) or disjoint from it. stream:
        for GPU buffers the cudaStream_t the layer runs on (an int; None is the default stream),
        on which the collective must be ordered; None for host buffers."""
        raise NotImplementedError(f"{type(self).__name__} does not implement all_gather")

    def reduce_scatter_sum(self, send, recv, stream):
        """recv = sum over ranks k of rank k's send elements [rank * recv.count, (rank + 1) *
        recv.count). send (world_size * recv.count elements), recv: Buffer of float32, float16
        or bfloat16, disjoint; stream as for all_gather."""
        raise NotImplementedError(f"{type(self).__name__} does not implement reduce_scatter_sum")

    def _raise_with_cause(self, error):
        """Re-raises `error` (a library error of a call that ran collectives) with the exception
        a collective raised, if one did, as its cause."""
        cause, self._error = self._error, None
        if cause is None:
            raise error
        raise error from cause


def _device_name(device):
    text = str(device)
    dl_device(text)  # validates it
    return "cuda:0" if text == "cuda" else text


def _buffers(comm, send, recv, send_count, recv_count, dtype):
    name, itemsize = _DTYPES[(dtype.code, dtype.bits)]
    return (Buffer(send, send_count, name, itemsize, comm.device),
            Buffer(recv, recv_count, name, itemsize, comm.device))


def _collective(method, send_factor, recv_factor):
    """A C callback calling `method` of the communicator named by user_data; counts scale by the
    world size as the collective's contract says. Nothing may unwind through C: an exception is
    kept on the communicator and reported as a non-zero status."""

    def callback(user_data, send, recv, count, dtype, stream):
        try:
            comm = _COMMUNICATORS.get(user_data or 0)
        except ValueError:
            return _GONE
        try:
            w = comm.world_size
            send_buf, recv_buf = _buffers(comm, send, recv, count * (w if send_factor else 1),
                                          count * (w if recv_factor else 1), dtype)
            getattr(comm, method)(send_buf, recv_buf, stream if comm.device != "cpu" else None)
            return 0
        except BaseException as e:  # noqa: BLE001 (KeyboardInterrupt too: re-raised after the call)
            comm._error = e
            return _FAILED

    return CollectiveFn(callback)


# all_gather: count is send's; recv has world_size * count. reduce_scatter_sum: count is recv's.
_ALL_GATHER = _collective("all_gather", send_factor=False, recv_factor=True)
_REDUCE_SCATTER_SUM = _collective("reduce_scatter_sum", send_factor=True, recv_factor=False)


def call_with_collectives(communicator, name, *args):
    """call(name, *args) for a library call that may run `communicator`'s collectives: a
    failure caused by a collective's exception is raised with it as the cause."""
    try:
        call(name, *args)
    except MlakitError as e:
        if communicator is None:
            raise
        communicator._raise_with_cause(e)


__all__ = ["Buffer", "Communicator"]
