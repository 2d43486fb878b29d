"""Host-side planning (spec B): decode/prefill split, decodes-first reorder, workspace sizing and
the whole plan of one forward step. Inputs are host integer sequences (lists, NumPy arrays, CPU
tensors; a CUDA tensor is copied to the host); results are plain Python objects and NumPy int32
arrays that do not depend on the library afterwards."""

import ctypes
from dataclasses import dataclass, field
from typing import List

import numpy as np

from ._args import to_bool, to_int, to_int32
from ._dlpack import is_torch_tensor
from ._library import PlannerConfigC, PlanSummaryC, SplitCountsC, call, lib

QUERY_LEN_SUPPORT = {"single_only": 0, "uniform": 1, "varlen": 2}
CHUNK_POLICY = {"equal_share": 0, "packed": 1}

_I32 = ctypes.POINTER(ctypes.c_int32)
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def host_int32(values, name):
    """A contiguous int32 NumPy copy of a host integer sequence, range-checked."""
    if is_torch_tensor(values):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"mlakit: {name} must hold integers, got dtype {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"mlakit: {name} must be one-dimensional, got shape {array.shape}")
    if array.size and (array.min() < _INT32_MIN or array.max() > _INT32_MAX):
        raise ValueError(f"mlakit: {name} has values outside the int32 range")
    return np.ascontiguousarray(array, dtype=np.int32)


def _ptr(array):
    return array.ctypes.data_as(_I32)


def _enum(table, value, name):
    if isinstance(value, (bool, int)):  # a code; to_int32 refuses a bool
        return to_int32(value, name)
    if value not in table:
        raise ValueError(f"mlakit: {name} must be one of {sorted(table)}, got {value!r}")
    return table[value]


@dataclass(frozen=True)
class SplitCounts:
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int

    @staticmethod
    def _from_c(c):
        return SplitCounts(c.num_decodes, c.num_prefills, c.num_decode_tokens,
                           c.num_prefill_tokens)


def split_decodes_and_prefills(query_start_loc, num_actual_tokens=None, decode_threshold=1,
                               require_uniform=False):
    """Decode/prefill split of a batch ordered decodes-first. query_start_loc: [R + 1];
    num_actual_tokens defaults to query_start_loc[-1]."""
    qsl = host_int32(query_start_loc, "query_start_loc")
    if qsl.size == 0:
        raise ValueError("mlakit: query_start_loc must have at least one element")
    tokens = (int(qsl[-1]) if num_actual_tokens is None
              else to_int(num_actual_tokens, "num_actual_tokens"))
    counts = SplitCountsC()
    call("mlakit_split_decodes_and_prefills", _ptr(qsl), qsl.size - 1, tokens,
         to_int(decode_threshold, "decode_threshold"),
         1 if to_bool(require_uniform, "require_uniform") else 0, ctypes.byref(counts))
    return SplitCounts._from_c(counts)


def reorder_decodes_first(num_scheduled, num_computed, decode_threshold=1):
    """order[i] = input index of the request placed at position i (decodes, extends, prefills)."""
    scheduled = host_int32(num_scheduled, "num_scheduled")
    computed = host_int32(num_computed, "num_computed")
    if scheduled.size != computed.size:
        raise ValueError(f"mlakit: num_scheduled has {scheduled.size} entries but num_computed "
                         f"has {computed.size}")
    order = np.empty(scheduled.size, dtype=np.int32)
    call("mlakit_reorder_decodes_first", _ptr(scheduled), _ptr(computed), scheduled.size,
         to_int(decode_threshold, "decode_threshold"), _ptr(order))
    return order


def chunked_prefill_workspace_tokens(max_model_len, max_num_seqs, block_size):
    """Rows of the chunked-context gather workspace (spec B.2)."""
    tokens = ctypes.c_int64()
    call("mlakit_chunked_prefill_workspace_tokens", to_int(max_model_len, "max_model_len"),
         to_int(max_num_seqs, "max_num_seqs"), to_int(block_size, "block_size"),
         ctypes.byref(tokens))
    return tokens.value


@dataclass(frozen=True)
class ContextChunk:
    """One chunk of context gathered into workspace rows [0, total_tokens)."""

    starts: np.ndarray        # [num_prefills] first context position gathered per request
    seq_lens: np.ndarray      # [num_prefills] context tokens gathered per request
    cu_seq_lens: np.ndarray   # [num_prefills + 1] workspace row offsets
    token_to_seq: np.ndarray  # [total_tokens] prefill request of each workspace row
    total_tokens: int
    max_seq_len: int


@dataclass(frozen=True)
class Plan:
    """The plan of one forward step (plan.hpp)."""

    num_reqs: int
    num_actual_tokens: int
    split: SplitCounts
    decode_query_len: int          # common q_len of the decodes (uniform), else 0
    max_decode_query_len: int
    decode_split_offsets: np.ndarray  # [num_decodes + 1] split-KV pieces, cumulative
    decode_split_len: np.ndarray      # [num_decodes] tokens per piece
    decode_total_splits: int
    decode_max_splits: int
    prefill_query_start_loc: np.ndarray  # [num_prefills + 1], rebased to 0
    prefill_max_query_len: int
    prefill_context_lens: np.ndarray     # [num_prefills]
    context_chunks: List[ContextChunk] = field(default_factory=list)

    @property
    def has_context(self):
        return bool(self.context_chunks)


def _array(getter, *args):
    data, length = _I32(), ctypes.c_int64()
    call(getter, *args, ctypes.byref(data), ctypes.byref(length))
    if length.value == 0:
        return np.zeros(0, dtype=np.int32)
    return np.ctypeslib.as_array(data, shape=(length.value,)).copy()


def plan_from_handle(handle):
    """Copies a C plan into a Plan and releases the handle."""
    try:
        s = PlanSummaryC()
        call("mlakit_plan_get_summary", handle, ctypes.byref(s))
        chunks = []
        for i in range(s.num_context_chunks):
            total, longest = ctypes.c_int64(), ctypes.c_int64()
            call("mlakit_plan_get_chunk_info", handle, i, ctypes.byref(total),
                 ctypes.byref(longest))
            arrays = [_array("mlakit_plan_get_chunk_array", handle, i, which) for which in range(4)]
            chunks.append(ContextChunk(*arrays, total.value, longest.value))
        arrays = [_array("mlakit_plan_get_array", handle, which) for which in range(4)]
        return Plan(
            num_reqs=s.num_reqs,
            num_actual_tokens=s.num_actual_tokens,
            split=SplitCounts._from_c(s.split),
            decode_query_len=s.decode_query_len,
            max_decode_query_len=s.max_decode_query_len,
            decode_split_offsets=arrays[2],
            decode_split_len=arrays[3],
            decode_total_splits=s.decode_total_splits,
            decode_max_splits=s.decode_max_splits,
            prefill_query_start_loc=arrays[0],
            prefill_max_query_len=s.prefill_max_query_len,
            prefill_context_lens=arrays[1],
            context_chunks=chunks,
        )
    finally:
        lib.mlakit_plan_destroy(handle)


def plan(query_start_loc, seq_lens, block_table_width, workspace_tokens, num_actual_tokens=None,
         block_size=64, decode_threshold=1, query_len_support="varlen", chunk_policy="packed",
         num_workers=1):
    """The plan of one forward step (make_plan). query_start_loc: [R + 1] (decodes first);
    seq_lens: [R] context + new tokens; block_table_width: columns of the block table;
    workspace_tokens: rows of the gather workspace; num_actual_tokens defaults to
    query_start_loc[-1]; query_len_support: 'single_only', 'uniform' or 'varlen';
    chunk_policy: 'equal_share' or 'packed'."""
    qsl = host_int32(query_start_loc, "query_start_loc")
    lens = host_int32(seq_lens, "seq_lens")
    if qsl.size != lens.size + 1:
        raise ValueError(f"mlakit: query_start_loc must have len(seq_lens) + 1 = {lens.size + 1} "
                         f"entries, got {qsl.size}")
    config = PlannerConfigC()
    lib.mlakit_planner_config_init(ctypes.byref(config))
    config.block_size = to_int(block_size, "block_size")
    config.decode_threshold = to_int(decode_threshold, "decode_threshold")
    config.query_len_support = _enum(QUERY_LEN_SUPPORT, query_len_support, "query_len_support")
    config.chunk_policy = _enum(CHUNK_POLICY, chunk_policy, "chunk_policy")
    config.workspace_tokens = to_int(workspace_tokens, "workspace_tokens")
    config.num_workers = to_int(num_workers, "num_workers")
    tokens = (int(qsl[-1]) if num_actual_tokens is None
              else to_int(num_actual_tokens, "num_actual_tokens"))
    handle = ctypes.c_void_p()
    call("mlakit_make_plan", _ptr(qsl), _ptr(lens), lens.size, tokens,
         to_int(block_table_width, "block_table_width"),
         ctypes.byref(config), ctypes.byref(handle))
    return plan_from_handle(handle)


__all__ = [
    "ContextChunk",
    "Plan",
    "SplitCounts",
    "chunked_prefill_workspace_tokens",
    "plan",
    "reorder_decodes_first",
    "split_decodes_and_prefills",
]
