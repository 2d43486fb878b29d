"""MlaAttention: one MLA layer's attention as an inference engine calls it (attention.hpp)."""

import ctypes
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Optional

from ._dlpack import (
    DLDataType,
    describe,
    describe_optional,
    dl_device,
    dl_dtype_of,
)
from ._library import ForwardBatchC, MlaConfigC, call, lib
from .ops import kv_cache_dtype_code, stream_of, to_float
from .planning import CHUNK_POLICY, QUERY_LEN_SUPPORT, _enum, host_int32, plan_from_handle

_I32 = ctypes.POINTER(ctypes.c_int32)


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
    max_model_len: int = 4096
    max_num_seqs: int = 256
    chunk_policy: Any = "packed"  # "packed" or "equal_share"
    device: str = "cpu"  # "cpu", "cuda" or "cuda:<index>"
    # Decode attention bitwise independent of the rest of the batch (projections excluded).
    batch_invariant: bool = False

    def _to_c(self):
        c = MlaConfigC()
        lib.mlakit_mla_config_init(ctypes.byref(c))
        c.num_heads = self.num_heads
        c.kv_lora_rank = self.kv_lora_rank
        c.qk_rope_head_dim = self.qk_rope_head_dim
        c.qk_nope_head_dim = self.qk_nope_head_dim
        c.v_head_dim = self.v_head_dim
        c.scale = float(self.scale)
        code, bits = dl_dtype_of(self.act_dtype)
        c.act_dtype = DLDataType(code, bits, 1)
        c.kv_cache_dtype = kv_cache_dtype_code(self.kv_cache_dtype)
        c.block_size = self.block_size
        c.decode_threshold = self.decode_threshold
        c.query_len_support = _enum(QUERY_LEN_SUPPORT, self.query_len_support,
                                    "query_len_support")
        c.chunk_policy = _enum(CHUNK_POLICY, self.chunk_policy, "chunk_policy")
        c.workspace_tokens = self.workspace_tokens
        c.max_model_len = self.max_model_len
        c.max_num_seqs = self.max_num_seqs
        c.device = dl_device(self.device)
        c.batch_invariant = 1 if self.batch_invariant else 0
        return c


@dataclass
class ForwardBatch:
    """One forward step's batch, requests ordered decodes-first.

    query_start_loc: host [R + 1]; seq_lens: host [R] (context + new tokens); block_table: int32
    [R, max_blocks] and slot_mapping: int64 [>= T] on the layer's device (slot < 0 skips the
    cache write); num_actual_tokens: T, defaults to query_start_loc[-1]."""

    query_start_loc: Any
    seq_lens: Any
    block_table: Any
    slot_mapping: Any
    num_actual_tokens: Optional[int] = None


class _CBatch:
    """The C struct of a ForwardBatch plus the host arrays and descriptions it points to."""

    def __init__(self, batch):
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
            int(self.qsl[-1]) if tokens is None else int(tokens),
            ctypes.pointer(self.block_table.tensor),
            ctypes.pointer(self.slot_mapping.tensor),
        )


# Live layers by id, for torch.ops.mlakit.mla_attention_forward (which cannot take objects).
_LAYERS = weakref.WeakValueDictionary()
_NEXT_ID = [0]
_ID_LOCK = threading.Lock()


def layer_by_id(layer_id):
    layer = _LAYERS.get(layer_id)
    if layer is None:
        raise ValueError(f"mlakit: no live MlaAttention with layer_id {layer_id}")
    return layer


class MlaAttention:
    """One MLA layer: absorbs kv_b_proj at construction, then runs forward steps.

    kv_b_proj_weight: host [N * (P + V), L] float32/float16/bfloat16, or float8_e4m3fn (or
    uint8) with kv_b_proj_scale_inv: float32 [ceil(N*(P+V) / 128), ceil(L / 128)] (DeepSeek-V3
    128x128 block scales: value = fp8 * scale_inv[row // 128, col // 128])."""

    def __init__(self, config, kv_b_proj_weight, kv_b_proj_scale_inv=None):
        self.config = config
        c_config = config._to_c()
        w = describe(kv_b_proj_weight, "kv_b_proj_weight")
        s = describe_optional(kv_b_proj_scale_inv, "kv_b_proj_scale_inv")
        handle = ctypes.c_void_p()
        call("mlakit_attention_create", ctypes.byref(c_config), w.ref,
             None if s is None else s.ref, ctypes.byref(handle))
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.mlakit_attention_destroy, handle)
        self._lock = threading.Lock()  # one workspace per layer: one forward at a time
        with _ID_LOCK:
            self.layer_id = _NEXT_ID[0]
            _NEXT_ID[0] += 1
        _LAYERS[self.layer_id] = self

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
        ForwardBatch, or None for a profile run (output zero-filled); output: [T', N * V]
        (rows [T, T') untouched); q_scale, k_scale: fp8 scales (fp8 caches only)."""
        described = [describe(q, "q"), describe(kv_c_normed, "kv_c_normed"),
                     describe(k_pe, "k_pe"), describe(kv_cache, "kv_cache", writable=True)]
        out = describe(output, "output", writable=True)
        cb = None if batch is None else _CBatch(batch)
        stream = stream_of(*described, out)
        with self._lock:
            call("mlakit_attention_forward", self._handle, *[d.ref for d in described],
                 None if cb is None else ctypes.byref(cb.c), out.ref, to_float(q_scale, "q_scale"),
                 to_float(k_scale, "k_scale"), stream)


__all__ = ["ForwardBatch", "MlaAttention", "MlaConfig"]
