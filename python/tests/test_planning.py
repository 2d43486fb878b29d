"""The host planner from Python: split, reorder, workspace sizing and whole plans."""

import numpy as np
import pytest

import mlakit


def test_split_counts_decodes_then_prefills():
    # q_lens 1, 1, 4, 7: two decodes (threshold 1), two prefills.
    counts = mlakit.split_decodes_and_prefills([0, 1, 2, 6, 13])
    assert counts == mlakit.SplitCounts(2, 2, 2, 11)
    # A higher threshold makes the 4-token request a decode too.
    assert mlakit.split_decodes_and_prefills([0, 1, 2, 6, 13], decode_threshold=4).num_decodes == 3


def test_reorder_moves_only_misplaced_requests():
    # Regions: 0 prefill (nothing computed), 1 decode, 2 prefill, 3 extend. Target order decode,
    # extend, prefill; request 2 already sits in the prefill region and stays.
    order = mlakit.reorder_decodes_first([5, 1, 1, 3], [0, 10, 0, 4])
    assert order.tolist() == [1, 3, 2, 0]


def test_chunked_prefill_workspace_tokens():
    # min(max(8 * 4096, 4 * 256 * 64), 65536) = 65536
    assert mlakit.chunked_prefill_workspace_tokens(4096, 256, 64) == 65536
    # max(8 * 100, 4 * 2 * 16) = 800
    assert mlakit.chunked_prefill_workspace_tokens(100, 2, 16) == 800


def test_plan_of_a_mixed_batch():
    # One decode (context 9), one prefill of 4 tokens after 6 computed.
    p = mlakit.plan([0, 1, 5], [10, 10], block_table_width=3, workspace_tokens=64, block_size=4)
    assert p.split == mlakit.SplitCounts(1, 1, 1, 4)
    assert p.decode_query_len == 1
    assert p.prefill_query_start_loc.tolist() == [0, 4]
    assert p.prefill_context_lens.tolist() == [6]
    assert p.has_context and len(p.context_chunks) == 1
    chunk = p.context_chunks[0]
    assert chunk.starts.tolist() == [0] and chunk.seq_lens.tolist() == [6]
    assert chunk.cu_seq_lens.tolist() == [0, 6]
    assert chunk.token_to_seq.tolist() == [0] * 6
    assert (chunk.total_tokens, chunk.max_seq_len) == (6, 6)
    assert p.decode_split_offsets.tolist() == [0, 1]


@pytest.mark.parametrize("policy", ["packed", "equal_share"])
def test_plan_chunks_cover_every_context_once(policy):
    # Three prefills with long contexts and a small workspace: several chunks.
    q_lens = np.array([3, 2, 5])
    contexts = np.array([70, 0, 45])
    qsl = np.concatenate([[0], np.cumsum(q_lens)])
    seq_lens = q_lens + contexts
    workspace = 32
    p = mlakit.plan(qsl, seq_lens, block_table_width=32, workspace_tokens=workspace,
                    block_size=8, chunk_policy=policy)
    assert p.split.num_decodes == 0 and p.prefill_context_lens.tolist() == contexts.tolist()
    assert len(p.context_chunks) >= 4  # 115 context tokens through a 32-row workspace
    next_start = np.zeros(3, dtype=np.int64)
    for chunk in p.context_chunks:
        assert chunk.total_tokens <= workspace
        gathered = chunk.seq_lens > 0  # a request gathers where its previous chunk ended
        assert chunk.starts[gathered].tolist() == next_start[gathered].tolist()
        assert chunk.cu_seq_lens.tolist() == [0] + np.cumsum(chunk.seq_lens).tolist()
        assert chunk.token_to_seq.tolist() == np.repeat(np.arange(3), chunk.seq_lens).tolist()
        assert chunk.max_seq_len == chunk.seq_lens.max()
        next_start += chunk.seq_lens
    assert next_start.tolist() == contexts.tolist()


def test_plan_rejects_a_sequence_longer_than_the_block_table():
    with pytest.raises(ValueError, match="seq_len 100 needs 25 blocks of block_size 4"):
        mlakit.plan([0, 1], [100], block_table_width=1, workspace_tokens=64, block_size=4)


def test_plan_arguments_are_checked_in_python():
    with pytest.raises(ValueError, match=r"len\(seq_lens\) \+ 1 = 2 entries, got 3"):
        mlakit.plan([0, 1, 2], [1], block_table_width=1, workspace_tokens=8)
    with pytest.raises(ValueError, match="chunk_policy must be one of"):
        mlakit.plan([0, 1], [1], block_table_width=1, workspace_tokens=8, chunk_policy="greedy")
    with pytest.raises(ValueError, match="outside the int32 range"):
        mlakit.plan([0, 2**40], [1], block_table_width=1, workspace_tokens=8)
