"""merge_attn_states from NumPy against the fp64 merge of reference.py, including empty sides."""

import ml_dtypes
import numpy as np
import pytest

import mlakit
from reference import merge_attn_states as merge_reference

BF16 = ml_dtypes.bfloat16
TOLERANCE = {np.float32: 1e-5, np.float16: 2e-3, BF16: 1.6e-2}  # ~2 ulp of the output dtype


def random_lses(rng, heads, tokens):
    """[H, T] LSEs with every empty-side combination: finite, -inf, +inf (read as -inf)."""
    lse = rng.standard_normal((heads, tokens)).astype(np.float32) * 3
    specials = rng.choice([0, 1, 2], size=(heads, tokens), p=[0.6, 0.3, 0.1])
    lse[specials == 1] = -np.inf
    lse[specials == 2] = np.inf
    return lse


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
def test_merge_matches_fp64_reference(rng, dtype):
    T, H, D = 37, 4, 48
    prefix = rng.standard_normal((T, H, D)).astype(dtype)
    suffix = rng.standard_normal((T, H, D)).astype(dtype)
    p_lse, s_lse = random_lses(rng, H, T), random_lses(rng, H, T)
    p_lse[0, 0] = s_lse[0, 0] = -np.inf  # both sides empty
    p_lse[1, 0], s_lse[1, 0] = np.inf, np.inf  # both +inf: empty too
    out = np.full((T, H, D), np.nan, dtype=np.float32).astype(dtype)
    out_lse = np.full((H, T), np.nan, dtype=np.float32)

    mlakit.merge_attn_states(out, prefix, p_lse, suffix, s_lse, out_lse)

    ref, ref_lse = merge_reference(prefix.astype(np.float64), p_lse, suffix.astype(np.float64),
                                   s_lse)
    assert not np.isnan(out.astype(np.float32)).any()
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=TOLERANCE[dtype],
                               atol=TOLERANCE[dtype])
    assert np.array_equal(np.isneginf(out_lse), np.isneginf(ref_lse))
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(out_lse[finite], ref_lse[finite], rtol=1e-6, atol=1e-6)
    assert (out[0, 0] == 0).all() and np.isneginf(out_lse[0, 0])


def test_merge_in_place_with_head_stride(rng):
    # Outputs are views with head stride 192 (of a [T, H, 192] buffer) and output aliases prefix.
    T, H, D = 5, 3, 128
    prefix_buf = rng.standard_normal((T, H, 192)).astype(np.float32)
    suffix_buf = rng.standard_normal((T, H, 192)).astype(np.float32)
    prefix, suffix = prefix_buf[:, :, :D], suffix_buf[:, :, :D]
    p_lse = rng.standard_normal((H, T)).astype(np.float32)
    s_lse = rng.standard_normal((H, T)).astype(np.float32)
    ref, _ = merge_reference(prefix.astype(np.float64), p_lse, suffix.astype(np.float64), s_lse)
    tail = prefix_buf[:, :, D:].copy()

    mlakit.merge_attn_states(prefix, prefix, p_lse, suffix, s_lse)  # no output_lse
    np.testing.assert_allclose(prefix, ref, rtol=1e-5, atol=1e-5)
    assert np.array_equal(prefix_buf[:, :, D:], tail)  # padding columns untouched
