"""mlakit: Multi-head Latent Attention (MLA) for LLM inference, from NumPy and PyTorch.

A thin ctypes layer over the C ABI of the mlakit C++ library (include/mlakit/mlakit.h):
NumPy arrays and torch tensors are handed to the library without copies, as DLPack tensors.
When PyTorch is installed the ops are also registered as ``torch.ops.mlakit.*`` (set
``MLAKIT_DISABLE_TORCH=1`` to skip that).
"""

import importlib.util
import json
import os
import warnings

from ._library import (
    MlakitError,
    MlakitNotImplementedError,
    MlakitRuntimeError,
    MlakitValueError,
    lib,
    library_path,
)
from ._version import __version__
from .attention import MlaAttention, MlaConfig
from .communicator import Buffer, Communicator
from .dcp import dcp_local_position, dcp_local_seq_len, dcp_owner_rank
from .ops import (
    DecodeSchedule,
    check_device_errors,
    concat_and_cache_mla,
    cp_gather_cache,
    dcp_lse_combine,
    dcp_lse_correct,
    dynamic_scaled_fp8_quant,
    gather_and_maybe_dequant_cache,
    merge_attn_states,
    mla_decode,
    mla_prefill,
    plan_mla_decode,
    scaled_fp8_quant,
    static_scaled_fp8_quant,
)
from .planning import (
    ContextChunk,
    Plan,
    SplitCounts,
    chunked_prefill_workspace_tokens,
    plan,
    reorder_decodes_first,
    split_decodes_and_prefills,
)
from .step import ForwardBatch, StepPlan, Workspace, plan_step, workspace_bytes


def version():
    """Version of the loaded C library, e.g. '0.1.0'."""
    return lib.mlakit_version().decode()


def build_info():
    """The library's build as a dict: version, abi, cuda, blas, openmp, threads, sanitizers."""
    return json.loads(lib.mlakit_build_info().decode())


def _register_torch_ops():
    if os.environ.get("MLAKIT_DISABLE_TORCH") == "1" or importlib.util.find_spec("torch") is None:
        return False
    try:
        from . import _torch_ops  # noqa: F401  (registers torch.ops.mlakit.* on import)
    except Exception as e:  # an old or broken torch must not make the NumPy API unusable
        warnings.warn(f"mlakit: torch.ops.mlakit not registered: {e}", RuntimeWarning)
        return False
    return True


torch_ops_registered = _register_torch_ops()

__all__ = [
    "Buffer",
    "Communicator",
    "ContextChunk",
    "DecodeSchedule",
    "ForwardBatch",
    "MlaAttention",
    "MlaConfig",
    "MlakitError",
    "MlakitNotImplementedError",
    "MlakitRuntimeError",
    "MlakitValueError",
    "Plan",
    "SplitCounts",
    "StepPlan",
    "Workspace",
    "__version__",
    "build_info",
    "check_device_errors",
    "chunked_prefill_workspace_tokens",
    "concat_and_cache_mla",
    "cp_gather_cache",
    "dcp_local_position",
    "dcp_local_seq_len",
    "dcp_lse_combine",
    "dcp_lse_correct",
    "dcp_owner_rank",
    "dynamic_scaled_fp8_quant",
    "gather_and_maybe_dequant_cache",
    "library_path",
    "merge_attn_states",
    "mla_decode",
    "mla_prefill",
    "plan",
    "plan_mla_decode",
    "plan_step",
    "reorder_decodes_first",
    "scaled_fp8_quant",
    "split_decodes_and_prefills",
    "static_scaled_fp8_quant",
    "torch_ops_registered",
    "version",
    "workspace_bytes",
]
