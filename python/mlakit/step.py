"""Engine steps (step.hpp): one Workspace shared by every layer, sized from the engine's limits;
one StepPlan per step from plan_step; each layer's forward runs against that plan.

    workspace = mlakit.Workspace(config)          # once: worst-case scratch for the limits
    workspace.touch()                              # the profile run
    for each step:
        plan = mlakit.plan_step(config, batch, workspace)   # host planning + one index upload
        for layer in layers:
            layer.forward(q, kv_c, k_pe, kv_caches[i], plan, output)  # launches only
"""

import ctypes
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Optional

from ._args import to_int
from ._dlpack import current_stream, describe
from ._library import ForwardBatchC, StepPlanInfoC, call, lib
from ._registry import Registry
from .ops import stream_of
from .planning import SplitCounts, host_int32, plan_from_handle

_I32 = ctypes.POINTER(ctypes.c_int32)


@dataclass
class ForwardBatch:
    """One forward step's batch, requests ordered decodes-first.

    query_start_loc: host [R + 1]; seq_lens: host [R] (context + new tokens); block_table: int32
    [R, max_blocks] and slot_mapping: int64 [>= T] on the layer's device (slot < 0 skips the
    cache write); num_actual_tokens: T, defaults to query_start_loc[-1].

    Under DCP (config.dcp_world_size > 1; docs/dcp.md) seq_lens are the global lengths, the same
    on every rank; block_table is this rank's, of its local positions (dcp_local_seq_len of a
    request's length, in blocks); slot_mapping is empty (int64 [0]): planning derives this
    rank's slot of every token."""

    query_start_loc: Any
    seq_lens: Any
    block_table: Any
    slot_mapping: Any
    num_actual_tokens: Optional[int] = None


def config_struct(config, who):
    """The C struct of an MlaConfig; TypeError naming `who` for anything else (None, a dict)."""
    to_c = getattr(config, "_to_c", None)
    if to_c is None:
        raise TypeError(f"mlakit: {who} takes an MlaConfig, got {type(config).__name__}")
    return to_c()


class _CBatch:
    """The C struct of a ForwardBatch plus the host arrays and descriptions it points to."""

    def __init__(self, batch):
        if not isinstance(batch, ForwardBatch):
            raise TypeError(f"mlakit: batch must be a ForwardBatch, got {type(batch).__name__}")
        self.qsl = host_int32(batch.query_start_loc, "batch.query_start_loc")
        self.lens = host_int32(batch.seq_lens, "batch.seq_lens")
        if self.qsl.size != self.lens.size + 1:
            raise ValueError(
                f"mlakit: batch.query_start_loc must have len(seq_lens) + 1 = "
                f"{self.lens.size + 1} entries, got {self.qsl.size}"
            )
        self.block_table = describe(batch.block_table, "batch.block_table")
        self.slot_mapping = describe(batch.slot_mapping, "batch.slot_mapping")
        tokens = batch.num_actual_tokens
        self.c = ForwardBatchC(
            self.qsl.ctypes.data_as(_I32),
            self.lens.ctypes.data_as(_I32),
            self.lens.size,
            int(self.qsl[-1]) if tokens is None else to_int(tokens, "batch.num_actual_tokens"),
            ctypes.pointer(self.block_table.tensor),
            ctypes.pointer(self.slot_mapping.tensor),
        )

    @property
    def stream(self):
        return stream_of(self.block_table, self.slot_mapping)


def workspace_bytes(config):
    """Bytes of scratch the worst step within config's limits (max_num_batched_tokens,
    max_num_seqs, max_model_len) needs; independent of the number of layers."""
    c_config = config_struct(config, "workspace_bytes")
    bytes_ = ctypes.c_int64()
    call("mlakit_workspace_bytes", ctypes.byref(c_config), ctypes.byref(bytes_))
    return bytes_.value


_WORKSPACES = Registry("Workspace", "workspace_id")


def workspace_by_id(workspace_id):
    return _WORKSPACES.get(workspace_id)


class Workspace:
    """Scratch memory shared by every layer of a model, workspace_bytes(config) on config.device,
    allocated once here. It serves one step at a time: plan_step and the forward calls against
    its plans are serialised by a lock (on a GPU they must also stay ordered on one stream).

    current_plan: the StepPlan of the latest plan_step on it, the only one still valid (what
    torch.ops.mlakit.mla_attention_forward_step runs); workspace_id names it in torch ops."""

    def __init__(self, config):
        self.config = config
        c_config = config_struct(config, "Workspace")
        handle = ctypes.c_void_p()
        call("mlakit_workspace_create", ctypes.byref(c_config), ctypes.byref(handle))
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.mlakit_workspace_destroy, handle)
        self._device = (c_config.device.device_type, c_config.device.device_id)
        self._lock = threading.Lock()
        self.current_plan = None
        self.workspace_id = _WORKSPACES.add(self)

    @property
    def bytes(self):
        """Bytes of the workspace's buffer."""
        value = ctypes.c_int64()
        call("mlakit_workspace_get_bytes", self._handle, ctypes.byref(value))
        return value.value

    def touch(self):
        """The profile run (spec A.12): writes every byte once (zeros), on torch's current stream
        for a CUDA workspace, so that the memory is committed before the KV cache is sized."""
        with self._lock:
            call("mlakit_workspace_touch", self._handle, current_stream(*self._device))


class StepPlan:
    """The plan of one step on a Workspace (from plan_step), for every layer's forward. Valid
    until the next plan_step on the same workspace; a forward with an older plan raises
    ValueError ('stale'). It keeps the batch's block_table and slot_mapping alive: the kernels
    read them when the layers run (for CUDA graphs: at every replay).

    split: SplitCounts; num_reqs, num_actual_tokens, num_context_chunks; workspace_bytes_used;
    plan: the full Plan (a copy, made on first use)."""

    def __init__(self, handle, workspace, batch):
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.mlakit_step_plan_destroy, handle)
        self.workspace = workspace
        self._batch = batch  # its tensors: the plan borrows block_table and slot_mapping
        self._plan = None
        info = StepPlanInfoC()
        call("mlakit_step_plan_get_info", handle, ctypes.byref(info))
        self.num_reqs = info.num_reqs
        self.num_actual_tokens = info.num_actual_tokens
        self.split = SplitCounts._from_c(info.split)
        self.num_context_chunks = info.num_context_chunks
        self.workspace_bytes_used = info.workspace_bytes_used

    @property
    def plan(self):
        if self._plan is None:
            copy = ctypes.c_void_p()
            call("mlakit_step_plan_get_plan", self._handle, ctypes.byref(copy))
            self._plan = plan_from_handle(copy)
        return self._plan

    def same_launches(self, other):
        """True when both plans launch the same kernels with the same arguments (shapes and
        workspace addresses; lengths, block tables and slots may differ): a CUDA graph captured
        while running one replays correctly for the other."""
        if not isinstance(other, StepPlan):
            raise TypeError(f"mlakit: same_launches takes a StepPlan, got {type(other).__name__}")
        same = ctypes.c_int32()
        call("mlakit_step_plan_same_launches", self._handle, other._handle, ctypes.byref(same))
        return bool(same.value)


def plan_step(config, batch, workspace):
    """Plans one step (a ForwardBatch) on `workspace` for every layer of `config` (the layers'
    configuration; limits are the workspace's): validates the batch, plans it and uploads its
    indices in one asynchronous copy (CUDA: on torch's current stream). Raises ValueError naming
    the limit a step exceeds. The result also becomes workspace.current_plan."""
    if not isinstance(workspace, Workspace):
        raise TypeError(f"mlakit: plan_step takes a Workspace, got {type(workspace).__name__}")
    c_config = config_struct(config, "plan_step")
    cb = _CBatch(batch)
    handle = ctypes.c_void_p()
    with workspace._lock:
        call("mlakit_plan_step", ctypes.byref(c_config), ctypes.byref(cb.c), workspace._handle,
             cb.stream, ctypes.byref(handle))
        step = StepPlan(handle, workspace, cb)
        workspace.current_plan = step
    return step


__all__ = ["ForwardBatch", "StepPlan", "Workspace", "plan_step", "workspace_bytes"]
