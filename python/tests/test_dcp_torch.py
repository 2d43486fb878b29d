"""mlakit.dcp_torch over torch.distributed's gloo backend on CPU: W = 2 processes, each holding
its share of a paged cache, decode through dcp_decode; each rank's heads must match an fp64
latent attention over all keys written here. Skipped where torch is not installed (CI); the
device check script runs it on the GPU machine's torch."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD = 2
HEADS = 2  # N per rank
L, R = 64, 16
BLOCK = 16
SCALE = 0.125


def reference(q, keys, lens):
    """fp64 latent MQA: q [B, H, L + R], keys [B, S, L + R]; out [B, H, L] over keys[:len]."""
    out = np.zeros((q.shape[0], q.shape[1], L))
    for b, n in enumerate(lens):
        if n == 0:
            continue
        k = keys[b, :n].astype(np.float64)
        s = q[b].astype(np.float64) @ k.T * SCALE
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[b] = (p / p.sum(axis=1, keepdims=True)) @ k[:, :L]
    return out


def run_rank(rank, init_file, seed, interleave):
    import mlakit
    from mlakit.dcp_torch import dcp_decode

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD)
    try:
        rng = np.random.default_rng(seed)  # the same global batch on every rank
        lens = [0, 1, 5, 2 * BLOCK * WORLD + 3, 300]
        s_max = max(lens)
        keys = rng.standard_normal((len(lens), s_max, L + R)).astype(np.float32)
        q = rng.standard_normal((len(lens), WORLD * HEADS, L + R)).astype(np.float32)
        # This rank's share, written at its local positions; other slots NaN.
        turn = WORLD * interleave
        local = [[p for p in range(n) if (p // interleave) % WORLD == rank] for n in lens]
        cols = max(1, max((len(x) + BLOCK - 1) // BLOCK for x in local))
        cache = np.full((len(lens) * cols, BLOCK, L + R), np.nan, dtype=np.float32)
        table = np.arange(len(lens) * cols, dtype=np.int32).reshape(len(lens), cols)[:, ::-1].copy()
        for b, positions in enumerate(local):
            for p in positions:
                j = p // turn * interleave + p % interleave
                cache[table[b, j // BLOCK], j % BLOCK] = keys[b, p]
        local_lens = torch.tensor([len(x) for x in local], dtype=torch.int32)
        mine = torch.from_numpy(q[:, rank * HEADS:(rank + 1) * HEADS].copy())
        out = dcp_decode(mine, torch.from_numpy(cache), torch.from_numpy(table), local_lens,
                         SCALE, kv_lora_rank=L)
        want = reference(q[:, rank * HEADS:(rank + 1) * HEADS], keys, lens)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)
        assert mlakit.version()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("interleave", [1, 16])
def test_gloo_dcp_decode_matches_fp64(tmp_path, interleave):
    seed = int.from_bytes(os.urandom(4), "little")
    init_file = tmp_path / "store"
    # A rank that raises makes start_processes raise (ProcessRaisedException) here.
    mp.start_processes(run_rank, args=(str(init_file), seed, interleave), nprocs=WORLD,
                       start_method="spawn", join=True)
