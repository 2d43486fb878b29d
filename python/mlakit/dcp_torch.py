"""Decode context parallelism with torch.distributed (docs/dcp.md): the collectives run on the
caller's ProcessGroup around mlakit's local ops, for engines written in Python.

Every rank of the group serves its own N query heads (H = W N in the group) and holds, in a
paged cache of its own, the positions p of every request with (p // I) % W == its rank, at local
position (p // (W I)) * I + p % I. Import this module only where torch is installed.

Two ways in:
- ProcessGroupCommunicator: the whole layer (MlaAttention with dcp_world_size > 1: cache writes,
  prefill context chunks and decode) with its collectives on the ProcessGroup;
- gather_queries / combine_heads / dcp_decode: the decode collectives around mla_decode, for
  engines that compose the ops themselves."""

import contextlib
import ctypes

import torch
import torch.distributed as dist

from .communicator import Communicator
from .ops import dcp_lse_correct, mla_decode, scaled_fp8_quant

_TORCH_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "uint8": torch.uint8,
}


class _CudaBytes:
    """A device buffer as raw bytes, for torch.as_tensor (CUDA array interface, version 2: no
    stream to synchronise with; the collective is ordered on the layer's stream instead)."""

    def __init__(self, address, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (address, False), "version": 2}


def as_tensor(buffer):
    """A mlakit.Buffer as a 1-D torch tensor of its dtype over the same memory (no copy). Valid
    only during the collective it was handed to."""
    if buffer.device == "cpu":
        raw = (ctypes.c_uint8 * buffer.nbytes).from_address(buffer.address)
        data = torch.frombuffer(raw, dtype=torch.uint8)
    else:
        data = torch.as_tensor(_CudaBytes(buffer.address, buffer.nbytes), device=buffer.device)
    return data.view(_TORCH_DTYPES[buffer.dtype])


@contextlib.contextmanager
def _on_stream(device, stream):
    """Makes the layer's stream current for a GPU collective (torch.distributed orders its work
    after the current stream's and, for a synchronous call, the current stream after it)."""
    if device == "cpu":
        yield
        return
    cuda_stream = (torch.cuda.ExternalStream(stream, device=device) if stream
                   else torch.cuda.default_stream(device))
    with torch.cuda.device(device), torch.cuda.stream(cuda_stream):
        yield


class ProcessGroupCommunicator(Communicator):
    """The DCP group's collectives on a torch.distributed ProcessGroup (None: the default group),
    for MlaAttention(config, weight, communicator=...) (a ProcessGroup passed there is wrapped in
    one on config.device). device: where the layer's tensors live, 'cpu' (gloo) or 'cuda:<index>'
    (NCCL); None: 'cpu' for gloo, else torch's current CUDA device. Rank and world size are the
    group's, which must be config's dcp_rank and dcp_world_size.

    The all-gather moves bytes (fp8 cache entries travel as uint8); the reduce-scatter sums in
    the buffer's dtype (MlaAttention exchanges float32). gloo has no reduce-scatter: an
    all-reduce of the whole send, keeping this rank's slice (W times the bytes; fine on a CPU
    test bed). Collectives run synchronously with respect to the layer's stream, so a CPU call
    returns when they are done."""

    def __init__(self, group=None, device=None):
        self.group = group
        self._gloo = dist.get_backend(group) == "gloo"
        if device is None:
            device = "cpu" if self._gloo else f"cuda:{torch.cuda.current_device()}"
        super().__init__(dist.get_rank(group), dist.get_world_size(group), device)

    def all_gather(self, send, recv, stream):
        with _on_stream(self.device, stream):
            out = as_tensor(recv).view(torch.uint8)
            src = as_tensor(send).view(torch.uint8)
            if send.address == recv.address + self.rank * send.nbytes:
                src = src.clone()  # in place: the send is recv's own slice
            if self._gloo:
                dist.all_gather(list(out.chunk(self.world_size)), src, group=self.group)
            else:
                dist.all_gather_into_tensor(out, src, group=self.group)

    def reduce_scatter_sum(self, send, recv, stream):
        with _on_stream(self.device, stream):
            out, src = as_tensor(recv), as_tensor(send)
            if self._gloo:
                total = src.clone()  # the send stays as mlakit left it
                dist.all_reduce(total, group=self.group)
                out.copy_(total[self.rank * recv.count:(self.rank + 1) * recv.count])
            else:
                dist.reduce_scatter_tensor(out, src, group=self.group)


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
