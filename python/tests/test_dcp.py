"""dcp_lse_combine / dcp_lse_correct from NumPy against an fp64 combine written here: W ranks'
partial results over disjoint key sets, with empty ranks (-inf, NaN and +inf LSEs over NaN
partials) and a request no rank holds a key of."""

import ml_dtypes
import numpy as np
import pytest

import mlakit

BF16 = ml_dtypes.bfloat16
TOLERANCE = {np.float32: 1e-5, np.float16: 2e-3, BF16: 1.6e-2}  # ~2 ulp of the output dtype


def partials(rng, w, t, h, d, dtype):
    """[W, T, H, D] partials and [W, T, H] LSEs; about a third of the (rank, token, head) are
    empty: LSE -inf / NaN / +inf and a NaN partial, which must never be read."""
    out = rng.standard_normal((w, t, h, d)).astype(dtype)
    lse = (rng.standard_normal((w, t, h)) * 3).astype(np.float32)
    empty = rng.choice([0, 1, 2, 3], size=(w, t, h), p=[0.7, 0.2, 0.05, 0.05])
    lse[empty == 1] = -np.inf
    lse[empty == 2] = np.nan
    lse[empty == 3] = np.inf
    lse[:, 0, :] = -np.inf  # token 0: no rank holds a key
    out[empty > 0] = np.nan
    out[:, 0] = np.nan
    return out, lse


def combine_reference(out, lse):
    """fp64: lse = ln sum_k exp(lse_k), out = sum_k exp(lse_k - lse) out_k over the ranks with a
    finite LSE; 0 and -inf where no rank has one."""
    lse = np.where(np.isfinite(lse), lse.astype(np.float64), -np.inf)
    m = lse.max(axis=0)
    safe_m = np.where(np.isfinite(m), m, 0.0)
    weights = np.exp(lse - safe_m)  # exp(-inf) = 0 for the empty ranks
    total = weights.sum(axis=0)
    combined_lse = np.where(total > 0, safe_m + np.log(np.where(total > 0, total, 1.0)), -np.inf)
    w = np.where(total > 0, weights / np.where(total > 0, total, 1.0), 0.0)
    parts = np.where(w[..., None] > 0, out.astype(np.float64), 0.0)
    return (w[..., None] * parts).sum(axis=0), combined_lse


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("w", [1, 3, 4])
def test_combine_matches_fp64_reference(rng, dtype, w):
    t, h, d = 23, 8, 40
    out_parts, lse_parts = partials(rng, w, t, h, d, dtype)
    out = np.full((t, h, d), np.nan, dtype=np.float32).astype(dtype)
    out_lse = np.full((t, h), np.nan, dtype=np.float32)

    mlakit.dcp_lse_combine(out_parts, lse_parts, out, out_lse)

    ref, ref_lse = combine_reference(out_parts, lse_parts)
    assert not np.isnan(out.astype(np.float32)).any()
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=TOLERANCE[dtype],
                               atol=TOLERANCE[dtype])
    np.testing.assert_allclose(out_lse, ref_lse, rtol=1e-5, atol=1e-5)
    assert (out[0] == 0).all() and np.isneginf(out_lse[0]).all()


def test_correct_summed_over_ranks_is_the_combine(rng):
    w, t, h, d = 4, 9, 8, 16
    out_parts, lse_parts = partials(rng, w, t, h, d, np.float32)
    summed = np.zeros((t, w, h // w, d))
    for rank in range(w):
        corrected = np.full((t, w, h // w, d), np.nan, dtype=np.float32)
        mlakit.dcp_lse_correct(out_parts[rank], lse_parts, rank, corrected)
        assert not np.isnan(corrected).any()
        summed += corrected
    ref, _ = combine_reference(out_parts, lse_parts)
    # Heads grouped by the rank that keeps them: [T, W, H / W, D] is [T, H, D].
    np.testing.assert_allclose(summed.reshape(t, h, d), ref, rtol=1e-5, atol=1e-5)


def test_bad_arguments_name_them():
    out = np.zeros((2, 3, 4, 8), dtype=np.float32)
    with pytest.raises(mlakit.MlakitValueError, match="partial_lse_tokens_heads"):
        mlakit.dcp_lse_combine(out, np.zeros((2, 3, 5), dtype=np.float32),
                               np.zeros((3, 4, 8), dtype=np.float32))
    with pytest.raises(mlakit.MlakitError, match="rank"):
        mlakit.dcp_lse_correct(out[0], np.zeros((2, 3, 4), dtype=np.float32), 2,
                               np.zeros((3, 2, 2, 8), dtype=np.float32))
