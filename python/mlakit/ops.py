"""The primitive MLA ops, with vLLM's op names and argument orders. Every tensor argument is a
NumPy array (host) or a torch tensor (host or CUDA), used in place without copies; outputs are
written into the tensors passed in. All tensors of one call live on one device. CUDA calls run
on torch's current stream of that device.

Shapes use N heads, L = kv_lora_rank, R = qk_rope_head_dim, P = qk_nope_head_dim,
V = v_head_dim. LSEs are float32, natural log.
"""

import ctypes
import weakref

import numpy as np

from ._args import to_bool, to_int, to_int32
from ._dlpack import KDL_CPU, KDL_CUDA, describe, describe_optional, dl_device, is_torch_tensor
from ._library import DecodePlanShapeC, call, lib

_KV_CACHE_DTYPES = {}  # name -> code, filled by kv_cache_dtype_code


def kv_cache_dtype_code(kv_cache_dtype):
    """The mlakit_kv_cache_dtype_t of vLLM's cache dtype names ('auto', 'fp8', 'fp8_e4m3',
    'fp8_ds_mla', 'bfloat16', 'float16'); ints pass through."""
    if isinstance(kv_cache_dtype, (bool, int)):  # a bool is an int to Python: to_int32 refuses it
        return to_int32(kv_cache_dtype, "kv_cache_dtype")
    code = _KV_CACHE_DTYPES.get(kv_cache_dtype)
    if code is None:
        out = ctypes.c_int32()
        call("mlakit_parse_kv_cache_dtype", str(kv_cache_dtype).encode(), ctypes.byref(out))
        code = _KV_CACHE_DTYPES[kv_cache_dtype] = out.value
    return code


def to_float(value, name):
    """A scale given as a Python number or a one-element array/tensor (reading a CUDA tensor
    synchronises; pass a float where the call must be capturable in a CUDA graph)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"mlakit: {name} must be a number or a one-element tensor, got a bool")
    if isinstance(value, (int, float, np.floating, np.integer)):
        return float(value)
    if is_torch_tensor(value) or isinstance(value, np.ndarray):
        count = value.size if isinstance(value, np.ndarray) else value.numel()
        if count != 1:
            raise ValueError(
                f"mlakit: {name} must have exactly one element, got shape {tuple(value.shape)}"
            )
        return float(value.reshape(-1)[0].item())
    raise TypeError(
        f"mlakit: {name} must be a number or a one-element tensor, got {type(value).__name__}"
    )


def tensor_scale(value, name, writable=False):
    """The description of a scale the op reads where it runs (mlakit.h "tensor_scale" entries):
    a float32 array or tensor, or any tensor on a CUDA device (never read on the host; the
    library reports a wrong dtype or element count). None for a number or a host array/tensor of
    another dtype, which the float entry takes through to_float."""
    if is_torch_tensor(value):
        import torch

        if value.device.type == "cuda" or value.dtype == torch.float32:
            return describe(value, name, writable)
    elif isinstance(value, np.ndarray) and value.dtype == np.float32:
        return describe(value, name, writable)
    return None


def stream_of(*described):
    """The CUDA stream of the first CUDA tensor among `described` (NULL for host calls)."""
    for d in described:
        if d is not None and d.stream is not None:
            return ctypes.c_void_p(d.stream)
    return None


def _ref(d):
    return None if d is None else d.ref


# ---- Cache ops ----------------------------------------------------------------------------------


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype="auto", scale=1.0):
    """Writes token t's [kv_c[t] | k_pe[t]] into slot slot_mapping[t] of the paged cache
    (slot < 0 skips the token; fp8 caches store e4m3(x / scale)).

    kv_c: [T', L]; k_pe: [T', R] (or [T', 1, R]); kv_cache: [num_blocks, block_size, entry_width]
    (written); slot_mapping: int64 [T], T <= T'; scale: a number, or a one-element float32
    array/tensor on kv_c's device, read where the op runs (on CUDA by the kernel: capturable in a
    CUDA graph; a value that is not finite and > 0 writes NaN codes and is reported by
    check_device_errors)."""
    # vLLM passes k_pe unsqueezed: [T', 1, R]. (getattr: a list gets describe's TypeError.)
    if getattr(k_pe, "ndim", None) == 3 and k_pe.shape[1] == 1:
        k_pe = k_pe[:, 0]
    a = describe(kv_c, "kv_c")
    b = describe(k_pe, "k_pe")
    c = describe(kv_cache, "kv_cache", writable=True)
    d = describe(slot_mapping, "slot_mapping")
    code = kv_cache_dtype_code(kv_cache_dtype)
    sc = tensor_scale(scale, "scale")
    if sc is not None:
        call("mlakit_concat_and_cache_mla_tensor_scale", a.ref, b.ref, c.ref, d.ref, code, sc.ref,
             stream_of(a, b, c, d, sc))
        return
    call("mlakit_concat_and_cache_mla", a.ref, b.ref, c.ref, d.ref, code,
         to_float(scale, "scale"), stream_of(a, b, c, d))


def gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq,
                                   num_tokens, kv_cache_dtype="auto", scale=1.0, seq_starts=None):
    """Row t < num_tokens of dst = entry of request b = token_to_seq[t] at position
    t - cu_seq_lens[b] + seq_starts[b], dequantized (fp8: value * scale) to dst's dtype.

    src_cache: [num_blocks, block_size, entry_width]; dst: [>= num_tokens, L + R] (written);
    block_table: int32 [B, max_blocks]; cu_seq_lens: int32 [B + 1]; token_to_seq: int32
    [>= num_tokens]; seq_starts: int32 [B] or None; scale: a number or a one-element float32
    array/tensor on dst's device, read where the op runs (as concat_and_cache_mla's; a bad value
    on CUDA gives NaN rows)."""
    s = describe(src_cache, "src_cache")
    d = describe(dst, "dst", writable=True)
    bt = describe(block_table, "block_table")
    cu = describe(cu_seq_lens, "cu_seq_lens")
    tts = describe(token_to_seq, "token_to_seq")
    ss = describe_optional(seq_starts, "seq_starts")
    code = kv_cache_dtype_code(kv_cache_dtype)
    sc = tensor_scale(scale, "scale")
    if sc is not None:
        call("mlakit_gather_and_maybe_dequant_cache_tensor_scale", s.ref, d.ref, bt.ref, cu.ref,
             tts.ref, to_int(num_tokens, "num_tokens"), code, sc.ref, _ref(ss),
             stream_of(s, d, bt, cu, tts, ss, sc))
        return
    call("mlakit_gather_and_maybe_dequant_cache", s.ref, d.ref, bt.ref, cu.ref, tts.ref,
         to_int(num_tokens, "num_tokens"), code, to_float(scale, "scale"), _ref(ss),
         stream_of(s, d, bt, cu, tts, ss))


def cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None):
    """Raw copy of request b's cache entries at positions [seq_starts[b], + len_b) into dst rows
    [cu_seq_lens[b], cu_seq_lens[b + 1]).

    src_cache: [num_blocks, block_size, W]; dst: [rows, W] of the same dtype (written);
    block_table: int32 [>= batch_size, max_blocks]; cu_seq_lens: int32 [batch_size + 1];
    seq_starts: int32 [batch_size] or None."""
    s = describe(src_cache, "src_cache")
    d = describe(dst, "dst", writable=True)
    bt = describe(block_table, "block_table")
    cu = describe(cu_seq_lens, "cu_seq_lens")
    ss = describe_optional(seq_starts, "seq_starts")
    call("mlakit_cp_gather_cache", s.ref, d.ref, bt.ref, cu.ref, to_int(batch_size, "batch_size"),
         _ref(ss), stream_of(s, d, bt, cu, ss))


# ---- Attention pieces ---------------------------------------------------------------------------


def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse,
                      output_lse=None):
    """Merges two partial attention results by their LSEs (both -inf: output 0, lse -inf).

    output, prefix_output, suffix_output: [T, H, D] (output written; may alias an input);
    prefix_lse, suffix_lse: float32 [H, T]; output_lse: float32 [H, T] (written) or None."""
    o = describe(output, "output", writable=True)
    p = describe(prefix_output, "prefix_output")
    pl = describe(prefix_lse, "prefix_lse")
    s = describe(suffix_output, "suffix_output")
    sl = describe(suffix_lse, "suffix_lse")
    ol = describe_optional(output_lse, "output_lse", writable=True)
    call("mlakit_merge_attn_states", o.ref, p.ref, pl.ref, s.ref, sl.ref, _ref(ol),
         stream_of(o, p, pl, s, sl, ol))


def dcp_lse_combine(partial_out, partial_lse_tokens_heads, out, out_lse_tokens_heads=None):
    """Decode context parallelism: combines W ranks' partial attention results over disjoint key
    sets by their LSEs (vLLM's cp_lse_ag_out_rs math, no communicator; docs/dcp.md):
    lse = ln sum_k exp(lse_k), out = sum_k exp(lse_k - lse) out_k. A rank whose LSE is -inf,
    NaN or +inf weighs 0 and its partial is not read; all ranks empty gives out 0, lse -inf.

    partial_out: [W, T, H, D] float32/float16/bfloat16; partial_lse_tokens_heads: float32
    [W, T, H]; out: [T, H, D] (written); out_lse_tokens_heads: float32 [T, H] (written) or None."""
    p = describe(partial_out, "partial_out")
    pl = describe(partial_lse_tokens_heads, "partial_lse_tokens_heads")
    o = describe(out, "out", writable=True)
    ol = describe_optional(out_lse_tokens_heads, "out_lse_tokens_heads", writable=True)
    call("mlakit_dcp_lse_combine", p.ref, pl.ref, o.ref, _ref(ol), stream_of(p, pl, o, ol))


def dcp_lse_correct(partial_out, all_lse_tokens_heads, rank, corrected):
    """One rank's half of dcp_lse_combine, before a reduce-scatter (sum) over the ranks:
    corrected[t, k, n] = exp(all_lse[rank, t, h] - lse[t, h]) * partial_out[t, h] with
    h = k * (H / W) + n (heads grouped by the rank that keeps them), 0 where the weight is 0.

    partial_out: [T, H, D]; all_lse_tokens_heads: float32 [W, T, H] (every rank's LSEs);
    corrected: [T, W, H / W, D] (written)."""
    p = describe(partial_out, "partial_out")
    al = describe(all_lse_tokens_heads, "all_lse_tokens_heads")
    c = describe(corrected, "corrected", writable=True)
    call("mlakit_dcp_lse_correct", p.ref, al.ref, to_int(rank, "rank"), c.ref, stream_of(p, al, c))


def static_scaled_fp8_quant(out, input, scale):
    """out = e4m3(clamp(input * (1 / scale), -448, 448)) (vLLM's _C.static_scaled_fp8_quant).
    out: float8_e4m3fn or uint8, the shape of input (written); scale: a number or a one-element
    float32 array/tensor on input's device, read where the op runs (on CUDA by the kernel:
    capturable; a value that is not finite and > 0 with a finite reciprocal writes NaN codes and
    is reported by check_device_errors)."""
    x = describe(input, "input")
    o = describe(out, "out", writable=True)
    sc = tensor_scale(scale, "scale")
    if sc is not None:
        call("mlakit_scaled_fp8_quant_tensor_scale", x.ref, o.ref, sc.ref, stream_of(x, o, sc))
        return
    call("mlakit_scaled_fp8_quant", x.ref, o.ref, to_float(scale, "scale"), stream_of(x, o))


def dynamic_scaled_fp8_quant(out, input, scale):
    """Dynamic per-tensor fp8 quantization (vLLM's _C.dynamic_scaled_fp8_quant): scale[0] =
    amax(|input|) / 448 in float32, then out = e4m3(clamp(input * (1 / scale), -448, 448)). An
    all-zero or empty input gives scale 0 and out 0. On CUDA everything runs on the device (no
    host read, no synchronisation: capturable). Input holding inf or NaN: the CPU raises after
    writing scale; CUDA writes NaN codes and check_device_errors reports it.

    out: float8_e4m3fn or uint8, the shape of input (written); scale: one-element float32
    array/tensor on input's device, not overlapping input or out (written)."""
    x = describe(input, "input")
    o = describe(out, "out", writable=True)
    sc = describe(scale, "scale", writable=True)
    call("mlakit_dynamic_scaled_fp8_quant", x.ref, o.ref, sc.ref, stream_of(x, o, sc))


def scaled_fp8_quant(input, scale, output=None):
    """Static per-tensor fp8 quantization of `input` with `scale`; returns the fp8 tensor
    (`output` if given, else a new float8_e4m3fn array/tensor on input's device)."""
    describe(input, "input")  # a TypeError naming input for a list or None, before its shape
    if output is None:
        if is_torch_tensor(input):
            import torch

            output = torch.empty(input.shape, dtype=torch.float8_e4m3fn, device=input.device)
        else:
            import ml_dtypes

            output = np.empty(input.shape, dtype=ml_dtypes.float8_e4m3fn)
    static_scaled_fp8_quant(output, input, scale)
    return output


class DecodeSchedule:
    """The split-KV schedule of a decode call (plan once per batch, reuse for every layer).

    plan_mla_decode gives the schedule the library chooses for a device. This constructor is the
    CPU planner with an explicit worker count: seq_lens: host int32 [B]; num_workers: parallel
    workers to spread the splits over. total_splits: partial results (for a CUDA schedule the most
    the device plan can produce); max_splits: the most pieces of one request."""

    def __init__(self, seq_lens, block_size, num_workers=1):
        from .planning import host_int32

        lens = host_int32(seq_lens, "seq_lens")
        handle = ctypes.c_void_p()
        call("mlakit_plan_decode_splits", lens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
             lens.size, to_int(block_size, "block_size"),
             to_int(num_workers, "num_workers"), ctypes.byref(handle))
        self._adopt(handle)

    @classmethod
    def _from_handle(cls, handle):
        schedule = cls.__new__(cls)
        schedule._adopt(handle)
        return schedule

    def _adopt(self, handle):
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.mlakit_decode_schedule_destroy, handle)
        total, most = ctypes.c_int64(), ctypes.c_int64()
        call("mlakit_decode_schedule_info", handle, ctypes.byref(total), ctypes.byref(most))
        self.total_splits = total.value
        self.max_splits = most.value

    def workspace_elems(self, s_q, num_heads, kv_lora_rank):
        """float32 elements of the split workspace mla_decode needs with this schedule."""
        elems = ctypes.c_int64()
        call("mlakit_decode_workspace_elems", self._handle, to_int(s_q, "s_q"),
             to_int(num_heads, "num_heads"), to_int(kv_lora_rank, "kv_lora_rank"),
             ctypes.byref(elems))
        return elems.value


def plan_mla_decode(device, batch, s_q, num_heads, block_size, max_seq_len, seq_lens=None,
                    batch_invariant=False):
    """The schedule the library chooses for one mla_decode call on `device` ('cpu', 'cuda',
    'cuda:<index>' or a torch.device). The CPU plans from seq_lens (host int32 [batch], required;
    one above max_seq_len raises ValueError).
    A CUDA schedule depends on the shape only (seq_lens is ignored): the GPU cuts the keys into
    near-equal shares at run time, so the schedule and its workspace serve any lengths up to
    max_seq_len (e.g. block_table width * block_size) and can be captured in a CUDA graph.
    batch_invariant: each request is cut by its own length only, so its output bits do not depend
    on the rest of the batch."""
    from .planning import host_int32

    shape = DecodePlanShapeC(dl_device(device), to_int(batch, "batch"), to_int(s_q, "s_q"),
                             to_int(num_heads, "num_heads"), to_int(block_size, "block_size"),
                             to_int(max_seq_len, "max_seq_len"),
                             1 if to_bool(batch_invariant, "batch_invariant") else 0)
    lens = None
    if seq_lens is not None and shape.device.device_type == KDL_CPU:
        lens = host_int32(seq_lens, "seq_lens")
        # The C entry reads `batch` lengths from the pointer: a shorter array was read past its end.
        if lens.size != shape.batch:
            raise ValueError(f"mlakit: plan_mla_decode: seq_lens must have batch = {shape.batch} "
                             f"entries, got {lens.size}")
    handle = ctypes.c_void_p()
    call("mlakit_plan_mla_decode", ctypes.byref(shape),
         None if lens is None else lens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
         ctypes.byref(handle))
    return DecodeSchedule._from_handle(handle)


def mla_decode(q, kv_cache, block_table, seq_lens, out, lse, scale, kv_cache_dtype="auto",
               q_scale=1.0, k_scale=1.0, schedule=None, split_workspace=None, *, kv_lora_rank):
    """Absorbed MQA decode over the paged latent cache: query j of request b attends keys
    [0, seq_lens[b] - s_q + j] with K = entry[:L+R], V = entry[:L].

    q: [B, s_q, N, L + R] (fp8 for fp8 caches: dequantized with q_scale); kv_cache: [num_blocks,
    block_size, entry_width]; block_table: int32 [B, max_blocks]; seq_lens: int32 [B], each 0
    or at least s_q (they count the new tokens too); out: [B, s_q, N, L] (written); lse: float32
    [B, s_q, N] (written); kv_lora_rank: L, keyword only (out's last dimension must equal it).

    q_scale (applies to an fp8 q) and k_scale (to an fp8_e4m3 cache): numbers, or float32
    arrays/tensors on q's device of one element or of shape [B] (one per request), read where the
    op runs (mlakit.h mlakit_mla_decode_tensor_scale): on the host they are checked at once like
    numbers; on CUDA the kernel reads them (no host read: with a schedule the call is capturable
    in a CUDA graph whose replays use the values they then hold), and a value that is not finite
    and > 0 gives NaN rows for its requests and is reported by check_device_errors.

    Without `schedule` the library plans the splits (plan_mla_decode's choice) and allocates the
    workspace (for torch CUDA tensors through torch, on the tensors' device; the call then runs on
    torch's current stream like every other op, but allocates, so keep it out of CUDA graphs).
    With a schedule from plan_mla_decode (a CPU one for the same seq_lens, a CUDA one for the
    same shape) `split_workspace` (float32, at least schedule.workspace_elems(s_q, N, L)
    elements, on the tensors' device) is required and the call allocates nothing."""
    args = [describe(q, "q"), describe(kv_cache, "kv_cache"), describe(block_table, "block_table"),
            describe(seq_lens, "seq_lens"), describe(out, "out", writable=True),
            describe(lse, "lse", writable=True)]
    refs = [a.ref for a in args]
    scales = _decode_scale_tensors(q, q_scale, k_scale)
    entry = "mlakit_mla_decode" if scales is None else "mlakit_mla_decode_tensor_scale"
    if scales is None:
        scales = (to_float(q_scale, "q_scale"), to_float(k_scale, "k_scale"))
    else:
        args += [d for d in scales if d is not None]
        scales = tuple(_ref(d) for d in scales)
    scalars = (to_int(kv_lora_rank, "kv_lora_rank"), to_float(scale, "scale"),
               kv_cache_dtype_code(kv_cache_dtype), *scales)
    if schedule is None:
        if split_workspace is not None:
            raise ValueError(
                "mlakit: mla_decode: split_workspace is used only together with schedule"
            )
        if not _plannable_on_cuda(args, q, kv_cache, block_table, out):
            call(entry, *refs, *scalars)
            return
        import torch

        batch, s_q, heads = q.shape[:3]
        # seq_lens are int32: no length exceeds 2^31 - 1, however wide the block table.
        max_seq_len = min(block_table.shape[1] * kv_cache.shape[1], 2**31 - 1)
        schedule = plan_mla_decode(q.device, batch, s_q, heads, kv_cache.shape[1], max_seq_len)
        # Sized for out's width: mla_decode itself reports an out that disagrees with kv_lora_rank.
        split_workspace = torch.empty(max(1, schedule.workspace_elems(s_q, heads, out.shape[3])),
                                      dtype=torch.float32, device=q.device)
    if not isinstance(schedule, DecodeSchedule):
        raise TypeError("mlakit: mla_decode: schedule must be a DecodeSchedule (plan_mla_decode), "
                        f"got {type(schedule).__name__}")
    if split_workspace is None:
        raise ValueError(
            "mlakit: mla_decode: a schedule needs its split_workspace "
            "(float32, schedule.workspace_elems(s_q, num_heads, kv_lora_rank) elements)"
        )
    ws = describe(split_workspace, "split_workspace", writable=True)
    entry = entry.replace("mlakit_mla_decode", "mlakit_mla_decode_scheduled", 1)
    call(entry, *refs, *scalars, schedule._handle, ws.ref, stream_of(*args, ws))


def _decode_scale_tensors(q, q_scale, k_scale):
    """mla_decode's (q_scale, k_scale) as descriptions for the tensor entries (None: 1), or None
    when neither is a scale the op reads where it runs (tensor_scale). A number beside a tensor
    becomes a one-element float32 array/tensor on q's device."""
    described = [tensor_scale(q_scale, "q_scale"), tensor_scale(k_scale, "k_scale")]
    if described == [None, None]:
        return None
    for i, (value, name) in enumerate(((q_scale, "q_scale"), (k_scale, "k_scale"))):
        if described[i] is None and to_float(value, name) != 1.0:
            described[i] = describe(_scale_like(q, to_float(value, name)), name)
    return tuple(described)


def _scale_like(q, value):
    """A one-element float32 array (host q) or tensor (torch q, on q's device) holding value."""
    if is_torch_tensor(q):
        import torch

        return torch.full((1,), value, dtype=torch.float32, device=q.device)
    return np.full((1,), value, dtype=np.float32)


def _plannable_on_cuda(args, q, kv_cache, block_table, out):
    """torch CUDA tensors of the ranks mla_decode takes (others go to the C convenience call,
    which reports what is wrong with them)."""
    return (args[0].device[0] == KDL_CUDA and q.ndim == 4 and kv_cache.ndim == 3
            and block_table.ndim == 2 and out.ndim == 4)


def mla_prefill(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                scale, causal, out, lse=None):
    """Varlen MHA prefill (d_qk = P + R, d_v = V). Request b has queries [cu_seqlens_q[b],
    cu_seqlens_q[b+1]) and keys [cu_seqlens_k[b], cu_seqlens_k[b+1]); causal is bottom-right.

    q: [T, N, P + R]; k_nope: [S, N, P]; k_pe: [S, R] (shared by the heads); v: [S, N, V];
    cu_seqlens_q, cu_seqlens_k: int32 [B + 1]; out: [T, N, V] (written); lse: float32 [N, T]
    (written) or None."""
    args = [describe(q, "q"), describe(k_nope, "k_nope"), describe(k_pe, "k_pe"),
            describe(v, "v"), describe(cu_seqlens_q, "cu_seqlens_q"),
            describe(cu_seqlens_k, "cu_seqlens_k")]
    o = describe(out, "out", writable=True)
    ls = describe_optional(lse, "lse", writable=True)
    call("mlakit_mla_prefill", *[a.ref for a in args], to_int(max_seqlen_q, "max_seqlen_q"),
         to_int(max_seqlen_k, "max_seqlen_k"), to_float(scale, "scale"),
         1 if to_bool(causal, "causal") else 0, o.ref, _ref(ls), stream_of(*args, o, ls))


__all__ = [
    "DecodeSchedule",
    "concat_and_cache_mla",
    "cp_gather_cache",
    "dynamic_scaled_fp8_quant",
    "gather_and_maybe_dequant_cache",
    "kv_cache_dtype_code",
    "merge_attn_states",
    "mla_decode",
    "mla_prefill",
    "plan_mla_decode",
    "scaled_fp8_quant",
    "static_scaled_fp8_quant",
]


def check_device_errors(device="cpu"):
    """Raises MlakitError (status out_of_range) when a GPU op on `device` met a bad index (a
    slot, block-table entry, request id or cu_seqlens value) since the last check, and clears
    that record. GPU kernels skip a bad index instead of synchronising to report it (nothing out
    of bounds is read or written); call this where a synchronisation is fine, e.g. after a step
    or a CUDA-graph replay. Waits for torch's current stream of the device. `device`: 'cpu'
    (nothing to check), 'cuda', 'cuda:N', an int N or a torch.device."""
    kind, _, index = str(device).partition(":")
    if isinstance(device, int):
        kind, index = "cuda", str(device)
    if kind == "cpu":
        call("mlakit_check_device_errors", KDL_CPU, 0, None)
        return
    if kind != "cuda":
        raise ValueError(f"mlakit: device must be 'cpu', 'cuda', 'cuda:N' or an int, got {device!r}")
    stream = None
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        ordinal = int(index) if index else torch.cuda.current_device()
        stream = ctypes.c_void_p(torch.cuda.current_stream(ordinal).cuda_stream)
    else:
        ordinal = int(index) if index else 0
    call("mlakit_check_device_errors", KDL_CUDA, ordinal, stream)
