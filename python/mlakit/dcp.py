"""Where a request's tokens live under decode context parallelism (mlakit/dcp.hpp, docs/dcp.md):
with W ranks and interleave I, global position p belongs to rank (p // I) % W, at local position
(p // (W I)) I + p % I of that rank's paged cache. An engine sizes each rank's block table with
dcp_local_seq_len: a request of global length L needs ceil(dcp_local_seq_len(L, W, r, I) /
block_size) blocks on rank r."""

from ._args import to_int


def _check(world_size, interleave):
    to_int(world_size, "world_size")
    to_int(interleave, "interleave")
    if world_size < 1 or interleave < 1:
        raise ValueError(f"mlakit: world_size and interleave must be >= 1, got {world_size} "
                         f"and {interleave}")


def _check_non_negative(name, value):
    to_int(value, name)
    if value < 0:
        raise ValueError(f"mlakit: {name} must be >= 0, got {value}")


def dcp_owner_rank(position, world_size, interleave=1):
    """The rank holding global position `position` (>= 0)."""
    _check(world_size, interleave)
    _check_non_negative("position", position)
    return (position // interleave) % world_size


def dcp_local_position(position, world_size, interleave=1):
    """The position `position` (>= 0) has in its owner's cache."""
    _check(world_size, interleave)
    _check_non_negative("position", position)
    return position // (world_size * interleave) * interleave + position % interleave


def dcp_local_seq_len(seq_len, world_size, rank, interleave=1):
    """How many of the positions [0, seq_len) rank `rank` holds (spec B.7 with F-7 fixed)."""
    _check(world_size, interleave)
    _check_non_negative("seq_len", seq_len)
    to_int(rank, "rank")
    if not 0 <= rank < world_size:
        raise ValueError(f"mlakit: rank must be in [0, {world_size}), got {rank}")
    turn = world_size * interleave
    return seq_len // turn * interleave + min(max(seq_len % turn - rank * interleave, 0),
                                              interleave)


__all__ = ["dcp_local_position", "dcp_local_seq_len", "dcp_owner_rank"]
