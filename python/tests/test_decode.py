"""mla_decode and scaled_fp8_quant from NumPy against the fp64 MQA reference of reference.py."""

import re

import ml_dtypes
import numpy as np
import pytest

import mlakit
from reference import E4M3_VALUES, e4m3_encode, mqa_decode

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn
L, R, N, BLOCK = 64, 16, 4, 4
SCALE = 0.125  # softmax scale of these small heads (any positive value works)
# f32 accumulation over <= 150 keys; bf16 outputs add their rounding (2^-8 relative).
TOLERANCE = {np.float32: 2e-4, BF16: 1.6e-2}


def paged_batch(rng, seq_lens, extra_blocks=3):
    """A block table over a randomly permuted pool; returns (block_table, num_blocks)."""
    width = max(1, max(-(-s // BLOCK) for s in seq_lens))
    num_blocks = len(seq_lens) * width + extra_blocks
    table = rng.permutation(num_blocks)[:len(seq_lens) * width].reshape(len(seq_lens), width)
    return table.astype(np.int32), num_blocks


def poison_unused(cache, block_table, seq_lens, poison):
    """Slots past each request's length (and blocks nobody owns) hold `poison`."""
    used = np.zeros(cache.shape[:2], dtype=bool)
    for b, s in enumerate(seq_lens):
        for p in range(s):
            used[block_table[b, p // BLOCK], p % BLOCK] = True
    cache[~used] = poison


def check_close(out, lse, ref, ref_lse, dtype):
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_decode_auto_cache_matches_mqa_reference(rng, dtype, s_q):
    # empty, the shortest valid request (s_q keys: seq_lens count the new tokens), page ends
    seq_lens = np.array([0, s_q, BLOCK * 3 - 1, BLOCK * 3 + 1, 150], dtype=np.int32)
    block_table, num_blocks = paged_batch(rng, seq_lens)
    cache = rng.standard_normal((num_blocks, BLOCK, L + R)).astype(dtype)
    poison_unused(cache, block_table, seq_lens, np.nan)
    q = rng.standard_normal((len(seq_lens), s_q, N, L + R)).astype(dtype)
    out = np.full((len(seq_lens), s_q, N, L), np.nan, dtype=np.float32).astype(dtype)
    lse = np.full((len(seq_lens), s_q, N), np.nan, dtype=np.float32)

    mlakit.mla_decode(q, cache, block_table, seq_lens, out, lse, SCALE, kv_lora_rank=L)

    ref, ref_lse = mqa_decode(q.astype(np.float64), cache.astype(np.float64), block_table,
                              seq_lens, L, SCALE)
    check_close(out, lse, ref, ref_lse, dtype)
    assert (out[0] == 0).all() and np.isneginf(lse[0]).all()  # seq_len 0: empty


@pytest.mark.parametrize("fp8_q", [False, True])
def test_decode_fp8_cache_dequantizes_with_scales(rng, fp8_q):
    k_scale, q_scale = 0.5, 0.25
    seq_lens = np.array([7, 33], dtype=np.int32)
    block_table, num_blocks = paged_batch(rng, seq_lens)
    codes = e4m3_encode(rng.standard_normal((num_blocks, BLOCK, L + R)) * 4)
    poison_unused(codes, block_table, seq_lens, 0x7F)  # fp8 NaN
    q_values = rng.standard_normal((2, 1, N, L + R)).astype(np.float32)
    if fp8_q:
        q_codes = e4m3_encode(q_values / q_scale)
        q = q_codes.view(FP8)
        q_ref = E4M3_VALUES[q_codes] * q_scale
    else:
        q = q_values.astype(BF16)
        q_ref = q.astype(np.float64)
    out = np.full((2, 1, N, L), np.nan, dtype=np.float32)
    lse = np.full((2, 1, N), np.nan, dtype=np.float32)

    mlakit.mla_decode(q, codes, block_table, seq_lens, out, lse, SCALE, "fp8", q_scale=q_scale,
                      k_scale=k_scale, kv_lora_rank=L)

    cache_ref = E4M3_VALUES[codes] * k_scale
    ref, ref_lse = mqa_decode(q_ref, cache_ref, block_table, seq_lens, L, SCALE)
    check_close(out, lse, ref, ref_lse, np.float32)


def test_decode_with_schedule_and_caller_workspace(rng):
    seq_lens = np.array([300, 5, 129], dtype=np.int32)
    block_table, num_blocks = paged_batch(rng, seq_lens)
    cache = rng.standard_normal((num_blocks, BLOCK, L + R)).astype(np.float32)
    q = rng.standard_normal((3, 1, N, L + R)).astype(np.float32)
    out = np.empty((3, 1, N, L), dtype=np.float32)
    lse = np.empty((3, 1, N), dtype=np.float32)

    schedule = mlakit.DecodeSchedule(seq_lens, BLOCK, num_workers=8)
    assert schedule.max_splits > 1  # the long request is split, so partials get merged
    workspace = np.empty(schedule.workspace_elems(1, N, L), dtype=np.float32)
    mlakit.mla_decode(q, cache, block_table, seq_lens, out, lse, SCALE, schedule=schedule,
                      split_workspace=workspace, kv_lora_rank=L)

    ref, ref_lse = mqa_decode(q.astype(np.float64), cache.astype(np.float64), block_table,
                              seq_lens, L, SCALE)
    check_close(out, lse, ref, ref_lse, np.float32)


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_plan_mla_decode_gives_the_cpu_schedule(rng, batch_invariant):
    seq_lens = np.array([2500, 5, 0, 129], dtype=np.int32)
    block_table, num_blocks = paged_batch(rng, seq_lens)
    cache = rng.standard_normal((num_blocks, BLOCK, L + R)).astype(np.float32)
    q = rng.standard_normal((4, 2, N, L + R)).astype(np.float32)
    out = np.full((4, 2, N, L), np.nan, dtype=np.float32)
    lse = np.full((4, 2, N), np.nan, dtype=np.float32)

    schedule = mlakit.plan_mla_decode("cpu", 4, 2, N, BLOCK, block_table.shape[1] * BLOCK,
                                      seq_lens=seq_lens, batch_invariant=batch_invariant)
    if batch_invariant:  # pieces of at most 1024 keys, whatever the batch
        assert schedule.max_splits == 3
    workspace = np.empty(schedule.workspace_elems(2, N, L), dtype=np.float32)
    mlakit.mla_decode(q, cache, block_table, seq_lens, out, lse, SCALE, schedule=schedule,
                      split_workspace=workspace, kv_lora_rank=L)

    ref, ref_lse = mqa_decode(q.astype(np.float64), cache.astype(np.float64), block_table,
                              seq_lens, L, SCALE)
    check_close(out, lse, ref, ref_lse, np.float32)


def test_plan_mla_decode_checks_its_arguments():
    with pytest.raises(ValueError, match="the CPU plans from the lengths: seq_lens must have"):
        mlakit.plan_mla_decode("cpu", 2, 1, N, BLOCK, 64)
    with pytest.raises(ValueError, match="need batch >= 0, s_q >= 1"):
        mlakit.plan_mla_decode("cpu", 1, 0, N, BLOCK, 64, seq_lens=[3])
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or 'cuda:<index>'"):
        mlakit.plan_mla_decode("tpu", 1, 1, N, BLOCK, 64)
    if not mlakit.build_info()["cuda"]:
        with pytest.raises(NotImplementedError, match="no kernel for cuda:0"):
            mlakit.plan_mla_decode("cuda", 1, 1, N, BLOCK, 64)


def test_plan_mla_decode_refuses_seq_lens_of_another_length():
    # The C entry takes a pointer and reads `batch` lengths: one short array was read past its
    # end (a garbage length in the error, or a schedule planned from whatever followed).
    for lens in ([3], [3, 4, 5]):
        with pytest.raises(ValueError, match=re.escape(
                f"plan_mla_decode: seq_lens must have batch = 2 entries, got {len(lens)}")):
            mlakit.plan_mla_decode("cpu", 2, 1, N, BLOCK, 2**31 - 1, seq_lens=lens)


def test_plan_mla_decode_refuses_a_seq_len_above_max_seq_len_on_the_cpu():
    # max_seq_len bounds every seq_len; the CPU has the lengths and checks them at the call (a
    # stress finding: it accepted them).
    mlakit.plan_mla_decode("cpu", 2, 1, N, BLOCK, 64, seq_lens=[64, 3])
    with pytest.raises(ValueError, match=re.escape(
            "plan_mla_decode: seq_lens[1] (65) exceeds shape.max_seq_len (64)")):
        mlakit.plan_mla_decode("cpu", 2, 1, N, BLOCK, 64, seq_lens=[3, 65])


def test_decode_schedule_needs_workspace(rng):
    seq_lens = np.array([4], dtype=np.int32)
    schedule = mlakit.DecodeSchedule(seq_lens, BLOCK)
    args = (np.zeros((1, 1, N, L + R), np.float32), np.zeros((1, BLOCK, L + R), np.float32),
            np.zeros((1, 1), np.int32), seq_lens, np.zeros((1, 1, N, L), np.float32),
            np.zeros((1, 1, N), np.float32), SCALE)
    with pytest.raises(ValueError, match="a schedule needs its split_workspace"):
        mlakit.mla_decode(*args, schedule=schedule, kv_lora_rank=L)
    with pytest.raises(ValueError, match="split_workspace must hold at least"):
        mlakit.mla_decode(*args, schedule=schedule, split_workspace=np.zeros(1, np.float32),
                          kv_lora_rank=L)
    with pytest.raises(TypeError, match="kv_lora_rank"):
        mlakit.mla_decode(*args)  # L is required: out's last dimension is checked against it


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_scaled_fp8_quant_multiplies_by_the_reciprocal(rng, dtype):
    x = (rng.standard_normal((7, 33)) * 200).astype(dtype)
    scale = np.float32(0.3)
    inverse = np.float32(1.0) / scale
    expected = e4m3_encode(x.astype(np.float32) * inverse)  # x * (1 / scale) in f32, saturated

    out = mlakit.scaled_fp8_quant(x, float(scale))
    assert out.dtype == FP8
    assert np.array_equal(out.view(np.uint8), expected)

    into = np.zeros(x.shape, dtype=np.uint8)
    mlakit.static_scaled_fp8_quant(into, x, float(scale))
    assert np.array_equal(into, expected)
