"""FlashMLA's dense decode (``flash_mla`` package) over mlakit's ``mla_decode``: same names,
argument orders and semantics, on torch tensors.

- ``get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k)`` ->
  ``(tile_scheduler_metadata, num_splits)``
- ``flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
  tile_scheduler_metadata, num_splits, softmax_scale=None, causal=False, descale_q=None,
  descale_k=None)`` -> ``(out [b, s_q, h_q, head_dim_v], lse float32 [b, h_q, s_q])``

FlashMLA's contract, point by point, and how it maps onto mlakit:

- k_cache is [num_blocks, page_size, h_kv, d] with h_kv = 1 (MQA over the latent cache); its
  first head_dim_v values are V. h_kv > 1 raises ValueError (mlakit's decode has one KV head).
- softmax_scale defaults to 1 / sqrt(d), d = q's head dimension (576 for DeepSeek's MLA).
- causal=False: every query of request b sees all cache_seqlens[b] keys. causal=True: bottom-right
  aligned, query i (of s_q) sees keys [0, cache_seqlens[b] - s_q + i]. mlakit's decode is always
  bottom-right causal and needs each length to be 0 or >= s_q. So for s_q > 1: non-causal runs
  each query as its own one-token request over the same block-table row (one mla_decode call);
  causal runs mlakit's decode with the requests of 0 < length < s_q set to 0, plus one such
  per-query call in which only those requests have keys, and takes each request's rows from the
  call that served it (torch.where). Exact either way; the lengths are never read on the host.
- A query without keys gets out 0 and lse +inf (FlashMLA's convention; mlakit's is -inf).
- lse is the natural-log LSE, [b, h_q, s_q] (mlakit's is [b, s_q, h_q]).
- The outputs are allocated here, of q's dtype (bf16 for an fp8 q).
- fp8: q and k_cache float8_e4m3fn [.., 576] with descale_q / descale_k (float32 tensors on q's
  device, one value or one per request): q = code * descale_q, K = V = code * descale_k. The
  kernel reads them (mlakit.mla_decode's tensor scales): no host read, one call for per-request
  descales; a descale that is not finite and > 0 gives NaN rows for its requests (CUDA: reported
  by mlakit.check_device_errors; CPU: raises).
- Also accepted (FlashMLA's later keywords): ``is_fp8_kvcache=True`` for a 656-byte fp8_ds_mla
  k_cache (uint8 or float8_e4m3fn [.., 656]) with a 16-bit q; ``indices`` (sparse attention) raises
  NotImplementedError.

The metadata carry no schedule: mlakit plans the split-KV work inside each call (from the host
cache_seqlens on CPU, from the shape on CUDA). They are int32 tensors of FlashMLA's shapes, so
callers that copy them into persistent CUDA-graph buffers keep working.

CUDA graphs: flash_mla_with_kvcache reads no tensor on the host (cache_seqlens, descales and the
masking of short requests stay device tensor ops; the outputs and the split workspace come from
torch's allocator, which serves a capture from the graph's pool), so it can be captured in
torch.cuda.graph; a replay follows new values written into the captured cache_seqlens, block
table, q, cache and descale tensors (tested on a GPU by python/tests/test_compat_flash_mla_cuda.py).
The CPU path reads them on the host inside the library. Not run under torch.compile.
"""

import torch

from .. import ops as _ops
from ._common import fail, host_scale, require_dtype, require_ndim

# why: FlashMLA's TileSchedulerMetaDataSize, the int32 fields per SM part of its metadata; the
# placeholder keeps that shape for callers that size persistent buffers by it.
TILE_SCHEDULER_METADATA_SIZE = 8
DS_MLA_ENTRY_BYTES = 656  # why: fp8_ds_mla entry = 512 e4m3 + 4 f32 tile scales + 64 16-bit rope
DS_MLA_HEAD_DIM = 576  # why: q's head dimension against an fp8_ds_mla cache (512 latent + 64 rope)

_FP8 = torch.float8_e4m3fn
_FLOAT16 = (torch.bfloat16, torch.float16)


def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None,
                     is_fp8_kvcache=False, topk=None):
    """FlashMLA's ``get_mla_metadata`` -> (tile_scheduler_metadata, num_splits).

    cache_seqlens: int32 [b]; num_q_tokens_per_head_k: s_q * h_q / h_kv; num_heads_k: must be 1.
    Returns int32 tensors on cache_seqlens' device: tile_scheduler_metadata
    [1, TILE_SCHEDULER_METADATA_SIZE] (zeros) and num_splits [b + 1] (0, 1, ..., b: one piece per
    request). They are placeholders of FlashMLA's types and shapes: flash_mla_with_kvcache checks
    their shapes and plans the work itself (mlakit's planner, per call). topk (sparse) raises
    NotImplementedError."""
    op = "flash_mla.get_mla_metadata"
    _require_one_kv_head(op, int(num_heads_k))
    if topk is not None:
        fail(op, "topk (sparse attention) is not supported", NotImplementedError)
    require_ndim(op, "cache_seqlens", cache_seqlens, 1, "[batch_size]")
    require_dtype(op, "cache_seqlens", cache_seqlens, (torch.int32,))
    if int(num_q_tokens_per_head_k) <= 0:
        fail(op, f"num_q_tokens_per_head_k must be positive, got {num_q_tokens_per_head_k}")
    device = cache_seqlens.device
    tile_scheduler_metadata = torch.zeros((1, TILE_SCHEDULER_METADATA_SIZE), dtype=torch.int32,
                                          device=device)
    num_splits = torch.arange(cache_seqlens.shape[0] + 1, dtype=torch.int32, device=device)
    return tile_scheduler_metadata, num_splits


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata, num_splits, softmax_scale=None, causal=False,
                           descale_q=None, descale_k=None, is_fp8_kvcache=False, indices=None):
    """FlashMLA's dense decode -> (out [b, s_q, h_q, head_dim_v], lse float32 [b, h_q, s_q]).

    q: [b, s_q, h_q, d]; k_cache: [num_blocks, page_size, 1, d] (V = its first head_dim_v
    values); block_table: int32 [b, max_blocks]; cache_seqlens: int32 [b];
    tile_scheduler_metadata, num_splits: get_mla_metadata's; softmax_scale: None = 1 / sqrt(d);
    causal: bottom-right (False: every query sees all keys); descale_q, descale_k: float32
    tensors of 1 or b values on q's device, required for an fp8 q / k_cache (read by the kernel).
    Queries without keys: out 0, lse +inf. Reads no tensor on the host: with CUDA tensors the
    call can be captured in a CUDA graph (replays follow new cache_seqlens, block tables and
    descale values). See the module docstring for the contract."""
    op = "flash_mla.flash_mla_with_kvcache"
    if indices is not None:
        fail(op, "indices (sparse attention) is not supported", NotImplementedError)
    require_ndim(op, "q", q, 4, "[batch_size, seq_len_q, num_heads_q, head_dim]")
    require_ndim(op, "k_cache", k_cache, 4, "[num_blocks, page_block_size, num_heads_k, head_dim]")
    _require_one_kv_head(op, k_cache.shape[2])
    batch, s_q, heads, dim = q.shape
    _check_metadata(op, tile_scheduler_metadata, num_splits, batch)
    require_ndim(op, "cache_seqlens", cache_seqlens, 1, "[batch_size]")
    require_dtype(op, "cache_seqlens", cache_seqlens, (torch.int32,))
    if cache_seqlens.shape[0] != batch:
        fail(op, f"cache_seqlens must have batch_size = {batch} entries, got "
                 f"{cache_seqlens.shape[0]}")
    kv_cache_dtype, cache, out_dtype = _cache_format(op, q, k_cache[:, :, 0], is_fp8_kvcache)
    q_scale, k_scale = _descales(op, q, kv_cache_dtype, descale_q, descale_k, batch)
    scale = dim ** -0.5 if softmax_scale is None else float(softmax_scale)
    dv = int(head_dim_v)

    out = torch.empty((batch, s_q, heads, dv), dtype=out_dtype, device=q.device)
    lse = torch.empty((batch, s_q, heads), dtype=torch.float32, device=q.device)  # mlakit layout
    decode = dict(cache=cache, scale=scale, kv_cache_dtype=kv_cache_dtype, kv_lora_rank=dv)
    if s_q == 1:  # one query sees all its keys under either flag: mlakit's own masking
        _ops.mla_decode(q, cache, block_table, cache_seqlens, out, lse, scale, kv_cache_dtype,
                        q_scale, k_scale, kv_lora_rank=dv)
        return out, _flash_mla_lse(lse)
    lens = cache_seqlens.long()
    if not causal:  # every query sees all keys: one one-token request per query
        _decode_per_query(q, block_table, lens.repeat_interleave(s_q), out, lse, q_scale, k_scale,
                          **decode)
        return out, _flash_mla_lse(lse)
    # Causal: mlakit's masking is FlashMLA's for requests of 0 or >= s_q keys; the others (0 <
    # len < s_q, where FlashMLA's first queries see no key) are masked out of that call and
    # decoded query by query, each request's rows then taken from the call that served it.
    short = (lens > 0) & (lens < s_q)  # [b]
    native_lens = torch.where(short, 0, lens).to(torch.int32)
    _ops.mla_decode(q, cache, block_table, native_lens, out, lse, scale, kv_cache_dtype, q_scale,
                    k_scale, kv_lora_rank=dv)
    query = torch.arange(s_q, device=q.device).repeat(batch)  # i of each (b, i), b-major
    visible = (lens.repeat_interleave(s_q) - s_q + 1 + query).clamp_min(0)
    visible = torch.where(short.repeat_interleave(s_q), visible, 0)
    out_short, lse_short = torch.empty_like(out), torch.empty_like(lse)
    _decode_per_query(q, block_table, visible, out_short, lse_short, q_scale, k_scale, **decode)
    out = torch.where(short[:, None, None, None], out_short, out)
    return out, _flash_mla_lse(torch.where(short[:, None, None], lse_short, lse))


def _require_one_kv_head(op, num_heads_k):
    if num_heads_k != 1:
        fail(op, f"h_kv (num_heads_k) must be 1 (MLA decodes over one latent KV head), got "
                 f"{num_heads_k}")


def _check_metadata(op, tile_scheduler_metadata, num_splits, batch):
    """get_mla_metadata's tensors: int32, num_splits [b + 1] (read for their shapes only)."""
    require_dtype(op, "tile_scheduler_metadata", tile_scheduler_metadata, (torch.int32,))
    require_dtype(op, "num_splits", num_splits, (torch.int32,))
    if tuple(num_splits.shape) != (batch + 1,):
        fail(op, f"num_splits must be [batch_size + 1] = [{batch + 1}] (from get_mla_metadata "
                 f"for this batch), got {list(num_splits.shape)}")


def _cache_format(op, q, cache, is_fp8_kvcache):
    """(mlakit kv_cache_dtype, the [num_blocks, page_size, W] cache mlakit reads, out dtype)."""
    if is_fp8_kvcache:  # fp8_ds_mla: 656-byte entries, 16-bit q
        if cache.shape[2] != DS_MLA_ENTRY_BYTES:
            fail(op, f"is_fp8_kvcache needs {DS_MLA_ENTRY_BYTES}-byte fp8_ds_mla entries, got "
                     f"k_cache head_dim {cache.shape[2]}")
        require_dtype(op, "k_cache (is_fp8_kvcache)", cache, (torch.uint8, _FP8))
        require_dtype(op, "q (is_fp8_kvcache)", q, _FLOAT16)
        return "fp8_ds_mla", cache.view(torch.uint8), q.dtype
    if cache.dtype == _FP8:
        require_dtype(op, "q (with an fp8 k_cache)", q, (_FP8,))
        return "fp8_e4m3", cache, torch.bfloat16
    if q.dtype != cache.dtype:
        fail(op, f"q and k_cache must have one dtype, got {q.dtype} and {cache.dtype}", TypeError)
    return "auto", cache, q.dtype


def _descales(op, q, kv_cache_dtype, descale_q, descale_k, batch):
    """(q_scale, k_scale) as mla_decode takes them: the descales of an fp8 q / k_cache (tensors
    as given, numbers as floats), 1.0 otherwise."""
    if kv_cache_dtype != "fp8_e4m3":
        if descale_q is not None or descale_k is not None:
            fail(op, "descale_q / descale_k apply only to an fp8 q and k_cache")
        return 1.0, 1.0
    if descale_q is None or descale_k is None:
        fail(op, "an fp8 q and k_cache need descale_q and descale_k")
    return _descale(op, q, "descale_q", descale_q, batch), \
        _descale(op, q, "descale_k", descale_k, batch)


def _descale(op, q, name, descale, batch):
    """A descale of one value or one per request: a tensor on q's device as float32 [1] or [b]
    (never read here), a number as a float."""
    if not isinstance(descale, torch.Tensor):
        return host_scale(descale, op, name)
    if descale.numel() not in (1, batch):
        fail(op, f"{name} must have 1 or batch_size = {batch} values, got shape "
                 f"{tuple(descale.shape)}")
    if not descale.dtype.is_floating_point:
        fail(op, f"{name} must be a floating-point tensor (float32), got {descale.dtype}",
             TypeError)
    if descale.device != q.device:
        fail(op, f"{name} must be on q's device {q.device}, got {descale.device}")
    return descale.reshape(-1).to(torch.float32)


def _decode_per_query(q, block_table, visible, out, lse, q_scale, k_scale, *, cache, scale,
                      kv_cache_dtype, kv_lora_rank):
    """mlakit's decode with every query its own one-token request over its request's block-table
    row, seeing visible[b * s_q + i] keys (the bottom-right query of a request of that many keys);
    per-request descales follow their queries. out, lse in mlakit's layout."""
    batch, s_q, heads, dim = q.shape
    rows = block_table.repeat_interleave(s_q, dim=0)
    q_scale, k_scale = (_per_query(s, batch, s_q) for s in (q_scale, k_scale))
    _ops.mla_decode(q.reshape(batch * s_q, 1, heads, dim), cache, rows, visible.to(torch.int32),
                    out.view(batch * s_q, 1, heads, out.shape[3]),
                    lse.view(batch * s_q, 1, heads), scale, kv_cache_dtype, q_scale, k_scale,
                    kv_lora_rank=kv_lora_rank)


def _per_query(scale, batch, s_q):
    """A per-request descale tensor [b] repeated for each query of its request (b * s_q)."""
    if isinstance(scale, torch.Tensor) and scale.numel() == batch and batch > 1:
        return scale.repeat_interleave(s_q)
    return scale


def _flash_mla_lse(lse):
    """mlakit's LSE [b, s_q, h_q] (-inf: no keys) as FlashMLA's [b, h_q, s_q] (+inf: no keys),
    on the device (masked_fill_: no host read)."""
    flash = lse.permute(0, 2, 1).contiguous()
    return flash.masked_fill_(flash == float("-inf"), float("inf"))


__all__ = ["flash_mla_with_kvcache", "get_mla_metadata"]
