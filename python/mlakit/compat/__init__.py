"""Drop-in compat layer: other projects' exact Python contracts over mlakit's ops (torch tensors).

- ``mlakit.compat.vllm``: the MLA ops of ``vllm._custom_ops`` (names, argument orders,
  semantics): ``concat_and_cache_mla``, ``gather_and_maybe_dequant_cache``, ``cp_gather_cache``,
  ``cp_gather_and_upconvert_fp8_kv_cache``, ``merge_attn_states``, ``scaled_fp8_quant``.
- ``mlakit.compat.flash_mla``: FlashMLA's dense decode, ``get_mla_metadata`` and
  ``flash_mla_with_kvcache``.

Both submodules import torch; this package itself imports nothing, so ``import mlakit.compat``
works without torch. Status and the contract points not met: docs/python.md, "Drop-in compat
layer (mlakit.compat)".
"""

__all__ = ["flash_mla", "vllm"]
