"""Finds and loads libmlakit_c.so, declares the C functions, and turns status codes into
Python exceptions.

Where the library is looked for, first hit wins:

1. ``$MLAKIT_LIBRARY``: the path of the library file (an error if it does not exist);
2. ``mlakit/_lib/libmlakit_c.so`` inside this package: the copy that ``pip install ./python``
   takes from the CMake build (see setup.py);
3. ``<checkout>/build/release/src/capi/libmlakit_c.so`` when this package is imported from a
   source checkout (``PYTHONPATH=python`` or an editable install);
4. ``libmlakit_c.so`` through the dynamic loader (``LD_LIBRARY_PATH``, system directories).
"""

import ctypes
import os
from pathlib import Path

from ._dlpack import DLDataType, DLDevice, DLTensor

LIBRARY_NAME = "libmlakit_c.so"
# The C ABI this package was written against (MLAKIT_C_ABI_VERSION of mlakit.h).
ABI_VERSION = 4

_PACKAGE_DIR = Path(__file__).resolve().parent


class MlakitError(Exception):
    """An error reported by the mlakit library; ``status`` names its kind."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


class MlakitValueError(MlakitError, ValueError):
    """Invalid argument or out-of-range index."""


class MlakitNotImplementedError(MlakitError, NotImplementedError):
    """A valid request this build or backend cannot serve (e.g. CUDA tensors, CPU-only build)."""


class MlakitRuntimeError(MlakitError, RuntimeError):
    """A backend failure (CUDA, BLAS, memory) or an internal error."""


# Status codes of mlakit.h (mlakit_status_t) -> (name, exception class).
_STATUS = {
    1: ("invalid_argument", MlakitValueError),
    2: ("out_of_range", MlakitValueError),
    3: ("unsupported", MlakitNotImplementedError),
    4: ("backend", MlakitRuntimeError),
    5: ("internal", MlakitRuntimeError),
}


def _candidates():
    env = os.environ.get("MLAKIT_LIBRARY")
    if env:
        return [("MLAKIT_LIBRARY", Path(env))]
    candidates = [("package copy", _PACKAGE_DIR / "_lib" / LIBRARY_NAME)]
    checkout = _PACKAGE_DIR.parent.parent
    if (checkout / "CMakePresets.json").is_file():  # imported from the source tree
        build = checkout / "build" / "release" / "src" / "capi"
        candidates.append(("source checkout build", build / LIBRARY_NAME))
    candidates.append(("dynamic loader", None))
    return candidates


def _load():
    tried = []
    for origin, path in _candidates():
        if path is None:
            try:
                return ctypes.CDLL(LIBRARY_NAME), LIBRARY_NAME
            except OSError as e:
                tried.append(f"{origin}: {e}")
                continue
        if not path.is_file():
            tried.append(f"{origin}: {path} does not exist")
            if origin == "MLAKIT_LIBRARY":
                break
            continue
        return ctypes.CDLL(str(path)), str(path)
    raise ImportError(
        "mlakit: cannot find the native library libmlakit_c.so. Build it "
        "(cmake --preset release && cmake --build --preset release) and reinstall the package "
        "(pip install ./python), or point MLAKIT_LIBRARY at the file. Tried: " + "; ".join(tried)
    )


lib, library_path = _load()

_c = ctypes
_P = ctypes.POINTER
_T = _P(DLTensor)  # const DLTensor* (None passes NULL)
_i32 = _c.c_int32
_i64 = _c.c_int64
_f32 = _c.c_float
_vp = _c.c_void_p
_pi32 = _P(_c.c_int32)
_pi64 = _P(_c.c_int64)


class SplitCountsC(ctypes.Structure):
    _fields_ = [
        ("num_decodes", _i64),
        ("num_prefills", _i64),
        ("num_decode_tokens", _i64),
        ("num_prefill_tokens", _i64),
    ]


class PlannerConfigC(ctypes.Structure):
    _fields_ = [
        ("block_size", _i64),
        ("decode_threshold", _i64),
        ("query_len_support", _i32),
        ("chunk_policy", _i32),
        ("workspace_tokens", _i64),
        ("num_workers", _i64),
    ]


class PlanSummaryC(ctypes.Structure):
    _fields_ = [
        ("num_reqs", _i64),
        ("num_actual_tokens", _i64),
        ("split", SplitCountsC),
        ("decode_query_len", _i64),
        ("max_decode_query_len", _i64),
        ("prefill_max_query_len", _i64),
        ("num_context_chunks", _i64),
        ("decode_total_splits", _i64),
        ("decode_max_splits", _i64),
    ]


class MlaConfigC(ctypes.Structure):
    _fields_ = [
        ("num_heads", _i64),
        ("kv_lora_rank", _i64),
        ("qk_rope_head_dim", _i64),
        ("qk_nope_head_dim", _i64),
        ("v_head_dim", _i64),
        ("scale", _f32),
        ("act_dtype", DLDataType),
        ("kv_cache_dtype", _i32),
        ("block_size", _i64),
        ("decode_threshold", _i64),
        ("query_len_support", _i32),
        ("chunk_policy", _i32),
        ("workspace_tokens", _i64),
        ("max_model_len", _i64),
        ("max_num_seqs", _i64),
        ("max_num_batched_tokens", _i64),
        ("batch_invariant", _i32),
        ("device", DLDevice),
        ("dcp_world_size", _i64),
        ("dcp_rank", _i64),
        ("dcp_interleave", _i64),
    ]


# mlakit_all_gather_fn / mlakit_reduce_scatter_sum_fn: (user_data, send, recv, count, dtype,
# stream) -> status.
CollectiveFn = ctypes.CFUNCTYPE(_i32, _vp, _vp, _vp, _i64, DLDataType, _vp)


class CommunicatorCallbacksC(ctypes.Structure):
    _fields_ = [
        ("rank", _i32),
        ("world_size", _i32),
        ("device", DLDevice),
        ("all_gather", CollectiveFn),
        ("reduce_scatter_sum", CollectiveFn),
        ("user_data", _vp),
    ]


class DecodePlanShapeC(ctypes.Structure):
    _fields_ = [
        ("device", DLDevice),
        ("batch", _i64),
        ("s_q", _i64),
        ("num_heads", _i64),
        ("block_size", _i64),
        ("max_seq_len", _i64),
        ("batch_invariant", _i32),
    ]


class ForwardBatchC(ctypes.Structure):
    _fields_ = [
        ("query_start_loc", _pi32),
        ("seq_lens", _pi32),
        ("num_reqs", _i64),
        ("num_actual_tokens", _i64),
        ("block_table", _T),
        ("slot_mapping", _T),
    ]


class StepPlanInfoC(ctypes.Structure):
    _fields_ = [
        ("num_reqs", _i64),
        ("num_actual_tokens", _i64),
        ("split", SplitCountsC),
        ("num_context_chunks", _i64),
        ("workspace_bytes_used", _i64),
    ]


# name -> argument types; every function returns mlakit_status_t unless listed in _OTHER.
_STATUS_FUNCTIONS = {
    "mlakit_parse_kv_cache_dtype": [_c.c_char_p, _pi32],
    "mlakit_concat_and_cache_mla": [_T, _T, _T, _T, _i32, _f32, _vp],
    "mlakit_gather_and_maybe_dequant_cache": [_T, _T, _T, _T, _T, _i64, _i32, _f32, _T, _vp],
    "mlakit_cp_gather_cache": [_T, _T, _T, _T, _i64, _T, _vp],
    "mlakit_merge_attn_states": [_T, _T, _T, _T, _T, _T, _vp],
    "mlakit_dcp_lse_combine": [_T, _T, _T, _T, _vp],
    "mlakit_dcp_lse_correct": [_T, _T, _i64, _T, _vp],
    "mlakit_scaled_fp8_quant": [_T, _T, _f32, _vp],
    "mlakit_concat_and_cache_mla_tensor_scale": [_T, _T, _T, _T, _i32, _T, _vp],
    "mlakit_gather_and_maybe_dequant_cache_tensor_scale": [_T, _T, _T, _T, _T, _i64, _i32, _T, _T,
                                                           _vp],
    "mlakit_scaled_fp8_quant_tensor_scale": [_T, _T, _T, _vp],
    "mlakit_dynamic_scaled_fp8_quant": [_T, _T, _T, _vp],
    "mlakit_check_device_errors": [_i32, _i32, _vp],
    "mlakit_mla_decode": [_T, _T, _T, _T, _T, _T, _i64, _f32, _i32, _f32, _f32],
    "mlakit_plan_mla_decode": [_P(DecodePlanShapeC), _pi32, _P(_vp)],
    "mlakit_plan_decode_splits": [_pi32, _i64, _i64, _i64, _P(_vp)],
    "mlakit_decode_schedule_info": [_vp, _pi64, _pi64],
    "mlakit_decode_workspace_elems": [_vp, _i64, _i64, _i64, _pi64],
    "mlakit_mla_decode_scheduled": [_T, _T, _T, _T, _T, _T, _i64, _f32, _i32, _f32, _f32, _vp, _T,
                                    _vp],
    "mlakit_mla_decode_tensor_scale": [_T, _T, _T, _T, _T, _T, _i64, _f32, _i32, _T, _T],
    "mlakit_mla_decode_scheduled_tensor_scale": [_T, _T, _T, _T, _T, _T, _i64, _f32, _i32, _T, _T,
                                                 _vp, _T, _vp],
    "mlakit_mla_prefill": [_T, _T, _T, _T, _T, _T, _i64, _i64, _f32, _i32, _T, _T, _vp],
    "mlakit_split_decodes_and_prefills": [_pi32, _i64, _i64, _i64, _i32, _P(SplitCountsC)],
    "mlakit_reorder_decodes_first": [_pi32, _pi32, _i64, _i64, _pi32],
    "mlakit_chunked_prefill_workspace_tokens": [_i64, _i64, _i64, _pi64],
    "mlakit_make_plan": [_pi32, _pi32, _i64, _i64, _i64, _P(PlannerConfigC), _P(_vp)],
    "mlakit_plan_get_summary": [_vp, _P(PlanSummaryC)],
    "mlakit_plan_get_array": [_vp, _i32, _P(_pi32), _pi64],
    "mlakit_plan_get_chunk_info": [_vp, _i64, _pi64, _pi64],
    "mlakit_plan_get_chunk_array": [_vp, _i64, _i32, _P(_pi32), _pi64],
    "mlakit_attention_create": [_P(MlaConfigC), _T, _T, _P(_vp)],
    "mlakit_communicator_create": [_P(CommunicatorCallbacksC), _P(_vp)],
    "mlakit_attention_create_dcp": [_P(MlaConfigC), _T, _T, _vp, _P(_vp)],
    "mlakit_attention_workspace_tokens": [_vp, _pi64],
    "mlakit_attention_plan": [_vp, _P(ForwardBatchC), _P(_vp)],
    "mlakit_attention_forward": [_vp, _T, _T, _T, _T, _P(ForwardBatchC), _T, _f32, _f32, _vp],
    "mlakit_workspace_bytes": [_P(MlaConfigC), _pi64],
    "mlakit_workspace_create": [_P(MlaConfigC), _P(_vp)],
    "mlakit_workspace_get_bytes": [_vp, _pi64],
    "mlakit_workspace_touch": [_vp, _vp],
    "mlakit_plan_step": [_P(MlaConfigC), _P(ForwardBatchC), _vp, _vp, _P(_vp)],
    "mlakit_step_plan_get_info": [_vp, _P(StepPlanInfoC)],
    "mlakit_step_plan_get_plan": [_vp, _P(_vp)],
    "mlakit_step_plan_same_launches": [_vp, _vp, _pi32],
    "mlakit_attention_forward_step": [_vp, _T, _T, _T, _T, _vp, _T, _f32, _f32, _vp],
}
_OTHER_FUNCTIONS = {
    "mlakit_last_error": (_c.c_char_p, []),
    "mlakit_status_name": (_c.c_char_p, [_i32]),
    "mlakit_version": (_c.c_char_p, []),
    "mlakit_abi_version": (_i32, []),
    "mlakit_build_info": (_c.c_char_p, []),
    "mlakit_decode_schedule_destroy": (None, [_vp]),
    "mlakit_plan_destroy": (None, [_vp]),
    "mlakit_planner_config_init": (None, [_P(PlannerConfigC)]),
    "mlakit_mla_config_init": (None, [_P(MlaConfigC)]),
    "mlakit_attention_destroy": (None, [_vp]),
    "mlakit_communicator_destroy": (None, [_vp]),
    "mlakit_workspace_destroy": (None, [_vp]),
    "mlakit_step_plan_destroy": (None, [_vp]),
}

for _name, _argtypes in _STATUS_FUNCTIONS.items():
    _fn = getattr(lib, _name)
    _fn.argtypes = _argtypes
    _fn.restype = _c.c_int
for _name, (_restype, _argtypes) in _OTHER_FUNCTIONS.items():
    _fn = getattr(lib, _name)
    _fn.argtypes = _argtypes
    _fn.restype = _restype

if lib.mlakit_abi_version() != ABI_VERSION:
    raise ImportError(
        f"mlakit: {library_path} has C ABI version {lib.mlakit_abi_version()}, this package "
        f"needs {ABI_VERSION}; rebuild the library and reinstall the package together"
    )


def check(status):
    """Raises the exception of a non-zero status with the library's message."""
    if status == 0:
        return
    name, cls = _STATUS.get(status, ("unknown", MlakitRuntimeError))
    message = lib.mlakit_last_error().decode("utf-8", "replace")
    raise cls(message, name)


def call(name, *args):
    """Calls the C function `name` and raises on a non-zero status."""
    check(getattr(lib, name)(*args))
