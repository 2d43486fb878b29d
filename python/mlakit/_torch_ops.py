"""torch.ops.mlakit.*: the mlakit ops as PyTorch custom ops (imported by mlakit/__init__.py when
torch is installed).

Each op is a torch.library.custom_op that names the tensors it writes in `mutates_args` and has
a fake (meta) implementation, so the ops trace under torch.compile (fullgraph) and replay inside
CUDA graphs: the real implementation only hands data pointers and torch's current stream to the
library, with no host synchronisation and no allocation. Scales are Python floats, or, in the
*_tensor_scale ops and dynamic_scaled_fp8_quant, one-element float32 tensors on the data's device
that the kernels read where they run (so a captured graph follows the value written into them;
mla_decode_tensor_scale's q_scale / k_scale may also hold one value per request; the attention
ops still take floats).

The annotations below are real types (no `from __future__ import annotations`): torch infers
the op schemas from them. Defaults are only int, float, bool or None (what torch 2.4's schema
inference accepts), so string arguments such as kv_cache_dtype have none.
"""

from typing import Optional

import torch

from . import ops as _ops
from .attention import layer_by_id
from .step import ForwardBatch, workspace_by_id

if not hasattr(torch.library, "custom_op"):
    raise ImportError(f"torch {torch.__version__} lacks torch.library.custom_op (needs >= 2.4)")

_NS = "mlakit"


@torch.library.custom_op(f"{_NS}::concat_and_cache_mla", mutates_args=("kv_cache",))
def concat_and_cache_mla(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    scale: float,
) -> None:
    _ops.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)


@concat_and_cache_mla.register_fake
def _(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    return None


@torch.library.custom_op(f"{_NS}::gather_and_maybe_dequant_cache", mutates_args=("dst",))
def gather_and_maybe_dequant_cache(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor,
    num_tokens: int,
    kv_cache_dtype: str,
    scale: float,
    seq_starts: Optional[torch.Tensor] = None,
) -> None:
    _ops.gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq,
                                        num_tokens, kv_cache_dtype, scale, seq_starts)


@gather_and_maybe_dequant_cache.register_fake
def _(src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens, kv_cache_dtype, scale,
      seq_starts=None):
    return None


@torch.library.custom_op(f"{_NS}::cp_gather_cache", mutates_args=("dst",))
def cp_gather_cache(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    batch_size: int,
    seq_starts: Optional[torch.Tensor] = None,
) -> None:
    _ops.cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts)


@cp_gather_cache.register_fake
def _(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None):
    return None


# Optional tensors that an op writes carry no default: torch.compile's functionalization indexes
# every mutated argument of the schema, so the caller passes None explicitly.
@torch.library.custom_op(f"{_NS}::merge_attn_states", mutates_args=("output", "output_lse"))
def merge_attn_states(
    output: torch.Tensor,
    prefix_output: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix_output: torch.Tensor,
    suffix_lse: torch.Tensor,
    output_lse: Optional[torch.Tensor],
) -> None:
    _ops.merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse,
                           output_lse)


@merge_attn_states.register_fake
def _(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse):
    return None


@torch.library.custom_op(f"{_NS}::static_scaled_fp8_quant", mutates_args=("out",))
def static_scaled_fp8_quant(out: torch.Tensor, input: torch.Tensor, scale: float) -> None:
    _ops.static_scaled_fp8_quant(out, input, scale)


@static_scaled_fp8_quant.register_fake
def _(out, input, scale):
    return None


@torch.library.custom_op(f"{_NS}::concat_and_cache_mla_tensor_scale", mutates_args=("kv_cache",))
def concat_and_cache_mla_tensor_scale(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    scale: torch.Tensor,
) -> None:
    _ops.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)


@concat_and_cache_mla_tensor_scale.register_fake
def _(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    return None


@torch.library.custom_op(f"{_NS}::gather_and_maybe_dequant_cache_tensor_scale",
                         mutates_args=("dst",))
def gather_and_maybe_dequant_cache_tensor_scale(
    src_cache: torch.Tensor,
    dst: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    token_to_seq: torch.Tensor,
    num_tokens: int,
    kv_cache_dtype: str,
    scale: torch.Tensor,
    seq_starts: Optional[torch.Tensor] = None,
) -> None:
    _ops.gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq,
                                        num_tokens, kv_cache_dtype, scale, seq_starts)


@gather_and_maybe_dequant_cache_tensor_scale.register_fake
def _(src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens, kv_cache_dtype, scale,
      seq_starts=None):
    return None


@torch.library.custom_op(f"{_NS}::static_scaled_fp8_quant_tensor_scale", mutates_args=("out",))
def static_scaled_fp8_quant_tensor_scale(out: torch.Tensor, input: torch.Tensor,
                                         scale: torch.Tensor) -> None:
    _ops.static_scaled_fp8_quant(out, input, scale)


@static_scaled_fp8_quant_tensor_scale.register_fake
def _(out, input, scale):
    return None


@torch.library.custom_op(f"{_NS}::dynamic_scaled_fp8_quant", mutates_args=("out", "scale"))
def dynamic_scaled_fp8_quant(out: torch.Tensor, input: torch.Tensor, scale: torch.Tensor) -> None:
    _ops.dynamic_scaled_fp8_quant(out, input, scale)


@dynamic_scaled_fp8_quant.register_fake
def _(out, input, scale):
    return None


@torch.library.custom_op(f"{_NS}::mla_decode", mutates_args=("out", "lse"))
def mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    kv_lora_rank: int,
    scale: float,
    kv_cache_dtype: str,
    q_scale: float = 1.0,
    k_scale: float = 1.0,
) -> None:
    # The convenience form: the library plans the split-KV schedule (CPU: from the host seq_lens;
    # CUDA: from the shape) and allocates the workspace.
    _ops.mla_decode(q, kv_cache, block_table, seq_lens, out, lse, scale, kv_cache_dtype, q_scale,
                    k_scale, kv_lora_rank=kv_lora_rank)


@mla_decode.register_fake
def _(q, kv_cache, block_table, seq_lens, out, lse, kv_lora_rank, scale, kv_cache_dtype,
      q_scale=1.0, k_scale=1.0):
    return None


@torch.library.custom_op(f"{_NS}::mla_decode_tensor_scale", mutates_args=("out", "lse"))
def mla_decode_tensor_scale(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    kv_lora_rank: int,
    scale: float,
    kv_cache_dtype: str,
    q_scale: torch.Tensor,
    k_scale: torch.Tensor,
) -> None:
    # mla_decode with q_scale / k_scale as float32 tensors of 1 or B values on q's device, read
    # where the op runs (on CUDA by the kernel: no host read).
    _ops.mla_decode(q, kv_cache, block_table, seq_lens, out, lse, scale, kv_cache_dtype, q_scale,
                    k_scale, kv_lora_rank=kv_lora_rank)


@mla_decode_tensor_scale.register_fake
def _(q, kv_cache, block_table, seq_lens, out, lse, kv_lora_rank, scale, kv_cache_dtype, q_scale,
      k_scale):
    return None


@torch.library.custom_op(f"{_NS}::mla_prefill", mutates_args=("out", "lse"))
def mla_prefill(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    scale: float,
    causal: bool,
    out: torch.Tensor,
    lse: Optional[torch.Tensor],
) -> None:
    _ops.mla_prefill(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     scale, causal, out, lse)


@mla_prefill.register_fake
def _(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal,
      out, lse):
    return None


@torch.library.custom_op(f"{_NS}::mla_attention_forward", mutates_args=("kv_cache", "output"))
def mla_attention_forward(
    layer_id: int,
    q: torch.Tensor,
    kv_c_normed: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_actual_tokens: int,
    output: torch.Tensor,
    q_scale: float = 1.0,
    k_scale: float = 1.0,
) -> None:
    """MlaAttention.forward of the layer with `layer_id` (MlaAttention.layer_id).
    query_start_loc and seq_lens are CPU int32 tensors (planning reads them on the host)."""
    batch = ForwardBatch(query_start_loc, seq_lens, block_table, slot_mapping, num_actual_tokens)
    layer_by_id(layer_id).forward(q, kv_c_normed, k_pe, kv_cache, batch, output, q_scale, k_scale)


@mla_attention_forward.register_fake
def _(layer_id, q, kv_c_normed, k_pe, kv_cache, query_start_loc, seq_lens, block_table,
      slot_mapping, num_actual_tokens, output, q_scale=1.0, k_scale=1.0):
    return None


# The engine form (plan once per step, run per layer). Custom ops take tensors and scalars, not
# Python objects or C handles, so the layer and the workspace travel as the ids of live objects
# (MlaAttention.layer_id, Workspace.workspace_id). The step is not an argument: the op runs the
# workspace's current plan, the one from the latest mlakit.plan_step on it (the only valid one).
# Both ids stay the same from step to step, so a torch.compile'd model is not recompiled (nor
# guarded) per step; a CUDA graph captured once replays after each new plan_step whose plan has
# the same launches (StepPlan.same_launches).
@torch.library.custom_op(f"{_NS}::mla_attention_forward_step",
                         mutates_args=("kv_cache", "output"))
def mla_attention_forward_step(
    layer_id: int,
    workspace_id: int,
    q: torch.Tensor,
    kv_c_normed: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    output: torch.Tensor,
    q_scale: float = 1.0,
    k_scale: float = 1.0,
) -> None:
    """MlaAttention.forward of the layer `layer_id` against workspace `workspace_id`'s current
    StepPlan: launches only (no planning, no upload, no synchronisation), on torch's current
    stream."""
    workspace = workspace_by_id(workspace_id)
    step = workspace.current_plan
    if step is None:
        raise ValueError(
            f"mlakit: mla_attention_forward_step: workspace_id {workspace_id} has no StepPlan yet; "
            "call mlakit.plan_step(config, batch, workspace) before the layers run"
        )
    layer_by_id(layer_id).forward(q, kv_c_normed, k_pe, kv_cache, step, output, q_scale, k_scale)


@mla_attention_forward_step.register_fake
def _(layer_id, workspace_id, q, kv_c_normed, k_pe, kv_cache, output, q_scale=1.0, k_scale=1.0):
    return None
