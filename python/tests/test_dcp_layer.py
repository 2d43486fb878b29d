"""MlaAttention under decode context parallelism from Python, without torch: W ranks run as
threads of this process over an in-process NumPy communicator (a mlakit.Communicator subclass),
so the DCP layer, the C ABI's callback communicator and the Python callbacks run in CI.
dcp_case.py builds the global batch and checks each rank against the single-rank layer and the
fp64 oracle; test_dcp_torch.py runs the same checks over torch.distributed. Also: the placement
helpers against counting, and the errors of a bad configuration or a failing collective."""

import os
import threading

import numpy as np
import pytest

import dcp_case
import mlakit
from dcp_case import L, N, P, R, V

# A rank that fails before a collective leaves the others waiting: the barrier gives up after
# this long (far above a collective's time here) and fails their test instead of hanging it.
BARRIER_TIMEOUT_S = 120


class ThreadGroup:
    """The shared state of W thread ranks: one slot each for what a collective sends."""

    def __init__(self, world):
        self.world = world
        self.barrier = threading.Barrier(world, timeout=BARRIER_TIMEOUT_S)
        self.sent = [None] * world


class ThreadCommunicator(mlakit.Communicator):
    """Collectives among the threads of a ThreadGroup, on host buffers: every rank posts a copy
    of its send, all wait, each reads what it needs, all wait again before the next collective
    may overwrite the posts. The reduce-scatter sums in f32 in rank order (as the MPI
    communicator does)."""

    def __init__(self, group, rank):
        super().__init__(rank, group.world, "cpu")
        self.group = group

    def _exchange(self, send, read):
        g = self.group
        g.sent[self.rank] = send.numpy().copy()
        g.barrier.wait()
        try:
            read(g.sent)
        finally:
            g.barrier.wait()

    def all_gather(self, send, recv, stream):
        assert stream is None  # host buffers
        self._exchange(send, lambda sent: np.concatenate(sent, out=recv.numpy()))

    def reduce_scatter_sum(self, send, recv, stream):
        n, mine = recv.count, slice(self.rank * recv.count, (self.rank + 1) * recv.count)

        def read(sent):
            total = np.zeros(n, np.float32)
            for part in sent:
                total += part[mine].astype(np.float32)
            recv.numpy()[:] = total.astype(recv.numpy().dtype)

        self._exchange(send, read)


def run_ranks(world, body):
    """Runs body(rank, communicator) on `world` threads; re-raises the first failure."""
    group = ThreadGroup(world)
    comms = [ThreadCommunicator(group, rank) for rank in range(world)]
    errors = [None] * world

    def run(rank):
        try:
            body(rank, comms[rank])
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors[rank] = e
            group.barrier.abort()  # the others stop waiting for this rank

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # The failing rank's own error, not the others' broken barriers.
    failed = [e for e in errors if e is not None]
    if failed:
        raise next((e for e in failed if isinstance(e, AssertionError)), failed[0])


@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_matches_the_single_rank_layer_and_the_oracle(world):
    seed = int.from_bytes(os.urandom(4), "little")
    # W = 4 runs every other setting: the two together cover each one (CI time).
    for setting in dcp_case.settings(subset=world == 4):
        case = dcp_case.GlobalCase(seed, world, setting)
        try:
            run_ranks(world, lambda rank, comm: dcp_case.check_rank(case, rank, comm, seed))
        except AssertionError as e:
            raise AssertionError(f"W {world}, {setting}, seed {seed}: {e}") from e


def test_placement_helpers_match_counting():
    for world in range(1, 6):
        for interleave in (1, 2, 3, 16):
            turn = world * interleave
            owners = [mlakit.dcp_owner_rank(p, world, interleave) for p in range(3 * turn + 5)]
            for rank in range(world):
                held = [p for p, k in enumerate(owners) if k == rank]
                # The j-th position a rank holds is its local position j.
                assert [mlakit.dcp_local_position(p, world, interleave) for p in held] == \
                    list(range(len(held)))
                for length in range(len(owners) + 1):
                    assert mlakit.dcp_local_seq_len(length, world, rank, interleave) == \
                        sum(1 for p in held if p < length)
    with pytest.raises(ValueError, match="rank must be in"):
        mlakit.dcp_local_seq_len(5, 2, 2)
    with pytest.raises(ValueError, match="seq_len must be >= 0"):
        mlakit.dcp_local_seq_len(-5, 2, 0)
    with pytest.raises(ValueError, match="position must be >= 0"):
        mlakit.dcp_owner_rank(-1, 2)
    with pytest.raises(ValueError, match="position must be >= 0"):
        mlakit.dcp_local_position(-1, 2)


def small_config(**dcp):
    return mlakit.MlaConfig(scale=0.1, num_heads=N, kv_lora_rank=L, qk_rope_head_dim=R,
                            qk_nope_head_dim=P, v_head_dim=V, act_dtype="float32", block_size=16,
                            **dcp)


def test_configuration_and_communicator_must_agree(rng):
    weight = rng.standard_normal((N * (P + V), L)).astype(np.float32)
    comm = ThreadCommunicator(ThreadGroup(2), 1)
    with pytest.raises(ValueError, match="dcp.world_size is 2 but no communicator was given"):
        mlakit.MlaAttention(small_config(dcp_world_size=2), weight)
    with pytest.raises(ValueError, match="the communicator is rank 1 of 2, but the configuration "
                                         "says dcp.rank 0 of dcp.world_size 2"):
        mlakit.MlaAttention(small_config(dcp_world_size=2), weight, communicator=comm)
    with pytest.raises(ValueError, match="DcpConfig: interleave must be >= 1, got 0"):
        mlakit.MlaAttention(small_config(dcp_world_size=2, dcp_rank=1, dcp_interleave=0), weight,
                            communicator=comm)
    with pytest.raises(TypeError, match="communicator must be a mlakit.Communicator"):
        mlakit.MlaAttention(small_config(dcp_world_size=2, dcp_rank=1), weight,
                            communicator=object())
    with pytest.raises(ValueError, match="rank must be in"):
        ThreadCommunicator(ThreadGroup(2), 2)
    layer = mlakit.MlaAttention(small_config(dcp_world_size=2, dcp_rank=1), weight,
                                communicator=comm)
    assert layer.communicator is comm
    # W = 1 is no DCP: a communicator is not needed (and not kept).
    assert mlakit.MlaAttention(small_config(), weight, communicator=comm).communicator is None


class FailingCommunicator(mlakit.Communicator):
    def all_gather(self, send, recv, stream):
        raise ConnectionError(f"peer lost during an all-gather of {send.count} {send.dtype}")


def test_a_failing_collective_fails_the_forward_with_its_exception_as_cause(rng):
    # Rank 0 of 2 decodes 1 token of request 0 (context 20): the first collective is the decode's
    # all-gather of the absorbed queries, 1 token x N heads x (L + R) float32.
    weight = rng.standard_normal((N * (P + V), L)).astype(np.float32)
    layer = mlakit.MlaAttention(small_config(dcp_world_size=2), weight,
                                communicator=FailingCommunicator(0, 2))
    cache = np.zeros((4, 16, L + R), np.float32)
    batch = mlakit.ForwardBatch(np.array([0, 1], np.int32), np.array([21], np.int32),
                                np.array([[0]], np.int32), np.zeros(0, np.int64))
    output = np.zeros((1, N * V), np.float32)
    with pytest.raises(mlakit.MlakitRuntimeError,
                       match="the caller's all_gather callback failed") as info:
        layer.forward(rng.standard_normal((1, N, P + R)).astype(np.float32),
                      np.zeros((1, L), np.float32), np.zeros((1, R), np.float32), cache, batch,
                      output)
    assert info.value.status == "backend"
    assert isinstance(info.value.__cause__, ConnectionError)
    assert f"{N * (L + R)} float32" in str(info.value.__cause__)
    # A later failure of another kind carries no stale cause.
    with pytest.raises(mlakit.MlakitValueError, match="output") as again:
        layer.forward(rng.standard_normal((1, N, P + R)).astype(np.float32),
                      np.zeros((1, L), np.float32), np.zeros((1, R), np.float32), cache, batch,
                      np.zeros((1, N * V + 1), np.float32))
    assert again.value.__cause__ is None
