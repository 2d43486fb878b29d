"""vLLM's MLA ops (``vllm._custom_ops``) over mlakit: same names, argument orders and semantics,
on torch tensors (CPU and CUDA; CUDA-graph safety per function below and in docs/python.md).

Contract, as vLLM's public ops define it:

- ``concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)``
- ``gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq,
  num_tokens, kv_cache_dtype, scale, seq_starts=None)``
- ``cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None)``
- ``cp_gather_and_upconvert_fp8_kv_cache(src_cache, dst, block_table, seq_lens,
  workspace_starts, batch_size)``
- ``merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse,
  output_lse=None, prefill_tokens_with_context=None, output_scale=None)``
- ``scaled_fp8_quant(input, scale=None, num_token_padding=None, scale_ub=None,
  use_per_token_if_dynamic=False, output=None) -> (out, scale)``
- ``mla_decode_kvcache_cpu(out, query, kv_cache, scale, block_tables, seq_lens)``

The ops write into the tensors passed in and return None, except scaled_fp8_quant. Scales that
vLLM passes as tensors (``scale``, ``k_scale``, ``output_scale``, ``scale_ub``) are accepted as
one-element tensors or Python floats. A scale that is a float32 tensor on a CUDA device is read by
the kernels on the device (no host read, no synchronisation), so these calls can be captured in a
CUDA graph and a replay uses the value the scale tensor holds then; a value there that is not
finite and > 0 gives NaN outputs and is reported by mlakit.check_device_errors. Scales on the host
(and Python floats) are read on the host, as before.

CUDA-graph safe with CUDA tensors (no host read, no synchronisation): concat_and_cache_mla,
gather_and_maybe_dequant_cache, cp_gather_cache, merge_attn_states (also with output_scale, and
prefill_tokens_with_context as an int), scaled_fp8_quant (static, dynamic per-tensor and dynamic
per-token), cp_gather_and_upconvert_fp8_kv_cache (seq_lens / workspace_starts turned into a
gather on the device). The CUDA paths are tested on a GPU by python/tests/test_compat_vllm_cuda.py
(skipped without one); none has run under torch.compile. mla_decode_kvcache_cpu serves CUDA
tensors too, but plans and allocates per call (mlakit.mla_decode without a schedule): not for
CUDA graphs.
"""

import torch

from .. import ops as _ops
from ._common import FP8_E4M3_MAX, fail, host_ints, require_dtype, require_ndim, scale_arg

FP8_DTYPE = torch.float8_e4m3fn  # vLLM's fp8 activation / cache dtype on NVIDIA (OCP e4m3fn)

# why: vLLM's per-token dynamic quant floors each row scale at 1 / (448 * 512), so an all-zero
# (or tiny) row gets a finite, non-zero scale and its codes stay finite.
PER_TOKEN_MIN_SCALE = 1.0 / (FP8_E4M3_MAX * 512.0)

DS_MLA_ENTRY_BYTES = 656  # why: fp8_ds_mla entry = 512 e4m3 + 4 f32 tile scales + 64 16-bit rope
DS_MLA_HEAD_DIM = 576  # why: the upconverted entry = 512 latent values + 64 rope values
ROPE_DIM = 64  # why: DeepSeek's qk_rope_head_dim, the rope part of a query and a cache entry


# ---- Cache ops -----------------------------------------------------------------------------------


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """vLLM's ``concat_and_cache_mla``: writes token t's ``[kv_c[t] | k_pe[t]]`` into slot
    ``slot_mapping[t]`` of the paged cache; a negative slot skips the token.

    kv_c: [T', L]; k_pe: [T', R] or vLLM's [T', 1, R]; kv_cache: [num_blocks, block_size, W]
    (written); slot_mapping: int64 [T] (T <= T'); kv_cache_dtype: 'auto' (W = L + R, the
    activation dtype), 'fp8' / 'fp8_e4m3' (W = L + R bytes, e4m3(x / scale)) or 'fp8_ds_mla'
    (W = 656 bytes, per-128-value tile scales; ``scale`` unused); scale: one-element tensor or
    float (a CUDA tensor, float32, is read by the kernel; others on the host)."""
    _ops.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype,
                              scale_arg(scale, "vllm.concat_and_cache_mla", "scale"))


def gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq,
                                   num_tokens, kv_cache_dtype, scale, seq_starts=None):
    """vLLM's ``gather_and_maybe_dequant_cache``: row t < num_tokens of dst is the cache entry of
    request b = token_to_seq[t] at position t - cu_seq_lens[b] + seq_starts[b] (seq_starts None:
    0), dequantized to dst's dtype (fp8: code * scale in f32; fp8_ds_mla: code * tile scale, rope
    copied). Rows past num_tokens are not written.

    src_cache: [num_blocks, block_size, W]; dst: [>= num_tokens, L + R] (written); block_table:
    int32 [B, max_blocks]; cu_seq_lens: int32 [B + 1]; token_to_seq: int32 [>= num_tokens];
    scale: one-element tensor or float (a CUDA tensor, float32, is read by the kernel; others on
    the host)."""
    _ops.gather_and_maybe_dequant_cache(
        src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens, kv_cache_dtype,
        scale_arg(scale, "vllm.gather_and_maybe_dequant_cache", "scale"), seq_starts)


def cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None):
    """vLLM's ``cp_gather_cache``: the raw bytes of request b's cache entries at positions
    [seq_starts[b], seq_starts[b] + len_b) go to dst rows [cu_seq_lens[b], cu_seq_lens[b + 1]),
    len_b = cu_seq_lens[b + 1] - cu_seq_lens[b]. Other rows of dst are not written.

    src_cache: [num_blocks, block_size, W]; dst: [rows, W], src's dtype (written); block_table:
    int32 [>= batch_size, max_blocks]; cu_seq_lens: int32 [batch_size + 1]; seq_starts: int32
    [batch_size] or None (0)."""
    _ops.cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts)


def cp_gather_and_upconvert_fp8_kv_cache(src_cache, dst, block_table, seq_lens,
                                         workspace_starts, batch_size):
    """vLLM's ``cp_gather_and_upconvert_fp8_kv_cache``: request b's first seq_lens[b] entries of
    an fp8_ds_mla cache, dequantized to bf16, go to dst rows
    [workspace_starts[b], workspace_starts[b] + seq_lens[b]). Other rows keep their values.

    An fp8_ds_mla entry is 656 bytes: 512 e4m3 latent codes, four f32 scales (one per 128 codes),
    64 rope values in bf16. Its dst row is [code * tile scale (f32, then rounded to bf16) | rope
    bits copied]: 576 bf16 values.

    src_cache: uint8 (or float8_e4m3fn) [num_blocks, block_size, 656]; dst: bf16 [rows, 576]
    (written); block_table: int32 [>= batch_size, max_blocks]; seq_lens, workspace_starts:
    integer [>= batch_size]. The requests' row ranges must not overlap. For CUDA tensors
    seq_lens and workspace_starts are never read on the host: every dst row finds its request
    with device tensor ops, the entries are gathered into a staging buffer of dst's rows and
    merged into dst (torch.where), so the call is CUDA-graph safe (it moves about three times
    dst's bytes); a row range reaching past dst (or a negative length or start) is cut at dst's
    end and reported by mlakit.check_device_errors, as a block-table entry out of range of the
    gather (one extra staging row reads block -1 when any range is bad). CPU tensors are checked
    on the host first: such a range raises ValueError."""
    op = "vllm.cp_gather_and_upconvert_fp8_kv_cache"
    require_ndim(op, "src_cache", src_cache, 3, "[num_blocks, block_size, 656]")
    require_dtype(op, "src_cache", src_cache, (torch.uint8, FP8_DTYPE))
    if src_cache.shape[2] != DS_MLA_ENTRY_BYTES:
        fail(op, f"src_cache entries must be {DS_MLA_ENTRY_BYTES} bytes (fp8_ds_mla), got "
                 f"{src_cache.shape[2]}")
    require_ndim(op, "dst", dst, 2, "[rows, 576]")
    require_dtype(op, "dst", dst, (torch.bfloat16,))
    if dst.shape[1] != DS_MLA_HEAD_DIM:
        fail(op, f"dst rows must have {DS_MLA_HEAD_DIM} values, got {dst.shape[1]}")
    batch = int(batch_size)
    for name, t in (("seq_lens", seq_lens), ("workspace_starts", workspace_starts)):
        require_ndim(op, name, t, 1, "[>= batch_size]")
        if t.dtype.is_floating_point or t.dtype.is_complex:
            fail(op, f"{name} must hold integers, got {t.dtype}", TypeError)
        if t.shape[0] < batch:
            fail(op, f"{name} needs at least {batch} entries, got {t.shape[0]}")
    if src_cache.device.type != "cuda":  # the host may read them: report bad ranges
        _check_upconvert_rows(op, dst, seq_lens, workspace_starts, batch)
    rows, num_blocks, block_size = dst.shape[0], src_cache.shape[0], src_cache.shape[1]
    if batch == 0 or rows == 0 or num_blocks == 0 or block_table.shape[1] == 0:
        return  # no entry to gather (a request claiming some anyway names no block it could)
    lens, starts = seq_lens[:batch].long(), workspace_starts[:batch].long()
    request, position, valid = _rows_to_requests(lens, starts, rows)
    # Every dst row its own one-token request of the gather: block_table row t holds the block of
    # the entry row t takes, seq_starts[t] its slot in that block. Rows no request covers read
    # slot 0 of block 0, and their staged values are dropped below. One more staging row reads
    # block 0, or block -1 when some request's rows do not fit dst: the gather then reports a bad
    # index on the device (no host read), and skips that row.
    width = block_table.shape[1]
    column = torch.div(position, block_size, rounding_mode="floor").clamp(0, width - 1)
    block = torch.where(valid, block_table[request, column].long(), 0)
    slot = torch.where(valid, position % block_size, 0)
    misfit = ((lens < 0) | ((lens > 0) & ((starts < 0) | (starts + lens > rows)))).any()
    block = torch.cat([block, torch.where(misfit, -1, 0).reshape(1)])
    slot = torch.cat([slot, torch.zeros(1, dtype=slot.dtype, device=slot.device)])
    device = dst.device
    staged = torch.full((rows + 1, DS_MLA_HEAD_DIM), float("nan"), dtype=torch.bfloat16,
                        device=device)
    one_per_row = torch.arange(rows + 2, dtype=torch.int32, device=device)
    _ops.gather_and_maybe_dequant_cache(src_cache.view(torch.uint8), staged,
                                        block.to(torch.int32).unsqueeze(1), one_per_row,
                                        one_per_row[:rows + 1], rows + 1, "fp8_ds_mla", 1.0,
                                        slot.to(torch.int32))
    dst.copy_(torch.where(valid[:, None], staged[:rows], dst))


def _check_upconvert_rows(op, dst, seq_lens, workspace_starts, batch):
    """Host check (CPU tensors) that each request's rows lie inside dst."""
    lens = host_ints(seq_lens, op, "seq_lens", batch)
    starts = host_ints(workspace_starts, op, "workspace_starts", batch)
    for b in range(batch):
        inside = starts[b] >= 0 and starts[b] + lens[b] <= dst.shape[0]
        if lens[b] < 0 or (lens[b] > 0 and not inside):
            fail(op, f"request {b}: rows [{starts[b]}, {starts[b] + lens[b]}) are not inside the "
                     f"{dst.shape[0]} rows of dst")


def _rows_to_requests(lens, starts, rows):
    """For each of `rows` dst rows t, with device tensor ops only: the request b whose rows
    [starts[b], starts[b] + lens[b]) hold t, the position t - starts[b] in it, and whether any
    request holds t. The requests are sorted by start (a non-empty one after an empty one of the
    same start); a row's request is the last one starting at or before it."""
    lens, starts = lens.long(), starts.long()
    order = torch.argsort(starts * 2 + (lens > 0), stable=True)
    t = torch.arange(rows, device=starts.device)
    index = torch.searchsorted(starts[order].contiguous(), t, right=True) - 1
    request = order[index.clamp_min(0)]
    position = t - starts[request]
    valid = (index >= 0) & (position < lens[request])
    return request, position, valid


# ---- Attention pieces ----------------------------------------------------------------------------


def mla_decode_kvcache_cpu(out, query, kv_cache, scale, block_tables, seq_lens):
    """vLLM's ``mla_decode_kvcache_cpu``: the decode of one new token per request over the latent
    cache (DeepSeek's absorbed MQA): head n of request b attends all keys [0, seq_lens[b]) of its
    cache entries, K = the whole entry, V = its first out.shape[-1] values, softmax scaled by
    `scale`. No LSE is returned; a request of length 0 gets zeros.

    out: [B, N, L] (written, query's dtype); query: [B, N, L + R]; kv_cache: [num_blocks,
    block_size, L + R] of query's dtype (bf16 / f16 / f32); block_tables: int32 [B, max_blocks];
    seq_lens: int32 [B]. R is DeepSeek's 64 rope dims, so L = query.shape[-1] - 64 (512 for 576):
    an out of another width is an error, not values cut short. mlakit.mla_decode over
    [B, 1, N, ..] views (kv_cache_dtype "auto")."""
    op = "mla_decode_kvcache_cpu"
    require_ndim(op, "out", out, 3, "[B, N, kv_lora_rank]")
    require_ndim(op, "query", query, 3, "[B, N, kv_lora_rank + rope_dim]")
    require_ndim(op, "kv_cache", kv_cache, 3, "[num_blocks, block_size, kv_lora_rank + rope_dim]")
    require_ndim(op, "block_tables", block_tables, 2, "[B, max_blocks]")
    require_ndim(op, "seq_lens", seq_lens, 1, "[B]")
    require_dtype(op, "query", query, (torch.bfloat16, torch.float16, torch.float32))
    for name, t in (("out", out), ("kv_cache", kv_cache)):  # vLLM's kernel: one dtype for all
        if t.dtype != query.dtype:
            fail(op, f"{name} must have query's dtype {str(query.dtype).removeprefix('torch.')}, "
                     f"got {str(t.dtype).removeprefix('torch.')}", TypeError)
    require_dtype(op, "block_tables", block_tables, (torch.int32,))
    require_dtype(op, "seq_lens", seq_lens, (torch.int32,))
    for name, t in (("out", out), ("block_tables", block_tables), ("seq_lens", seq_lens)):
        if t.shape[0] != query.shape[0]:
            fail(op, f"{name} has {t.shape[0]} requests, query {query.shape[0]}")
    if out.shape[1] != query.shape[1]:
        fail(op, f"out has {out.shape[1]} heads, query {query.shape[1]}")
    lse = torch.empty(query.shape[:2], dtype=torch.float32, device=query.device).unsqueeze(1)
    _ops.mla_decode(query.unsqueeze(1), kv_cache, block_tables, seq_lens, out.unsqueeze(1), lse,
                    float(scale), "auto", kv_lora_rank=query.shape[-1] - ROPE_DIM)



def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse,
                      output_lse=None, prefill_tokens_with_context=None, output_scale=None):
    """vLLM's ``merge_attn_states``: token t < P = prefill_tokens_with_context (None: all T
    tokens) merges the prefix and suffix results by their LSEs,
    ``lse = log(e^p + e^s)``, ``out = e^(p - lse) prefix + e^(s - lse) suffix``; a +inf LSE
    (FlashAttention's empty-key convention) counts as -inf; both empty gives out 0, lse -inf.
    Tokens t >= P copy the suffix (output and LSE). With output_scale, output is float8_e4m3fn
    and receives e4m3(clamp(merged * (1 / output_scale), -448, 448)), merged in f32.

    output, prefix_output, suffix_output: [T, H, D] (output written; it may be the same view as
    an input); prefix_lse, suffix_lse: float32 [H, T]; output_lse: float32 [H, T] (written) or
    None; prefill_tokens_with_context: int in [0, T] or None (a tensor is read on the host);
    output_scale: one-element tensor or float (a CUDA tensor, float32, is read by the kernel;
    others on the host) or None."""
    op = "vllm.merge_attn_states"
    require_ndim(op, "output", output, 3, "[num_tokens, num_heads, head_size]")
    _check_merge_shapes(op, output, prefix_output, prefix_lse, suffix_output, suffix_lse,
                        output_lse)
    tokens = output.shape[0]
    merged = tokens if prefill_tokens_with_context is None else int(prefill_tokens_with_context)
    if not 0 <= merged <= tokens:
        fail(op, f"prefill_tokens_with_context must be in [0, {tokens}] (num_tokens), got {merged}")
    if output_scale is None:
        if output.dtype == FP8_DTYPE:
            fail(op, "an fp8 output needs output_scale")
        _merge_then_copy(output, prefix_output, prefix_lse, suffix_output, suffix_lse,
                         output_lse, merged)
        return
    require_dtype(op, "output (with output_scale)", output, (FP8_DTYPE,))
    scale = scale_arg(output_scale, op, "output_scale")
    staged = torch.empty(output.shape, dtype=torch.float32, device=output.device)
    _merge_then_copy(staged, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
                     merged)
    _ops.static_scaled_fp8_quant(output, staged, scale)


def _check_merge_shapes(op, output, prefix_output, prefix_lse, suffix_output, suffix_lse,
                        output_lse):
    """The shapes the library would check, checked here too because a zero-token merge (all
    tokens copied) never reaches it."""
    tokens, heads = output.shape[0], output.shape[1]
    for name, state in (("prefix_output", prefix_output), ("suffix_output", suffix_output)):
        if tuple(state.shape) != tuple(output.shape):
            fail(op, f"{name} must have output's shape {tuple(output.shape)}, got "
                     f"{tuple(state.shape)}")
    for name, lse in (("prefix_lse", prefix_lse), ("suffix_lse", suffix_lse),
                      ("output_lse", output_lse)):
        if lse is None:
            continue
        require_dtype(op, name, lse, (torch.float32,))
        if tuple(lse.shape) != (heads, tokens):
            fail(op, f"{name} must be [num_heads, num_tokens] = {[heads, tokens]}, got "
                     f"{list(lse.shape)}")


def _merge_then_copy(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
                     merged):
    """The first `merged` tokens through mlakit's merge, the others copied from the suffix."""
    tokens = output.shape[0]
    if merged == tokens:  # whole tensors: an in-place call keeps identical views
        _ops.merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse,
                               output_lse)
        return
    if merged > 0:
        _ops.merge_attn_states(output[:merged], prefix_output[:merged], prefix_lse[:, :merged],
                               suffix_output[:merged], suffix_lse[:, :merged],
                               None if output_lse is None else output_lse[:, :merged])
    output[merged:].copy_(suffix_output[merged:])
    if output_lse is not None:
        output_lse[:, merged:].copy_(suffix_lse[:, merged:])


def scaled_fp8_quant(input, scale=None, num_token_padding=None, scale_ub=None,
                     use_per_token_if_dynamic=False, output=None):
    """vLLM's ``scaled_fp8_quant``: quantizes a 2-D input to float8_e4m3fn; returns
    (output, scale).

    - static (``scale`` given, one element): out = e4m3(clamp(input * (1 / scale), -448, 448))
      in f32; the scale returned is the one passed in.
    - dynamic per-tensor (no scale): scale = amax(|input|) / 448 in f32, a float32 tensor of
      shape [1] on input's device, then the static quantization with it. An all-zero input gives
      scale 0 and out 0. Input holding inf or NaN: CPU raises; CUDA writes NaN codes and
      mlakit.check_device_errors reports it.
    - dynamic per-token (no scale, use_per_token_if_dynamic): row t's scale is
      max(min(amax_t, scale_ub) / 448, 1 / (448 * 512)) (float32 [rows, 1]), out row t =
      e4m3(clamp(input[t] / scale_t, -448, 448)) in f32.

    num_token_padding: the output (and a per-token scale) gets max(num_token_padding, T) rows;
    rows past T are left unwritten. output: a float8_e4m3fn [T, H] tensor to write (not together
    with num_token_padding). A CUDA input with a float32 CUDA scale (static) or no scale
    (dynamic) runs without any host read; scale_ub may be a CUDA tensor. CPU tensors: scales
    are read on the host."""
    op = "vllm.scaled_fp8_quant"
    require_ndim(op, "input", input, 2, "[num_tokens, hidden_size]")
    tokens, hidden = input.shape
    rows = max(int(num_token_padding), tokens) if num_token_padding else tokens
    if output is None:
        output = torch.empty((rows, hidden), dtype=FP8_DTYPE, device=input.device)
    else:
        if num_token_padding:
            fail(op, "num_token_padding cannot be used together with output")
        require_dtype(op, "output", output, (FP8_DTYPE,))
        if tuple(output.shape) != (tokens, hidden):
            fail(op, f"output must have input's shape {(tokens, hidden)}, got "
                     f"{tuple(output.shape)}")
    target = output[:tokens]
    if scale is not None:
        _ops.static_scaled_fp8_quant(target, input, scale_arg(scale, op, "scale"))
        return output, scale
    if use_per_token_if_dynamic:
        return output, _quant_per_token(input, target, rows, scale_ub)
    return output, _quant_per_tensor(input, target)


def _quant_per_tensor(input, target):
    """Dynamic per-tensor quantization of input into target; returns the float32 [1] scale. On
    CUDA both the scale and the codes are computed on the device (mlakit's
    dynamic_scaled_fp8_quant); on the CPU the scale is read on the host."""
    if input.device.type == "cuda":
        scale = torch.empty(1, dtype=torch.float32, device=input.device)
        _ops.dynamic_scaled_fp8_quant(target, input, scale)
        return scale
    if input.numel() == 0:
        return torch.zeros(1, dtype=torch.float32, device=input.device)
    amax = input.detach().abs().amax().to(torch.float32)
    scale = (amax / FP8_E4M3_MAX).reshape(1)  # f32 division, like vLLM's kernel
    value = float(scale.item())  # a host read: CPU tensors only
    if value == 0.0:  # all-zero input: every code is 0, a zero scale cannot be inverted
        target.zero_()
    else:
        _ops.static_scaled_fp8_quant(target, input, value)
    return scale


def _quant_per_token(input, target, rows, scale_ub):
    """Dynamic per-token quantization of input into target; returns the float32 [rows, 1]
    scales (rows past input's are left unwritten)."""
    values = input.detach().to(torch.float32)
    amax = values.abs().amax(dim=1, keepdim=True)
    if scale_ub is not None:
        ub = torch.as_tensor(scale_ub, dtype=torch.float32, device=input.device).reshape(1, 1)
        amax = torch.minimum(amax, ub)
    row_scales = torch.clamp(amax / FP8_E4M3_MAX, min=PER_TOKEN_MIN_SCALE)
    scales = torch.empty((rows, 1), dtype=torch.float32, device=input.device)
    scales[:input.shape[0]] = row_scales
    if input.numel():
        # The row division in f32 here, then mlakit's e4m3 rounding with scale 1 (x * 1 is exact).
        _ops.static_scaled_fp8_quant(target, values / row_scales, 1.0)
    return scales


__all__ = [
    "concat_and_cache_mla",
    "cp_gather_and_upconvert_fp8_kv_cache",
    "cp_gather_cache",
    "gather_and_maybe_dequant_cache",
    "merge_attn_states",
    "scaled_fp8_quant",
]
