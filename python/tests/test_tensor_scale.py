"""Scales given as one-element float32 arrays / tensors (mlakit.ops.tensor_scale): on the host the
tensor entries of the library must give the bytes of the float entries, and the dynamic fp8 quant
must write scale = amax / 448 (f32) and the static codes with it. NumPy only, so these run without
torch; the torch custom ops are checked where torch is installed. CUDA: test_compat_vllm_cuda.py.
"""

import ml_dtypes
import numpy as np
import pytest

import mlakit


def scale_array(value):
    return np.array([value], dtype=np.float32)


def random_scale(rng):
    # 2^[-6, 4): the range of real k_scale / activation scales
    return np.float32(np.ldexp(rng.uniform(1.0, 2.0), int(rng.integers(-6, 4))))


def e4m3_bits(values):
    return np.asarray(values, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def test_concat_and_cache_mla_tensor_scale_equals_float_scale(rng):
    scale = random_scale(rng)
    kv_c = (rng.standard_normal((9, 32)) * 20).astype(np.float32)
    k_pe = (rng.standard_normal((9, 8)) * 20).astype(np.float32)
    slots = rng.permutation(24)[:9].astype(np.int64)
    slots[3] = -1
    caches = [np.full((3, 8, 40), 0xFF, np.uint8) for _ in range(2)]  # NaN codes
    mlakit.concat_and_cache_mla(kv_c, k_pe, caches[0], slots, "fp8", float(scale))
    mlakit.concat_and_cache_mla(kv_c, k_pe, caches[1], slots, "fp8", scale_array(scale))
    assert np.array_equal(caches[0], caches[1])
    # Independently: slot s of token t holds e4m3(x / scale) (x / scale exact in f32 here? no:
    # rounded once to f32, then to e4m3, which ml_dtypes does as one RNE step from f32).
    flat = caches[1].reshape(24, 40)
    for t, slot in enumerate(slots):
        if slot >= 0:
            x = np.concatenate([kv_c[t], k_pe[t]]) / scale
            assert np.array_equal(flat[slot], e4m3_bits(np.clip(x, -448, 448))), t
    assert (flat[[s for s in range(24) if s not in set(slots)]] == 0xFF).all()


def test_gather_tensor_scale_equals_float_scale(rng):
    scale = random_scale(rng)
    codes = rng.integers(0, 0x7F, (6, 4, 24)).astype(np.uint8)
    table = rng.permutation(6)[:4].reshape(2, 2).astype(np.int32)
    cu = np.array([0, 5, 8], np.int32)
    token_to_seq = np.array([0] * 5 + [1] * 3, np.int32)
    outs = [np.full((10, 24), np.nan, np.float32) for _ in range(2)]
    mlakit.gather_and_maybe_dequant_cache(codes, outs[0], table, cu, token_to_seq, 8, "fp8",
                                          float(scale))
    mlakit.gather_and_maybe_dequant_cache(codes, outs[1], table, cu, token_to_seq, 8, "fp8",
                                          scale_array(scale))
    assert np.array_equal(outs[0], outs[1], equal_nan=True)
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    want = [values[table[0, p // 4], p % 4] for p in range(5)]
    want += [values[table[1, p // 4], p % 4] for p in range(3)]
    assert np.array_equal(outs[1][:8], np.stack(want) * scale)
    assert np.isnan(outs[1][8:]).all()


def test_static_quant_tensor_scale_equals_float_scale(rng):
    scale = random_scale(rng)
    x = (rng.standard_normal((7, 33)) * 50).astype(np.float32)
    by_float = mlakit.scaled_fp8_quant(x, float(scale))
    by_tensor = mlakit.scaled_fp8_quant(x, scale_array(scale))
    assert np.array_equal(by_float.view(np.uint8), by_tensor.view(np.uint8))
    inverse = np.float32(1.0) / scale
    assert np.array_equal(by_tensor.view(np.uint8), e4m3_bits(np.clip(x * inverse, -448, 448)))


def test_tensor_scale_errors_name_the_scale(rng):
    x = np.ones((2, 4), np.float32)
    out = np.zeros((2, 4), ml_dtypes.float8_e4m3fn)
    with pytest.raises(mlakit.MlakitError, match="scaled_fp8_quant: scale must have exactly one "
                                                 r"element, got shape \[2\]"):
        mlakit.static_scaled_fp8_quant(out, x, np.ones(2, np.float32))
    with pytest.raises(mlakit.MlakitError, match="scale must be finite and > 0"):
        mlakit.static_scaled_fp8_quant(out, x, scale_array(np.nan))


def test_dynamic_quant_writes_amax_over_448_and_the_codes(rng):
    x = (rng.standard_normal((5, 40)) * rng.uniform(0.1, 300)).astype(np.float32)
    out = np.zeros((5, 40), ml_dtypes.float8_e4m3fn)
    scale = scale_array(np.nan)
    mlakit.dynamic_scaled_fp8_quant(out, x, scale)
    want = np.float32(np.abs(x).max()) / np.float32(448.0)
    assert scale[0] == want
    assert np.array_equal(out.view(np.uint8),
                          e4m3_bits(np.clip(x * (np.float32(1) / want), -448, 448)))


def test_dynamic_quant_zero_and_inf_inputs():
    out = np.full((2, 3), 0x7F, np.uint8)
    scale = scale_array(3.0)
    mlakit.dynamic_scaled_fp8_quant(out, np.array([[0.0, -0.0, 0.0]] * 2, np.float32), scale)
    assert scale[0] == 0.0 and (out == 0).all()
    with pytest.raises(mlakit.MlakitError, match="has no finite reciprocal"):
        mlakit.dynamic_scaled_fp8_quant(out, np.array([[1.0, np.inf, 0.0]], np.float32)
                                        .repeat(2, 0), scale)
    assert np.isinf(scale[0])


def decode_batch(rng, seq_lens, block, width):
    """fp8 q and fp8_e4m3 cache codes of a paged batch: (q codes [B, 1, N, D], cache codes,
    block_table). NaN codes in slots no request reads."""
    heads, dim = 2, width
    batch = len(seq_lens)
    cols = max(1, max(-(-int(n) // block) for n in seq_lens))
    num_blocks = batch * cols + 2
    table = rng.permutation(num_blocks)[:batch * cols].reshape(batch, cols).astype(np.int32)
    cache = np.full((num_blocks, block, dim), 0x7F, np.uint8)  # e4m3 NaN
    for b, n in enumerate(seq_lens):
        for p in range(n):
            cache[table[b, p // block], p % block] = e4m3_bits(rng.standard_normal(dim) * 3)
    q = e4m3_bits(rng.standard_normal((batch, 1, heads, dim)) * 3)
    return q, cache, table


@pytest.mark.parametrize("scheduled", [False, True])
def test_decode_per_request_scale_arrays_match_fp64(rng, scheduled):
    from reference import mqa_decode

    rank, block, scale = 24, 4, 0.2
    seq_lens = np.array([5, 0, 13, 1], np.int32)
    q, cache, table = decode_batch(rng, seq_lens, block, rank + 8)
    q_scales = np.array([0.5, 2.0, 0.125, 1.5], np.float32)
    k_scales = np.array([0.75, 4.0, 0.25, 3.0], np.float32)
    out = np.full((4, 1, 2, rank), np.nan, np.float32)
    lse = np.full((4, 1, 2), np.nan, np.float32)
    kwargs = {}
    if scheduled:
        schedule = mlakit.DecodeSchedule(seq_lens, block, num_workers=3)
        kwargs = dict(schedule=schedule,
                      split_workspace=np.empty(schedule.workspace_elems(1, 2, rank), np.float32))
    mlakit.mla_decode(q.view(ml_dtypes.float8_e4m3fn), cache, table, seq_lens, out, lse, scale,
                      "fp8", q_scales, k_scales, kv_lora_rank=rank, **kwargs)
    values = lambda codes: codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)  # noqa: E731
    for b in range(4):  # request b sees q = code * q_scales[b], K = V = code * k_scales[b]
        ref, ref_lse = mqa_decode(values(q[b:b + 1]) * q_scales[b],
                                  values(cache) * k_scales[b], table[b:b + 1],
                                  seq_lens[b:b + 1], rank, scale)
        np.testing.assert_allclose(out[b:b + 1], ref, rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(lse[b:b + 1], ref_lse, rtol=1e-4, atol=1e-4)


def test_decode_one_element_scale_arrays_equal_floats(rng):
    rank, block = 24, 4
    seq_lens = np.array([6, 9], np.int32)
    q, cache, table = decode_batch(rng, seq_lens, block, rank + 8)
    outs = [np.full((2, 1, 2, rank), np.nan, np.float32) for _ in range(3)]
    lses = [np.full((2, 1, 2), np.nan, np.float32) for _ in range(3)]
    q8 = q.view(ml_dtypes.float8_e4m3fn)
    for i, (qs, ks) in enumerate([(0.375, 1.25), (scale_array(0.375), scale_array(1.25)),
                                  (scale_array(0.375), 1.25)]):  # a float beside a tensor too
        mlakit.mla_decode(q8, cache, table, seq_lens, outs[i], lses[i], 0.3, "fp8", qs, ks,
                          kv_lora_rank=rank)
    for i in (1, 2):
        assert np.array_equal(outs[0], outs[i]) and np.array_equal(lses[0], lses[i])
    # k_scale 1 beside a tensor q_scale goes to the library as NULL (its default, 1)
    results = []
    for qs in (0.375, scale_array(0.375)):
        out, lse = np.full_like(outs[0], np.nan), np.full_like(lses[0], np.nan)
        mlakit.mla_decode(q8, cache, table, seq_lens, out, lse, 0.3, "fp8", qs, 1.0,
                          kv_lora_rank=rank)
        results.append((out, lse))
    assert np.array_equal(results[0][0], results[1][0])
    assert np.array_equal(results[0][1], results[1][1])


def test_decode_scale_array_errors_name_the_scale(rng):
    rank, block = 24, 4
    seq_lens = np.array([6, 9], np.int32)
    q, cache, table = decode_batch(rng, seq_lens, block, rank + 8)
    out = np.zeros((2, 1, 2, rank), np.float32)
    lse = np.zeros((2, 1, 2), np.float32)
    args = (q.view(ml_dtypes.float8_e4m3fn), cache, table, seq_lens, out, lse, 0.3, "fp8")
    with pytest.raises(mlakit.MlakitError,
                       match=r"mla_decode: k_scale\[1\] must be finite and > 0"):
        mlakit.mla_decode(*args, 1.0, np.array([1.0, np.inf], np.float32), kv_lora_rank=rank)
    with pytest.raises(mlakit.MlakitError, match="mla_decode: q_scale must be finite and > 0"):
        mlakit.mla_decode(*args, scale_array(0.0), 1.0, kv_lora_rank=rank)
    with pytest.raises(mlakit.MlakitError, match=r"mla_decode: q_scale must have exactly one "
                                                 r"element or the shape \[B\] = \[2\]"):
        mlakit.mla_decode(*args, np.ones(3, np.float32), 1.0, kv_lora_rank=rank)


def test_torch_tensor_scale_ops():
    torch = pytest.importorskip("torch")
    if not mlakit.torch_ops_registered:
        pytest.skip("torch ops not registered")
    x = torch.randn(4, 16) * 10
    scale = torch.tensor([0.25])
    out = torch.empty(4, 16, dtype=torch.float8_e4m3fn)
    torch.ops.mlakit.static_scaled_fp8_quant_tensor_scale(out, x, scale)
    assert torch.equal(out.view(torch.uint8), mlakit.scaled_fp8_quant(x, 0.25).view(torch.uint8))
    dyn_scale = torch.empty(1)
    torch.ops.mlakit.dynamic_scaled_fp8_quant(out, x, dyn_scale)
    assert dyn_scale.item() == (x.abs().max() / 448.0).item()
