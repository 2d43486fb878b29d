"""MlaAttention from NumPy against a fp64 NumPy MLA in the non-absorbed form: every key is
up-projected through kv_b_proj into per-head k_nope and v, then ordinary causal attention."""

import ml_dtypes
import numpy as np
import pytest

import mlakit
from reference import E4M3_VALUES, attend, causal_mask, e4m3_encode

N, L, R, P, V = 4, 160, 16, 32, 32  # N * (P + V) = 256 rows, L = 160: 2 x 2 fp8 weight blocks
BLOCK = 4
SCALE = 0.144
WEIGHT_BLOCK = 128  # DeepSeek-V3 fp8 checkpoints: one scale per 128 x 128 block


def config(**overrides):
    values = dict(scale=SCALE, num_heads=N, kv_lora_rank=L, qk_rope_head_dim=R,
                  qk_nope_head_dim=P, v_head_dim=V, act_dtype="float32", block_size=BLOCK,
                  workspace_tokens=16, max_num_seqs=8, max_model_len=256)
    values.update(overrides)
    return mlakit.MlaConfig(**values)


class Batch:
    """Decodes first: two decodes, a prefill with context (through several workspace chunks)
    and a prefill without context; two padding rows at the end of every activation."""

    q_lens = np.array([1, 1, 6, 4])
    contexts = np.array([20, 5, 37, 0])
    padding = 2

    def __init__(self, rng, dtype=np.float32):
        self.seq_lens = self.q_lens + self.contexts
        self.qsl = np.concatenate([[0], np.cumsum(self.q_lens)]).astype(np.int32)
        self.T = int(self.qsl[-1])
        width = int(max(-(-s // BLOCK) for s in self.seq_lens))
        num_blocks = len(self.q_lens) * width + 3
        self.block_table = (rng.permutation(num_blocks)[:len(self.q_lens) * width]
                            .reshape(len(self.q_lens), width).astype(np.int32))
        # Latent entries [kv_c | k_pe] of every position of every request (past and new).
        self.latents = [rng.standard_normal((s, L + R)).astype(dtype) for s in self.seq_lens]
        self.cache = np.full((num_blocks, BLOCK, L + R), np.nan, dtype=np.float32).astype(dtype)
        rows = self.T + self.padding
        self.q = rng.standard_normal((rows, N, P + R)).astype(dtype)
        self.kv_c = np.full((rows, L), np.nan, dtype=np.float32).astype(dtype)
        self.k_pe = np.full((rows, 1, R), np.nan, dtype=np.float32).astype(dtype)
        self.slot_mapping = np.empty(self.T, dtype=np.int64)
        for b, (ql, ctx) in enumerate(zip(self.q_lens, self.contexts)):
            for pos in range(ctx + ql):
                slot = self.block_table[b, pos // BLOCK] * BLOCK + pos % BLOCK
                if pos < ctx:  # context: already in the cache
                    self.cache[slot // BLOCK, slot % BLOCK] = self.latents[b][pos]
                else:  # new token: forward() writes it
                    t = self.qsl[b] + pos - ctx
                    self.kv_c[t] = self.latents[b][pos, :L]
                    self.k_pe[t, 0] = self.latents[b][pos, L:]
                    self.slot_mapping[t] = slot

    def forward_batch(self):
        return mlakit.ForwardBatch(self.qsl, self.seq_lens, self.block_table, self.slot_mapping)

    def reference(self, weight):
        """fp64 output [T, N * V] with the dequantized weight [N * (P + V), L]."""
        out = np.zeros((self.T, N * V))
        for b, ql in enumerate(self.q_lens):
            lat = self.latents[b].astype(np.float64)
            up = (lat[:, :L] @ weight.T).reshape(-1, N, P + V)  # kv_b_proj of every key
            qs = self.qsl[b]
            visible = causal_mask(ql, self.seq_lens[b])
            for n in range(N):
                k = np.concatenate([up[:, n, :P], lat[:, L:]], axis=1)
                o, _ = attend(self.q[qs:qs + ql, n].astype(np.float64), k, up[:, n, P:], SCALE,
                              visible)
                out[qs:qs + ql, n * V:(n + 1) * V] = o
        return out


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
