"""Decode context parallelism with torch.distributed (docs/dcp.md): the collectives run on the
caller's ProcessGroup around mlakit's local ops, for engines written in Python.

Every rank of the group serves its own N query heads (H = W N in the group) and holds, in a
paged cache of its own, the positions p of every request with (p // I) % W == its rank, at local
position (p // (W I)) * I + p % I. Import this module only where torch is installed."""

import torch
import torch.distributed as dist

from .ops import dcp_lse_correct, mla_decode, scaled_fp8_quant


def _all_gather(t, group):
    # The list form: every backend has it (gloo lacks all_gather_into_tensor on older torch).
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return parts


def gather_queries(q_local, group=None):
    """q_local: [T, N, E] this rank's (absorbed) queries; returns [T, W N, E], head k N + n being
    rank k's head n."""
    return torch.cat(_all_gather(q_local, group), dim=1)


def combine_heads(partial_out, partial_lse_tokens_heads, group=None):
    """partial_out: [T, W N, D] this rank's attention of every head of the group over its own keys
    (float32/float16/bfloat16); partial_lse_tokens_heads: float32 [T, W N]. All-gathers the LSEs,
    weighs this rank's partial (dcp_lse_correct) and sums the ranks' shares so that each keeps
    its own heads: returns float32 [T, N, D], this rank's heads over the keys of every rank
    (0 for a request no rank holds a key of)."""
    w, rank = dist.get_world_size(group), dist.get_rank(group)
    t, h, d = partial_out.shape
    all_lse = torch.stack(_all_gather(partial_lse_tokens_heads.float(), group))  # [W, T, W N]
    corrected = torch.empty((t, w, h // w, d), dtype=torch.float32, device=partial_out.device)
    dcp_lse_correct(partial_out, all_lse, rank, corrected)
    send = corrected.transpose(0, 1).contiguous()  # [W, T, N, D]: slice k is rank k's heads
    if dist.get_backend(group) == "gloo":
        # gloo has no reduce-scatter: sum everything, keep this rank's slice (W x the bytes).
        dist.all_reduce(send, group=group)
        return send[rank].clone()
    out = torch.empty((t, h // w, d), dtype=torch.float32, device=partial_out.device)
    dist.reduce_scatter_tensor(out, send, group=group)
    return out


def dcp_decode(q_local, kv_cache, block_table, local_seq_lens, scale, *, kv_lora_rank,
               kv_cache_dtype="auto", q_scale=1.0, k_scale=1.0, group=None):
    """One decode step (one query a request) of the group: q_local [B, N, L + R] this rank's
    absorbed queries (activation dtype); kv_cache, block_table (int32 [B, cols]) this rank's;
    local_seq_lens: int32 [B] the tokens this rank holds of each request. Returns float32
    [B, N, L]: this rank's heads over every rank's keys, ready for the V up-projection."""
    q_all = gather_queries(q_local, group)
    b, h, e = q_all.shape
    if kv_cache_dtype in ("fp8", "fp8_e4m3"):
        q_all = scaled_fp8_quant(q_all, q_scale)  # as MlaAttention does, after the gather
    out = torch.empty((b, 1, h, kv_lora_rank), dtype=torch.float32, device=q_local.device)
    lse = torch.empty((b, 1, h), dtype=torch.float32, device=q_local.device)
    mla_decode(q_all.reshape(b, 1, h, e), kv_cache, block_table, local_seq_lens, out, lse, scale,
               kv_cache_dtype, q_scale, k_scale, kv_lora_rank=kv_lora_rank)
    return combine_heads(out.reshape(b, h, kv_lora_rank), lse.reshape(b, h), group)
