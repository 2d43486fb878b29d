"""mlakit.dcp_torch over torch.distributed's gloo backend, W processes on one machine:
- dcp_decode (the op-level decode, W = 2 on CPU): each rank's heads against an fp64 latent
  attention over all keys written here;
- MlaAttention with the ProcessGroup as its communicator (W = 2 and 4 on CPU): dcp_case.py's
  mixed batches (decodes, prefills with context over several chunks, ranks without a token of a
  request; caches auto and fp8, interleaves 1, 2, 16, 64, blocks 16 and 64), every rank against
  the single-rank layer and the fp64 oracle;
- ProcessGroupCommunicator's collectives on their own, host and (where a GPU is) CUDA buffers,
  against values every rank can compute.
Skipped where torch is not installed (CI, where test_dcp_layer.py runs the same layer checks over
threads); scripts/device/check.sh runs it on the GPU machine's torch."""

import datetime
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
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


# A rank whose check fails stops joining collectives: the others give up after this long instead
# of gloo's default 30 minutes (start_processes then ends the job with the first error).
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)


def init_group(init_file, rank, world):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=COLLECTIVE_TIMEOUT)


def run_layer_rank(rank, init_file, seed, world, subset):
    import dcp_case

    init_group(init_file, rank, world)
    try:
        for setting in dcp_case.settings(subset):
            case = dcp_case.GlobalCase(seed, world, setting)
            try:
                # The ProcessGroup itself: MlaAttention wraps it in a ProcessGroupCommunicator.
                dcp_case.check_rank(case, rank, dist.group.WORLD, seed)
            except AssertionError as e:
                raise AssertionError(f"W {world}, {setting}, seed {seed}, rank {rank}: {e}") from e
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_dcp_layer_matches_single_rank_and_fp64(tmp_path, world):
    seed = int.from_bytes(os.urandom(4), "little")
    mp.start_processes(run_layer_rank, args=(str(tmp_path / "store"), seed, world, world == 4),
                       nprocs=world, start_method="spawn", join=True)


BYTE_TYPES = (torch.uint8, torch.float8_e4m3fn)


def rank_values(seed, rank, count, dtype):
    """What rank `rank` sends, on the host: values every rank can compute. Integers of magnitude
    <= 16 are exact in every float dtype here, and so are their sums over a few ranks; byte types
    get codes 0..32 (finite e4m3 values)."""
    values = np.random.default_rng([seed, rank]).integers(-16, 17, count)
    if dtype in BYTE_TYPES:
        return torch.from_numpy((values + 16).astype(np.uint8)).view(dtype)
    return torch.from_numpy(values).to(dtype)


def as_bytes(t):
    return t.view(torch.uint8) if t.dtype in BYTE_TYPES else t


def run_collectives_rank(rank, init_file, seed, world, device):
    import mlakit
    from mlakit.dcp_torch import ProcessGroupCommunicator

    init_group(init_file, rank, world)
    try:
        comm = ProcessGroupCommunicator(dist.group.WORLD, device)
        stream = torch.cuda.current_stream(device).cuda_stream if device != "cpu" else None

        def buffer(t):
            return mlakit.Buffer(t.data_ptr(), t.numel(), str(t.dtype).removeprefix("torch."),
                                 t.element_size(), device)

        count = 37  # odd: no dtype's alignment hides a misplaced byte
        for dtype in (torch.float32, torch.bfloat16, torch.float16) + BYTE_TYPES:
            want = as_bytes(torch.cat([rank_values(seed, k, count, dtype) for k in range(world)]))
            send = rank_values(seed, rank, count, dtype).to(device)
            recv = rank_values(seed + 1, rank, world * count, dtype).to(device)  # overwritten
            comm.all_gather(buffer(send), buffer(recv), stream)
            assert torch.equal(as_bytes(recv).cpu(), want), dtype
            # In place: the send is recv's own slice.
            recv = rank_values(seed + 1, rank, world * count, dtype).to(device)
            mine = recv[rank * count:(rank + 1) * count]
            as_bytes(mine).copy_(as_bytes(send))
            comm.all_gather(buffer(mine), buffer(recv), stream)
            assert torch.equal(as_bytes(recv).cpu(), want), f"{dtype} in place"
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            send = rank_values(seed, rank, world * count, dtype).to(device)
            total = sum(rank_values(seed, k, world * count, torch.float64) for k in range(world))
            recv = torch.full((count,), float("nan"), dtype=dtype, device=device)
            comm.reduce_scatter_sum(buffer(send), buffer(recv), stream)
            mine = total[rank * count:(rank + 1) * count]
            assert torch.equal(recv.cpu().double(), mine), f"reduce-scatter {dtype}"
            # The send is left as it was.
            assert torch.equal(send.cpu(), rank_values(seed, rank, world * count, dtype))
        if device != "cpu":
            torch.cuda.synchronize(device)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_process_group_communicator_collectives(tmp_path, device):
    if device != "cpu" and not torch.cuda.is_available():
        pytest.skip("no CUDA device: the CUDA buffers of the communicator are not tested")
    seed = int.from_bytes(os.urandom(4), "little")
    # Two ranks sharing GPU 0 over gloo (which takes CUDA tensors): one GPU is enough.
    mp.start_processes(run_collectives_rank, args=(str(tmp_path / "store"), seed, 2, device),
                       nprocs=2, start_method="spawn", join=True)
