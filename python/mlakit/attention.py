"""MlaAttention: one MLA layer's attention as an inference engine calls it (attention.hpp)."""

import ctypes
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from ._args import to_bool, to_int
from ._dlpack import (
    DLDataType,
    describe,
    describe_optional,
    dl_device,
    dl_dtype_of,
)
from ._library import MlaConfigC, call, lib
from ._registry import Registry
from .communicator import Communicator, call_with_collectives
from .ops import kv_cache_dtype_code, stream_of, to_float
from .planning import CHUNK_POLICY, QUERY_LEN_SUPPORT, _enum, plan_from_handle
from .step import ForwardBatch, StepPlan, _CBatch, config_struct


@dataclass
class MlaConfig:
    """Configuration of one layer (MlaAttentionConfig). The defaults are the library's:
    DeepSeek-V2-Lite dimensions. `scale` (the model's softmax scale) must be set."""

    scale: float = 0.0
    num_heads: int = 16  # N
    kv_lora_rank: int = 512  # L
    qk_rope_head_dim: int = 64  # R
    qk_nope_head_dim: int = 128  # P
    v_head_dim: int = 128  # V
    act_dtype: Any = "bfloat16"  # "float32", "float16", "bfloat16" or a NumPy/torch dtype
    kv_cache_dtype: Any = "auto"  # "auto", "fp8", "fp8_e4m3", "fp8_ds_mla"
    block_size: int = 64
    decode_threshold: int = 1
    query_len_support: Any = "varlen"  # "single_only", "uniform", "varlen"
    workspace_tokens: int = 0  # 0: derived from max_model_len and max_num_seqs (spec B.2)
    # Engine limits: a Workspace is sized for the worst step within them (workspace_bytes).
    max_model_len: int = 4096  # tokens of one request (context + new)
    max_num_seqs: int = 256  # requests of one step
    max_num_batched_tokens: int = 8192  # tokens of one step
    chunk_policy: Any = "packed"  # "packed" or "equal_share"
    # Decode attention cut by each request's own length only: a decode request's output bits do not
    # depend on the rest of the batch (the projections are not made invariant).
    batch_invariant: bool = False
    device: str = "cpu"  # "cpu", "cuda" or "cuda:<index>"
    # Decode context parallelism (docs/dcp.md): this layer is rank dcp_rank of dcp_world_size
    # ranks sharing every request's tokens, position p on rank (p // dcp_interleave) %
    # dcp_world_size. 1: no DCP. With more, MlaAttention needs the group's communicator.
    dcp_world_size: int = 1
    dcp_rank: int = 0
    dcp_interleave: int = 1

    def _to_c(self):
        c = MlaConfigC()
        lib.mlakit_mla_config_init(ctypes.byref(c))
        c.num_heads = to_int(self.num_heads, "MlaConfig.num_heads")
        c.kv_lora_rank = to_int(self.kv_lora_rank, "MlaConfig.kv_lora_rank")
        c.qk_rope_head_dim = to_int(self.qk_rope_head_dim, "MlaConfig.qk_rope_head_dim")
        c.qk_nope_head_dim = to_int(self.qk_nope_head_dim, "MlaConfig.qk_nope_head_dim")
        c.v_head_dim = to_int(self.v_head_dim, "MlaConfig.v_head_dim")
        c.scale = to_float(self.scale, "MlaConfig.scale")
        code, bits = dl_dtype_of(self.act_dtype)
        c.act_dtype = DLDataType(code, bits, 1)
        c.kv_cache_dtype = kv_cache_dtype_code(self.kv_cache_dtype)
        c.block_size = to_int(self.block_size, "MlaConfig.block_size")
        c.decode_threshold = to_int(self.decode_threshold, "MlaConfig.decode_threshold")
        c.query_len_support = _enum(QUERY_LEN_SUPPORT, self.query_len_support,
                                    "query_len_support")
        c.chunk_policy = _enum(CHUNK_POLICY, self.chunk_policy, "chunk_policy")
        c.workspace_tokens = to_int(self.workspace_tokens, "MlaConfig.workspace_tokens")
        c.max_model_len = to_int(self.max_model_len, "MlaConfig.max_model_len")
        c.max_num_seqs = to_int(self.max_num_seqs, "MlaConfig.max_num_seqs")
        c.max_num_batched_tokens = to_int(self.max_num_batched_tokens,
                                          "MlaConfig.max_num_batched_tokens")
        c.batch_invariant = 1 if to_bool(self.batch_invariant, "MlaConfig.batch_invariant") else 0
        c.device = dl_device(self.device)
        c.dcp_world_size = to_int(self.dcp_world_size, "MlaConfig.dcp_world_size")
        c.dcp_rank = to_int(self.dcp_rank, "MlaConfig.dcp_rank")
        c.dcp_interleave = to_int(self.dcp_interleave, "MlaConfig.dcp_interleave")
        return c


# Live layers by layer_id, for the torch ops (which cannot take objects).
_LAYERS = Registry("MlaAttention", "layer_id")


def layer_by_id(layer_id):
    return _LAYERS.get(layer_id)


class MlaAttention:
    """One MLA layer: absorbs kv_b_proj at construction, then runs forward steps.

    kv_b_proj_weight: host [N * (P + V), L] float32/float16/bfloat16, or float8_e4m3fn (or
    uint8) with kv_b_proj_scale_inv: float32 [ceil(N*(P+V) / 128), ceil(L / 128)] (DeepSeek-V3
    128x128 block scales: value = fp8 * scale_inv[row // 128, col // 128]).

    communicator: required when config.dcp_world_size > 1 (ignored otherwise): the DCP group's
    mlakit.Communicator, or a torch.distributed ProcessGroup (wrapped in
    mlakit.dcp_torch.ProcessGroupCommunicator on config.device). Its rank and world size must
    be config's dcp_rank and dcp_world_size. forward() then runs the group's collectives through
    it, and every rank must call it for the same steps (docs/dcp.md)."""

    def __init__(self, config, kv_b_proj_weight, kv_b_proj_scale_inv=None, communicator=None):
        self.config = config
        c_config = config_struct(config, "MlaAttention")
        w = describe(kv_b_proj_weight, "kv_b_proj_weight")
        s = describe_optional(kv_b_proj_scale_inv, "kv_b_proj_scale_inv")
        self.communicator = None  # kept alive as long as the layer: the library borrows it
        if config.dcp_world_size != 1 and communicator is not None:
            self.communicator = _as_communicator(communicator, config.device)
        handle = ctypes.c_void_p()
        call("mlakit_attention_create_dcp", ctypes.byref(c_config), w.ref,
             None if s is None else s.ref,
             None if self.communicator is None else self.communicator._handle,
             ctypes.byref(handle))
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.mlakit_attention_destroy, handle)
        self._lock = threading.Lock()  # the single-call form's own workspace: one at a time
        self.layer_id = _LAYERS.add(self)

    @property
    def workspace_tokens(self):
        """Rows of the layer's context-gather workspace."""
        tokens = ctypes.c_int64()
        call("mlakit_attention_workspace_tokens", self._handle, ctypes.byref(tokens))
        return tokens.value

    def plan(self, batch):
        """The Plan forward() follows for `batch` (pure host work)."""
        cb = _CBatch(batch)
        handle = ctypes.c_void_p()
        call("mlakit_attention_plan", self._handle, ctypes.byref(cb.c), ctypes.byref(handle))
        return plan_from_handle(handle)

    def forward(self, q, kv_c_normed, k_pe, kv_cache, batch, output, q_scale=1.0, k_scale=1.0):
        """Writes the batch's tokens into kv_cache, runs prefill and decode, writes output.

        q: [T', N, P + R] (rope applied); kv_c_normed: [T', L]; k_pe: [T', R] or [T', 1, R];
        kv_cache: [num_blocks, block_size, entry_width] (written; may be empty); batch: a
        StepPlan (plan_step once per step, then every layer: launches only), a ForwardBatch
        (single call: plans it and runs in a workspace the layer owns), or None for a profile
        run (output zero-filled); output: [T', N * V] (rows [T, T') untouched); q_scale,
        k_scale: fp8 scales (used with fp8 caches only; other caches ignore them).

        Under DCP q holds this rank's N heads, kv_c_normed and k_pe every new token, kv_cache
        and the batch's block_table are this rank's, its seq_lens global and its slot_mapping
        empty (ForwardBatch); every rank of the group makes the same calls."""
        described = [describe(q, "q"), describe(kv_c_normed, "kv_c_normed"),
                     describe(k_pe, "k_pe"), describe(kv_cache, "kv_cache", writable=True)]
        out = describe(output, "output", writable=True)
        scales = (to_float(q_scale, "q_scale"), to_float(k_scale, "k_scale"))
        stream = stream_of(*described, out)
        if isinstance(batch, StepPlan):
            with batch.workspace._lock:
                call_with_collectives(self.communicator, "mlakit_attention_forward_step",
                                      self._handle, *[d.ref for d in described], batch._handle,
                                      out.ref, *scales, stream)
            return
        if batch is not None and not isinstance(batch, ForwardBatch):
            raise TypeError("mlakit: MlaAttention.forward: batch must be a StepPlan, a "
                            f"ForwardBatch or None (profile run), got {type(batch).__name__}")
        cb = None if batch is None else _CBatch(batch)
        with self._lock:
            call_with_collectives(self.communicator, "mlakit_attention_forward", self._handle,
                                  *[d.ref for d in described],
                                  None if cb is None else ctypes.byref(cb.c), out.ref, *scales,
                                  stream)


def _as_communicator(communicator, device):
    if isinstance(communicator, Communicator):
        return communicator
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and isinstance(communicator, distributed.ProcessGroup):
        from .dcp_torch import ProcessGroupCommunicator

        return ProcessGroupCommunicator(communicator, device)
    raise TypeError(
        "mlakit: MlaAttention: communicator must be a mlakit.Communicator or a "
        f"torch.distributed ProcessGroup, got {type(communicator).__name__}"
    )


__all__ = ["ForwardBatch", "MlaAttention", "MlaConfig"]
