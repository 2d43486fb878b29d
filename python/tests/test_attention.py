"""MlaAttention from NumPy against a fp64 NumPy MLA in the non-absorbed form: every key is
up-projected through kv_b_proj into per-head k_nope and v, then ordinary causal attention."""

import ml_dtypes
import numpy as np
import pytest

import mlakit
from layer_case import BLOCK, L, N, P, R, V, Batch, config
from reference import E4M3_VALUES, e4m3_encode

WEIGHT_BLOCK = 128  # DeepSeek-V3 fp8 checkpoints: one scale per 128 x 128 block


def check_forward(layer, batch, weight, tol):
    output = np.full((batch.T + batch.padding, N * V), np.nan, dtype=np.float32)
    output = output.astype(batch.q.dtype)
    layer.forward(batch.q, batch.kv_c, batch.k_pe, batch.cache, batch.forward_batch(), output)
    np.testing.assert_allclose(output[:batch.T].astype(np.float64), batch.reference(weight),
                               rtol=tol, atol=tol)
    assert np.isnan(output[batch.T:].astype(np.float32)).all()  # padding rows untouched
    for t, slot in enumerate(batch.slot_mapping):  # the new tokens were cached
        written = batch.cache[slot // BLOCK, slot % BLOCK]
        assert np.array_equal(written, np.concatenate([batch.kv_c[t], batch.k_pe[t, 0]]))


def test_forward_matches_non_absorbed_reference(rng):
    batch = Batch(rng)
    weight = (rng.standard_normal((N * (P + V), L)) / np.sqrt(L)).astype(np.float32)
    layer = mlakit.MlaAttention(config(), weight)
    plan = layer.plan(batch.forward_batch())
    assert plan.split == mlakit.SplitCounts(2, 2, 2, 10)
    assert len(plan.context_chunks) >= 3  # 37 context tokens through a 16-row workspace
    check_forward(layer, batch, weight.astype(np.float64), tol=2e-4)  # f32 end to end


def test_forward_bf16_matches_reference_on_rounded_inputs(rng):
    # The reference sees the bf16 inputs exactly; the tolerance covers the layer's bf16
    # intermediates (up-projected keys, absorbed queries, latent outputs: 2^-8 relative each).
    batch = Batch(rng, ml_dtypes.bfloat16)
    weight = (rng.standard_normal((N * (P + V), L)) / np.sqrt(L)).astype(ml_dtypes.bfloat16)
    layer = mlakit.MlaAttention(config(act_dtype="bfloat16"), weight)
    check_forward(layer, batch, weight.astype(np.float64), tol=3e-2)


def test_forward_with_fp8_block_quantized_kv_b_proj(rng):
    batch = Batch(rng)
    rows, blocks = N * (P + V), (-(-N * (P + V) // WEIGHT_BLOCK), -(-L // WEIGHT_BLOCK))
    scale_inv = rng.uniform(0.002, 0.02, blocks).astype(np.float32)  # [2, 2]
    per_element = np.repeat(np.repeat(scale_inv, WEIGHT_BLOCK, 0), WEIGHT_BLOCK, 1)[:rows, :L]
    codes = e4m3_encode(rng.standard_normal((rows, L)) * 0.05 / per_element)
    weight = E4M3_VALUES[codes] * per_element  # what the checkpoint means
    layer = mlakit.MlaAttention(config(), codes, scale_inv)  # uint8 codes + scale_inv
    check_forward(layer, batch, weight, tol=2e-4)


def test_profile_run_zero_fills_the_output(rng):
    weight = rng.standard_normal((N * (P + V), L)).astype(np.float32)
    layer = mlakit.MlaAttention(config(), weight)
    output = np.full((3, N * V), np.nan, dtype=np.float32)
    cache = np.zeros((0, BLOCK, L + R), dtype=np.float32)
    q = np.zeros((3, N, P + R), np.float32)
    layer.forward(q, np.zeros((3, L), np.float32), np.zeros((3, R), np.float32), cache, None,
                  output)
    assert (output == 0).all()


def test_output_overlapping_an_input_the_cache_or_itself_is_refused(rng):
    # Stress finding: such an output ran without an error and held a wrong result.
    batch = Batch(rng)
    weight = (rng.standard_normal((N * (P + V), L)) / np.sqrt(L)).astype(np.float32)
    layer = mlakit.MlaAttention(config(), weight)
    rows = batch.T + batch.padding
    over_q = batch.q.reshape(rows, -1)[:, :N * V]
    over_cache = batch.cache.reshape(-1)[:rows * N * V].reshape(rows, N * V)
    output = np.zeros((rows, N * V), np.float32)
    same_row = np.lib.stride_tricks.as_strided(output, (rows, N * V), (0, 4))
    for out, other in [(over_q, "q"), (over_cache, "kv_cache"), (same_row, "itself")]:
        with pytest.raises(ValueError, match=f"MlaAttention::forward: output must not overlap "
                                             f"{other}"):
            layer.forward(batch.q, batch.kv_c, batch.k_pe, batch.cache, batch.forward_batch(), out)


def test_scales_are_ignored_without_an_fp8_cache(rng):
    # The scales are used with fp8 caches only: NaN ones change nothing for a float cache (they
    # were refused under mla_decode's name).
    batch = Batch(rng)
    weight = (rng.standard_normal((N * (P + V), L)) / np.sqrt(L)).astype(np.float32)
    layer = mlakit.MlaAttention(config(), weight)
    rows = batch.T + batch.padding
    expected = np.zeros((rows, N * V), np.float32)
    layer.forward(batch.q, batch.kv_c, batch.k_pe, batch.cache, batch.forward_batch(), expected)
    output = np.zeros((rows, N * V), np.float32)
    layer.forward(batch.q, batch.kv_c, batch.k_pe, batch.cache, batch.forward_batch(), output,
                  q_scale=float("nan"), k_scale=float("nan"))
    assert np.array_equal(output, expected)


def test_config_defaults_are_the_librarys():
    layer_defaults = mlakit.MlaConfig()
    from mlakit._library import MlaConfigC, lib
    import ctypes

    c = MlaConfigC()
    lib.mlakit_mla_config_init(ctypes.byref(c))
    ours = layer_defaults._to_c()
    for name, _ in MlaConfigC._fields_:
        if name in ("act_dtype", "device"):
            continue
        assert getattr(ours, name) == getattr(c, name), name
    assert (ours.act_dtype.code, ours.act_dtype.bits) == (c.act_dtype.code, c.act_dtype.bits)
    assert layer_defaults.workspace_tokens == 0


def test_layer_errors_carry_messages():
    with pytest.raises(ValueError, match="scale must be finite and > 0, got 0"):
        mlakit.MlaAttention(config(scale=0.0), np.zeros((N * (P + V), L), np.float32))
