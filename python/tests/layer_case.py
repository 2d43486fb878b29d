"""A small MLA layer and a mixed batch with its fp64 reference, shared by the MlaAttention tests
(test_attention.py: single calls; test_step.py: one StepPlan for several layers)."""

import numpy as np

import mlakit
from reference import attend, causal_mask

N, L, R, P, V = 4, 160, 16, 32, 32  # N * (P + V) = 256 rows, L = 160: 2 x 2 fp8 weight blocks
BLOCK = 4
SCALE = 0.144


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
        self.dtype = dtype
        self.seq_lens = self.q_lens + self.contexts
        self.qsl = np.concatenate([[0], np.cumsum(self.q_lens)]).astype(np.int32)
        self.T = int(self.qsl[-1])
        width = int(max(-(-s // BLOCK) for s in self.seq_lens))
        self.num_blocks = len(self.q_lens) * width + 3
        self.block_table = (rng.permutation(self.num_blocks)[:len(self.q_lens) * width]
                            .reshape(len(self.q_lens), width).astype(np.int32))
        self.slot_mapping = np.empty(self.T, dtype=np.int64)
        self._fill(rng)

    def another_layer(self, rng):
        """The same step (lengths, block table, slots) with another layer's values: fresh
        latents, queries and cache."""
        other = object.__new__(Batch)
        other.__dict__.update(self.__dict__)
        other._fill(rng)
        return other

    def _fill(self, rng):
        dtype = self.dtype
        # Latent entries [kv_c | k_pe] of every position of every request (past and new).
        self.latents = [rng.standard_normal((s, L + R)).astype(dtype) for s in self.seq_lens]
        self.cache = np.full((self.num_blocks, BLOCK, L + R), np.nan, np.float32).astype(dtype)
        rows = self.T + self.padding
        self.q = rng.standard_normal((rows, N, P + R)).astype(dtype)
        self.kv_c = np.full((rows, L), np.nan, dtype=np.float32).astype(dtype)
        self.k_pe = np.full((rows, 1, R), np.nan, dtype=np.float32).astype(dtype)
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
