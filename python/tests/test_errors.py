"""Errors reach Python as exceptions of the right class carrying the library's message."""

import ml_dtypes
import numpy as np
import pytest

import mlakit


def merge_args(lse_dtype=np.float32):
    out = np.zeros((2, 2, 4), np.float32)
    return out, out.copy(), np.zeros((2, 2), lse_dtype), out.copy(), np.zeros((2, 2), np.float32)


def test_invalid_argument_is_a_value_error_with_the_message():
    with pytest.raises(ValueError) as info:
        mlakit.merge_attn_states(*merge_args(np.float16))
    expected = "merge_attn_states: prefix_lse must have dtype f32, got f16"
    assert str(info.value) == expected
    assert isinstance(info.value, mlakit.MlakitError)
    assert info.value.status == "invalid_argument"


def test_out_of_range_index_is_a_value_error():
    cache = np.zeros((2, 4, 8), np.float32)
    dst = np.zeros((3, 8), np.float32)
    block_table = np.array([[0, 5]], dtype=np.int32)  # block 5 of a 2-block cache
    cu = np.array([0, 3], dtype=np.int32)
    message = r"cp_gather_cache: block_table\[0, 1\] = 5 .* is not a block id in \[0, 2\)"
    with pytest.raises(ValueError, match=message) as info:
        mlakit.cp_gather_cache(cache, dst, block_table, cu, 1, seq_starts=np.array([4], np.int32))
    assert info.value.status == "out_of_range"


def test_unsupported_device_is_not_implemented():
    if mlakit.build_info()["cuda"]:
        pytest.skip("this build has the CUDA backend")
    config = mlakit.MlaConfig(scale=0.1, num_heads=2, kv_lora_rank=32, qk_rope_head_dim=8,
                              qk_nope_head_dim=16, v_head_dim=16, act_dtype="float32",
                              device="cuda")
    with pytest.raises(NotImplementedError, match="cuda:0: mlakit was built without CUDA"):
        mlakit.MlaAttention(config, np.zeros((2 * 32, 32), np.float32))


def test_unknown_kv_cache_dtype_names_the_value():
    cache = np.zeros((1, 4, 12), np.float32)
    with pytest.raises(ValueError, match="got 'fp8_e5m2'"):
        mlakit.concat_and_cache_mla(np.zeros((1, 8), np.float32), np.zeros((1, 4), np.float32),
                                    cache, np.zeros(1, np.int64), "fp8_e5m2", 1.0)


def test_python_side_type_checks():
    out, prefix, p_lse, suffix, s_lse = merge_args()
    with pytest.raises(TypeError, match="prefix_output has dtype float64"):
        mlakit.merge_attn_states(out, prefix.astype(np.float64), p_lse, suffix, s_lse)
    with pytest.raises(TypeError, match="must be a numpy.ndarray or a torch.Tensor, got list"):
        mlakit.merge_attn_states(out, prefix.tolist(), p_lse, suffix, s_lse)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="output is written to but the array is read-only"):
        mlakit.merge_attn_states(out, prefix, p_lse, suffix, s_lse)
    with pytest.raises(ValueError, match="scale must have exactly one element"):
        mlakit.scaled_fp8_quant(prefix, np.ones(2, np.float32))


def test_scale_may_be_a_one_element_array():
    x = np.full((2, 3), 3.0, dtype=np.float32)
    out = mlakit.scaled_fp8_quant(x, np.array([2.0], dtype=np.float32))
    assert (out.astype(np.float32) == 1.5).all()
    assert out.dtype == ml_dtypes.float8_e4m3fn


def test_failed_call_leaves_outputs_and_the_next_call_works():
    out, prefix, p_lse, suffix, s_lse = merge_args()
    with pytest.raises(ValueError):
        mlakit.merge_attn_states(out, prefix, p_lse[:1], suffix, s_lse)
    mlakit.merge_attn_states(out, prefix, p_lse, suffix, s_lse)  # no stale error state


def test_check_device_errors_on_the_host_is_a_no_op():
    mlakit.check_device_errors()  # CPU ops report bad indices at once; nothing is recorded
    mlakit.check_device_errors("cpu")
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda', 'cuda:N' or an int"):
        mlakit.check_device_errors("tpu")


def test_check_device_errors_without_cuda_is_not_implemented():
    if mlakit.build_info()["cuda"]:
        pytest.skip("this build has the CUDA backend")
    with pytest.raises(NotImplementedError, match="cuda:0: mlakit was built without CUDA"):
        mlakit.check_device_errors("cuda:0")
