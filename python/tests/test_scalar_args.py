"""Scalar arguments of wrong types or out of the C types' ranges raise TypeError / ValueError
naming the argument. Before, int() truncated floats (num_tokens=2.7 gathered 2 rows), ctypes
kept the low bits of large ints (max_seqlen 2**64 + 2 became 2; kv_cache_dtype 2**32 became 0,
'auto'), and None / strings passed as flags were read as truth values."""

import numpy as np
import pytest

import mlakit
from mlakit import ops

F32 = np.float32


def gather_args(num_tokens):
    """A valid gather of 2 rows (auto cache of 2 blocks of 4 entries, width 8) but num_tokens."""
    src = np.arange(2 * 4 * 8, dtype=F32).reshape(2, 4, 8)
    dst = np.zeros((3, 8), F32)
    return (src, dst, np.array([[1, 0]], np.int32), np.array([0, 2], np.int32),
            np.zeros(3, np.int32), num_tokens)


def prefill(max_seqlen_q=2, causal=True):
    """A valid prefill of 2 queries and 2 keys (N 1, P 4, R 4, V 4) but the given arguments."""
    q = np.ones((2, 1, 8), F32)
    out = np.zeros((2, 1, 4), F32)
    ops.mla_prefill(q, np.ones((2, 1, 4), F32), np.ones((2, 4), F32), np.ones((2, 1, 4), F32),
                    np.array([0, 2], np.int32), np.array([0, 2], np.int32), max_seqlen_q, 2, 0.5,
                    causal, out)
    return out


def test_integers_of_any_integer_type_are_taken():
    for n in (2, np.int64(2), np.int32(2), np.array(2)):
        src, dst, *rest = gather_args(n)
        ops.gather_and_maybe_dequant_cache(src, dst, *rest)
        np.testing.assert_array_equal(dst[:2], src[1, :2])  # block 1, positions 0 and 1
        np.testing.assert_array_equal(dst[2], 0)


@pytest.mark.parametrize("bad", [2.7, 2.0, "2", None, True])
def test_a_non_integer_count_is_a_type_error(bad):
    src, dst, *rest = gather_args(bad)
    with pytest.raises(TypeError, match="num_tokens must be an integer"):
        ops.gather_and_maybe_dequant_cache(src, dst, *rest)
    np.testing.assert_array_equal(dst, 0)


def test_an_integer_past_int64_is_a_value_error_not_wrapped():
    src, dst, *rest = gather_args(2**64 + 2)  # ctypes passed 2
    with pytest.raises(ValueError, match="num_tokens must be in"):
        ops.gather_and_maybe_dequant_cache(src, dst, *rest)
    with pytest.raises(ValueError, match="max_seqlen_q must be in"):
        prefill(max_seqlen_q=2**64 + 2)
    with pytest.raises(ValueError, match="batch_size must be in"):
        ops.cp_gather_cache(np.zeros((2, 4, 8), F32), np.zeros((3, 8), F32),
                            np.zeros((1, 2), np.int32), np.array([0, 3], np.int32), -(2**64) + 1)


@pytest.mark.parametrize("bad", [None, "no", 0.0, 2])
def test_a_flag_must_be_a_bool(bad):
    with pytest.raises(TypeError, match="causal must be a bool"):
        prefill(causal=bad)
    with pytest.raises(TypeError, match="batch_invariant must be a bool"):
        ops.plan_mla_decode("cpu", 1, 1, 1, 16, 64, seq_lens=[5], batch_invariant=bad)


def test_flags_of_bool_types_are_taken():
    causal = prefill(causal=True)
    for flag in (np.True_, 1):
        np.testing.assert_array_equal(prefill(causal=flag), causal)


def test_cache_dtype_codes_are_int32_and_not_bools():
    kv = (np.ones((1, 4), F32), np.ones((1, 4), F32), np.zeros((2, 4, 8), F32),
          np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="kv_cache_dtype must be in"):
        ops.concat_and_cache_mla(*kv, 2**32)  # ctypes passed 0 (auto) and wrote the cache
    assert not kv[2].any()
    with pytest.raises(TypeError, match="kv_cache_dtype must be an integer, got a bool"):
        ops.concat_and_cache_mla(*kv, True)
    ops.concat_and_cache_mla(*kv, 0)  # the code of auto
    assert kv[2][0, 0].tolist() == [1.0] * 8


def test_k_pe_as_a_list_names_k_pe():
    with pytest.raises(TypeError, match="k_pe must be a numpy.ndarray or a torch.Tensor"):
        ops.concat_and_cache_mla(np.ones((1, 4), F32), [[1.0, 2.0, 3.0, 4.0]],
                                 np.zeros((2, 4, 8), F32), np.zeros(1, np.int64))


def test_a_bool_scale_is_a_type_error():
    with pytest.raises(TypeError, match="scale must be a number"):
        ops.concat_and_cache_mla(np.ones((1, 4), F32), np.ones((1, 4), F32),
                                 np.zeros((2, 4, 8), F32), np.zeros(1, np.int64), "auto", True)


def test_other_integer_arguments():
    with pytest.raises(TypeError, match="rank must be an integer"):
        ops.dcp_lse_correct(np.zeros((1, 2, 4), F32), np.zeros((2, 1, 2), F32), 1.5,
                            np.zeros((1, 2, 1, 4), F32))
    with pytest.raises(TypeError, match="batch must be an integer"):
        ops.plan_mla_decode("cpu", 1.0, 1, 1, 16, 64, seq_lens=[5])
    with pytest.raises(TypeError, match="decode_threshold must be an integer"):
        mlakit.split_decodes_and_prefills([0, 1, 2], decode_threshold=1.5)
    with pytest.raises(TypeError, match="position must be an integer"):
        mlakit.dcp_owner_rank(2.5, 2)  # returned 0.0
    with pytest.raises(TypeError, match="interleave must be an integer"):
        mlakit.dcp_local_position(3, 2, interleave=None)


def test_config_fields_past_int64_are_refused_not_wrapped():
    config = mlakit.MlaConfig(scale=0.1, num_heads=2**64 + 16)  # ctypes stored 16
    with pytest.raises(ValueError, match="MlaConfig.num_heads must be in"):
        mlakit.workspace_bytes(config)
    with pytest.raises(TypeError, match="MlaConfig.scale must be a number"):
        mlakit.workspace_bytes(mlakit.MlaConfig(scale="0.1"))  # float("0.1") took a string


def test_objects_of_the_wrong_class_are_type_errors():
    # These were AttributeErrors ('NoneType' object has no attribute 'query_start_loc' / '_to_c').
    config = mlakit.MlaConfig(scale=0.1, num_heads=2, kv_lora_rank=16, qk_rope_head_dim=4,
                              qk_nope_head_dim=4, v_head_dim=4, act_dtype="float32",
                              block_size=4, max_num_seqs=4, max_model_len=64)
    workspace = mlakit.Workspace(config)
    with pytest.raises(TypeError, match="batch must be a ForwardBatch, got NoneType"):
        mlakit.plan_step(config, None, workspace)
    with pytest.raises(TypeError, match="plan_step takes an MlaConfig, got dict"):
        mlakit.plan_step({"scale": 0.1}, None, workspace)
    with pytest.raises(TypeError, match="MlaAttention takes an MlaConfig, got NoneType"):
        mlakit.MlaAttention(None, np.ones((16, 16), F32))
    with pytest.raises(TypeError, match="Workspace takes an MlaConfig, got str"):
        mlakit.Workspace("config")
    with pytest.raises(TypeError, match="workspace_bytes takes an MlaConfig, got int"):
        mlakit.workspace_bytes(3)
    layer = mlakit.MlaAttention(config, np.ones((16, 16), F32))
    out = np.zeros((3, 8), F32)
    with pytest.raises(TypeError, match="batch must be a StepPlan, a ForwardBatch or None"):
        layer.forward(np.ones((3, 2, 8), F32), np.ones((3, 16), F32), np.ones((3, 4), F32),
                      np.zeros((4, 4, 20), F32), "batch", out)


def test_a_schedule_that_is_not_a_decode_schedule_is_a_type_error():
    # It was an AttributeError ('dict' object has no attribute '_handle').
    q = np.ones((1, 1, 1, 8), F32)
    out, lse = np.zeros((1, 1, 1, 4), F32), np.zeros((1, 1, 1), F32)
    with pytest.raises(TypeError, match="schedule must be a DecodeSchedule"):
        ops.mla_decode(q, np.ones((1, 4, 8), F32), np.zeros((1, 1), np.int32),
                       np.array([3], np.int32), out, lse, 0.5, schedule={"splits": 1},
                       split_workspace=np.zeros(64, F32), kv_lora_rank=4)


def test_scaled_fp8_quant_of_a_list_names_input():
    # It was an AttributeError ('list' object has no attribute 'shape').
    with pytest.raises(TypeError, match="input must be a numpy.ndarray or a torch.Tensor"):
        ops.scaled_fp8_quant([1.0, 2.0], 1.0)
