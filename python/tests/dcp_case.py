"""MlaAttention under decode context parallelism, one rank's side, shared by test_dcp_layer.py
(W ranks as threads over an in-process NumPy communicator; runs in CI) and test_dcp_torch.py (W
processes over torch.distributed's gloo backend).

Every rank builds the same global batch from the same seed: decodes and prefills, contexts
around one turn of the ranks (W I) and whole blocks, one shorter than a turn (most ranks hold
none of it) and long ones over several context chunks. Rank r serves heads [r N, (r + 1) N) of
W N and holds, in a paged cache of its own, positions p with (p // I) % W == r at local
position (p // (W I)) I + p % I (counted here by brute force). check_rank runs the DCP layer
(the single call, and the engine form: one StepPlan, two layers) and compares every output row
with the single-rank layer over the whole cache (same heads, same inputs), to rounding, and with
an fp64 MLA written here; the rank's cache must hold the new tokens it owns at their local slots
and nothing else new."""

from dataclasses import dataclass

import ml_dtypes
import numpy as np

import mlakit
from reference import E4M3_VALUES, attend, causal_mask, e4m3_encode, round_to

N, L, R, P, V = 2, 64, 16, 32, 32  # heads per rank; small so the fp64 oracle stays quick
SCALE = 0.125
# A multiple of every DCP alignment lcm(block_size, W I) used here (at most lcm(64, 4 * 64)), so
# the DCP and single-rank layers share it; the long contexts need 3 or more chunks of it.
WORKSPACE_TOKENS = 256
LONG_CONTEXT = 600
PADDING_ROWS = 2  # activation rows past num_actual_tokens: must stay untouched (NaN)
# Powers of two: x / scale is exact, so the oracle's e4m3 rounding sees the library's operand.
FP8_SCALE = 2.0**-4  # N(0, 1) / 2^-4 stays far inside e4m3's +-448
BF16 = ml_dtypes.bfloat16
FP8_NAN = 0x7F  # e4m3fn NaN: unused fp8 cache slots


@dataclass(frozen=True)
class Setting:
    kv_cache_dtype: str  # "auto" or "fp8"
    act_dtype: str  # "float32" or "bfloat16"
    block_size: int
    interleave: int

    def __str__(self):
        return f"{self.kv_cache_dtype}/{self.act_dtype}/block {self.block_size}/I {self.interleave}"


def settings(subset=False):
    """Interleaves {1, 2, 16, 64} x blocks {16, 64}, cycling through the cache and activation
    dtypes (f32 auto, bf16 auto, bf16 fp8). subset: every other one (cheaper runs)."""
    kinds = [("auto", "float32"), ("auto", "bfloat16"), ("fp8", "bfloat16")]
    out = []
    for i, (interleave, block) in enumerate([(i, b) for i in (1, 2, 16, 64) for b in (16, 64)]):
        kv, act = kinds[i % len(kinds)]
        out.append(Setting(kv, act, block, interleave))
    return out[::2] if subset else out


def _np_dtype(act_dtype):
    return np.float32 if act_dtype == "float32" else BF16


def owner(p, world, interleave):
    return (p // interleave) % world


class GlobalCase:
    """The global batch (decodes first) with every rank's inputs, from one seed."""

    def __init__(self, seed, world, setting):
        self.world, self.setting = world, setting
        s = setting
        rng = np.random.default_rng(seed)
        dtype = _np_dtype(s.act_dtype)
        turn, bs = world * s.interleave, s.block_size
        # (context, query) of each request: decodes (q_len 1), then prefills.
        pairs = [(turn, 1), (3 * bs, 1), (LONG_CONTEXT - 150, 1), (1, 1),
                 (0, 5), (max(turn - 1, 1), 3), (2 * bs - 1, 2), (LONG_CONTEXT, 6)]
        self.num_decodes = 4
        self.contexts = np.array([c for c, _ in pairs])
        self.q_lens = np.array([q for _, q in pairs])
        self.seq_lens = (self.contexts + self.q_lens).astype(np.int32)
        self.qsl = np.concatenate([[0], np.cumsum(self.q_lens)]).astype(np.int32)
        self.T = int(self.qsl[-1])
        heads = world * N
        # Two layers (the engine form runs both against one plan): weights of all heads.
        self.weights = [(rng.standard_normal((heads * (P + V), L)) / np.sqrt(L)).astype(dtype)
                        for _ in range(2)]
        self.latents = [[rng.standard_normal((n, L + R)).astype(dtype) for n in self.seq_lens]
                        for _ in range(2)]
        rows = self.T + PADDING_ROWS
        self.q = [rng.standard_normal((rows, heads, P + R)).astype(dtype) for _ in range(2)]
        self.kv_c, self.k_pe = [], []
        for layer in range(2):
            kv_c = np.full((rows, L), np.nan, np.float32).astype(dtype)
            k_pe = np.full((rows, 1, R), np.nan, np.float32).astype(dtype)
            for b, (ctx, ql) in enumerate(pairs):
                new = self.latents[layer][b][ctx:]
                kv_c[self.qsl[b]:self.qsl[b] + ql] = new[:, :L]
                k_pe[self.qsl[b]:self.qsl[b] + ql, 0] = new[:, L:]
            self.kv_c.append(kv_c)
            self.k_pe.append(k_pe)
        self.scales = (FP8_SCALE, FP8_SCALE) if s.kv_cache_dtype == "fp8" else (1.0, 1.0)

    # ---- Caches -------------------------------------------------------------------------------

    def positions_of(self, rank):
        """[request] -> global positions this rank holds (all of them for rank None)."""
        w, i = self.world, self.setting.interleave
        return [[p for p in range(n) if rank is None or owner(p, w, i) == rank]
                for n in self.seq_lens]

    def table_for(self, rank, rng):
        """A shuffled block table of the positions `rank` holds (None: every position, the
        single-rank table); unused entries -1, and 3 blocks nobody uses."""
        bs = self.setting.block_size
        blocks_of = [-(-len(x) // bs) for x in self.positions_of(rank)]
        ids = rng.permutation(sum(blocks_of) + 3).astype(np.int32)
        table = np.full((len(blocks_of), max(1, max(blocks_of))), -1, np.int32)
        first = 0
        for b, n in enumerate(blocks_of):
            table[b, :n] = ids[first:first + n]
            first += n
        return table

    def cache_on(self, rank, layer, table):
        """(cache, slot_of) of `rank` (None: every position) through `table`: the context of
        `layer` at its local positions (the j-th position a rank holds is its local position j),
        every other slot poisoned (NaN; fp8: the NaN code). slot_of[b][p]: the slot of global
        position p of request b, for the positions the rank holds."""
        bs = self.setting.block_size
        fp8 = self.setting.kv_cache_dtype == "fp8"
        shape = (int(table.max()) + 4, bs, L + R)
        if fp8:
            cache = np.full(shape, FP8_NAN, np.uint8)
        else:
            cache = np.full(shape, np.nan, np.float32).astype(_np_dtype(self.setting.act_dtype))
        flat = cache.reshape(-1, L + R)
        slot_of = []
        for b, positions in enumerate(self.positions_of(rank)):
            slots = {}
            for j, p in enumerate(positions):
                slots[p] = int(table[b, j // bs]) * bs + j % bs
                if p < self.contexts[b]:
                    value = self.latents[layer][b][p]
                    flat[slots[p]] = (e4m3_encode(value.astype(np.float64) / FP8_SCALE) if fp8
                                      else value)
            slot_of.append(slots)
        return cache, slot_of

    # ---- fp64 oracle --------------------------------------------------------------------------

    def reference(self, layer, rank):
        """fp64 output [T, N V] of the rank's heads: prefills in the non-absorbed form (context
        keys as the cache returns them, new keys unquantized); decodes read every key from the
        cache, and with an fp8 cache their absorbed query is quantized as the library does."""
        w = self.weights[layer][rank * N * (P + V):(rank + 1) * N * (P + V)].astype(np.float64)
        q = self.q[layer][:, rank * N:(rank + 1) * N].astype(np.float64)
        fp8 = self.setting.kv_cache_dtype == "fp8"
        out = np.zeros((self.T, N * V))
        for b, (ctx, ql) in enumerate(zip(self.contexts, self.q_lens)):
            decode = b < self.num_decodes
            lat = self.latents[layer][b].astype(np.float64)
            if fp8:
                cached = E4M3_VALUES[e4m3_encode(lat / FP8_SCALE)] * FP8_SCALE
                lat = cached if decode else np.concatenate([cached[:ctx], lat[ctx:]])
            rows = slice(self.qsl[b], self.qsl[b] + ql)
            visible = causal_mask(ql, self.seq_lens[b])
            for n in range(N):
                w_n = w[n * (P + V):(n + 1) * (P + V)]  # [P + V, L]: W_UK rows then W_UV rows
                if fp8 and decode:
                    out[rows, n * V:(n + 1) * V] = self._fp8_decode(q[rows, n], w_n, lat, visible)
                    continue
                up = lat[:, :L] @ w_n.T  # [S, P + V]
                k = np.concatenate([up[:, :P], lat[:, L:]], axis=1)
                o, _ = attend(q[rows, n], k, up[:, P:], SCALE, visible)
                out[rows, n * V:(n + 1) * V] = o
        return out

    def _fp8_decode(self, q, w_n, keys, visible):
        """Absorbed form: q_lat = q_nope W_UK rounded to the activation dtype, then both halves
        quantized as e4m3(x / q_scale) * q_scale; latent MQA over the keys; V up-projection."""
        act = _np_dtype(self.setting.act_dtype)
        q_abs = np.concatenate([round_to(q[:, :P] @ w_n[:P], act), q[:, P:]], axis=1)
        q_abs = E4M3_VALUES[e4m3_encode(q_abs / FP8_SCALE)] * FP8_SCALE
        o_lat, _ = attend(q_abs, keys, keys[:, :L], SCALE, visible)
        return o_lat @ w_n[P:].T

    # ---- Tolerances ---------------------------------------------------------------------------

    def tolerances(self):
        """(DCP vs single-rank, vs the oracle for prefills and auto decodes, vs the oracle for
        fp8 decodes), relative and absolute alike. The ranks sum other partitions of the same
        keys (LSE combine, other chunk boundaries): f32 rounding apart, or two roundings of the
        bf16 output (2 x 2^-8). The oracle: f32 end to end, or bf16 intermediates (up-projected
        keys, absorbed queries, latent outputs; as test_attention.py); fp8 decodes add a possible
        flip of an e4m3 rounding of the query between the oracle's fp64 and the library's f32
        absorption (about 1e-2 on an O(1) output, tests/common/mla_harness.cpp). Measured
        worst cases (W 2 and 4, every setting): 3e-7 / 5e-7 (f32), 9e-4 / 7e-3 / 4e-3 (bf16)."""
        if self.setting.act_dtype == "float32":
            return 5e-6, 2e-5, 2e-2
        return 8e-3, 2e-2, 2e-2

# ---- One rank -------------------------------------------------------------------------------


def _config(case, rank, dcp):
    s = case.setting
    extra = dict(dcp_world_size=case.world, dcp_rank=rank, dcp_interleave=s.interleave) if dcp \
        else {}
    return mlakit.MlaConfig(scale=SCALE, num_heads=N, kv_lora_rank=L, qk_rope_head_dim=R,
                            qk_nope_head_dim=P, v_head_dim=V, act_dtype=s.act_dtype,
                            kv_cache_dtype=s.kv_cache_dtype, block_size=s.block_size,
                            workspace_tokens=WORKSPACE_TOKENS, max_model_len=1024,
                            max_num_seqs=16, max_num_batched_tokens=64, **extra)


def _single_rank_output(case, rank, layer, rng):
    """The single-rank layer of the rank's heads over a cache of every position."""
    table = case.table_for(None, rng)
    cache, slot_of = case.cache_on(None, layer, table)
    slots = np.full(case.T, -1, np.int64)
    for b, (ctx, ql) in enumerate(zip(case.contexts, case.q_lens)):
        for t in range(ql):
            slots[case.qsl[b] + t] = slot_of[b][ctx + t]
    single = mlakit.MlaAttention(_config(case, rank, dcp=False), _rank_weight(case, layer, rank))
    output = _nan_output(case)
    single.forward(_rank_q(case, layer, rank), case.kv_c[layer], case.k_pe[layer], cache,
                   mlakit.ForwardBatch(case.qsl, case.seq_lens, table, slots), output,
                   *case.scales)
    return output


def _rank_q(case, layer, rank):
    return np.ascontiguousarray(case.q[layer][:, rank * N:(rank + 1) * N])


def _nan_output(case):
    dtype = _np_dtype(case.setting.act_dtype)
    return np.full((case.T + PADDING_ROWS, N * V), np.nan, np.float32).astype(dtype)


def _check_rank_cache(case, layer, rank, before, after, slot_of):
    """The forward wrote exactly the new tokens this rank owns, at their local slots."""
    flat_before, flat_after = before.reshape(-1, L + R), after.reshape(-1, L + R)
    written = set()
    for b, (ctx, ql) in enumerate(zip(case.contexts, case.q_lens)):
        for p in range(ctx, ctx + ql):
            if p not in slot_of[b]:
                continue  # another rank's token
            slot = slot_of[b][p]
            written.add(slot)
            value = case.latents[layer][b][p]
            if case.setting.kv_cache_dtype == "fp8":
                want = e4m3_encode(value.astype(np.float64) / FP8_SCALE)
            else:
                want = value
            assert np.array_equal(flat_after[slot].view(np.uint8), want.view(np.uint8)), \
                f"request {b} position {p}: slot {slot} of rank {rank} holds the wrong entry"
    untouched = [i for i in range(flat_before.shape[0]) if i not in written]
    assert np.array_equal(flat_after[untouched].view(np.uint8),
                          flat_before[untouched].view(np.uint8)), \
        f"rank {rank} wrote cache slots of tokens it does not own"


def _compare(case, got, single, reference, what):
    """got and single: [T + PADDING_ROWS, N V] outputs; reference: fp64 [T, N V]."""
    to_single, to_oracle, to_oracle_fp8_decode = case.tolerances()
    got64, single64 = got.astype(np.float64), single.astype(np.float64)
    assert np.isnan(got64[case.T:]).all(), f"{what}: rows past num_actual_tokens were written"
    np.testing.assert_allclose(got64[:case.T], single64[:case.T], rtol=to_single, atol=to_single,
                               err_msg=f"{what}: DCP vs the single-rank layer")
    decode_rows = int(case.qsl[case.num_decodes])
    oracle_decode_tol = to_oracle_fp8_decode if case.setting.kv_cache_dtype == "fp8" else to_oracle
    for rows, tol, kind in ((slice(0, decode_rows), oracle_decode_tol, "decodes"),
                            (slice(decode_rows, case.T), to_oracle, "prefills")):
        for name, values in (("DCP", got64), ("single-rank", single64)):
            np.testing.assert_allclose(values[rows], reference[rows], rtol=tol, atol=tol,
                                       err_msg=f"{what}: {name} {kind} vs the fp64 oracle")


def check_rank(case, rank, communicator, seed):
    """Runs rank `rank` of the group (communicator: a mlakit.Communicator or a torch
    ProcessGroup) through the single call and the engine form, and checks it (AssertionError).
    Every rank must call it with the same case; the collectives pair up."""
    rng = np.random.default_rng([seed, rank])  # this rank's block tables
    config = _config(case, rank, dcp=True)
    layers = [mlakit.MlaAttention(config, _rank_weight(case, layer, rank),
                                  communicator=communicator) for layer in range(2)]
    singles = [_single_rank_output(case, rank, layer, rng) for layer in range(2)]
    references = [case.reference(layer, rank) for layer in range(2)]
    # Both layers share the block table (one plan serves every layer of a step).
    table = case.table_for(rank, rng)
    caches = [case.cache_on(rank, layer, table) for layer in range(2)]
    # Under DCP the slot mapping is empty: planning derives this rank's slots.
    batch = mlakit.ForwardBatch(case.qsl, case.seq_lens, table, np.zeros(0, np.int64))

    # The single call (layer 0): plans the batch and runs in the layer's own workspace.
    plan = layers[0].plan(batch)
    assert plan.split.num_decodes == case.num_decodes
    assert len(plan.context_chunks) >= 3, "the long contexts must take several chunks"
    cache, slot_of = caches[0][0].copy(), caches[0][1]
    output = _nan_output(case)
    layers[0].forward(_rank_q(case, 0, rank), case.kv_c[0], case.k_pe[0], cache, batch, output,
                      *case.scales)
    _check_rank_cache(case, 0, rank, caches[0][0], cache, slot_of)
    _compare(case, output, singles[0], references[0], f"rank {rank} single call")

    # The engine form: one StepPlan on a shared workspace, both layers.
    workspace = mlakit.Workspace(config)
    step = mlakit.plan_step(config, batch, workspace)
    for layer in range(2):
        cache = caches[layer][0].copy()
        output = _nan_output(case)
        layers[layer].forward(_rank_q(case, layer, rank), case.kv_c[layer], case.k_pe[layer],
                              cache, step, output, *case.scales)
        _check_rank_cache(case, layer, rank, caches[layer][0], cache, caches[layer][1])
        _compare(case, output, singles[layer], references[layer],
                 f"rank {rank} engine form, layer {layer}")


def _rank_weight(case, layer, rank):
    return case.weights[layer][rank * N * (P + V):(rank + 1) * N * (P + V)]
