"""mla_prefill from NumPy against the fp64 varlen MHA of reference.py."""

import ml_dtypes
import numpy as np
import pytest

import mlakit
from reference import mha_prefill

BF16 = ml_dtypes.bfloat16
N, P, R, V = 3, 32, 16, 24
SCALE = 0.144  # softmax scale (about 1/sqrt(P + R))
TOLERANCE = {np.float32: 2e-4, BF16: 1.6e-2}  # f32 accumulation; bf16 output rounding


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_prefill_matches_mha_reference(rng, dtype, causal):
    q_lens = np.array([5, 1, 0, 17], dtype=np.int32)
    k_lens = np.array([5, 9, 3, 40], dtype=np.int32)  # sk >= sq: context before the queries
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32)
    T, S = int(cu_q[-1]), int(cu_k[-1])
    q = rng.standard_normal((T, N, P + R)).astype(dtype)
    # k_nope and v as views of one up-projected [S, N * (P + V)] buffer, as the layer makes them.
    kv = rng.standard_normal((S, N, P + V)).astype(dtype)
    k_nope, v = kv[:, :, :P], kv[:, :, P:]
    k_pe = rng.standard_normal((S, R)).astype(dtype)
    out = np.full((T, N, V), np.nan, dtype=np.float32).astype(dtype)
    lse = np.full((N, T), np.nan, dtype=np.float32)

    mlakit.mla_prefill(q, k_nope, k_pe, v, cu_q, cu_k, int(q_lens.max()), int(k_lens.max()),
                       SCALE, causal, out, lse)

    f64 = lambda a: a.astype(np.float64)  # noqa: E731
    ref, ref_lse = mha_prefill(f64(q), f64(k_nope), f64(k_pe), f64(v), cu_q, cu_k, SCALE, causal)
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-4, atol=1e-4)


def test_prefill_without_lse_and_with_no_visible_key(rng):
    # One request with more queries than keys: under bottom-right causal masking the first
    # query sees no key, so its output is 0.
    q = rng.standard_normal((3, N, P + R)).astype(np.float32)
    kv = rng.standard_normal((2, N, P + V)).astype(np.float32)
    k_pe = rng.standard_normal((2, R)).astype(np.float32)
    cu_q = np.array([0, 3], dtype=np.int32)
    cu_k = np.array([0, 2], dtype=np.int32)
    out = np.full((3, N, V), np.nan, dtype=np.float32)
    mlakit.mla_prefill(q, kv[:, :, :P], k_pe, kv[:, :, P:], cu_q, cu_k, 3, 2, SCALE, True, out)
    ref, _ = mha_prefill(q, kv[:, :, :P], k_pe, kv[:, :, P:], cu_q, cu_k, SCALE, True)
    assert (out[0] == 0).all()
    np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-4)
