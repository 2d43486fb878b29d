"""The bad-input table of tests/errors/cases/*.json through the Python API: every malformed call
raises an MlakitError with the table's status whose message contains the table's parts (the C++
API and the C ABI run the same table in tests/errors/)."""

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import mlakit

CASES = Path(__file__).resolve().parents[2] / "tests" / "errors" / "cases"
DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
          "fp8_e4m3": ml_dtypes.float8_e4m3fn, "u8": np.uint8, "i32": np.int32, "i64": np.int64}
ACT_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16",
              "fp8_e4m3": "float8_e4m3fn"}


def _number(v):
    return float(v) if not isinstance(v, str) else {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[v]


def _merge(base, patch):
    """The tensor spec `base` with the fields of `patch` (a new shape drops the strides)."""
    spec = dict(base)
    if "shape" in patch:
        spec.pop("strides", None)
    spec.update(patch)
    return spec


def _dense_strides(shape):
    strides, step = [], 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= max(size, 1)
    return strides


def _extent(shape, strides):
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(shape, strides))


class Call:
    """The arrays and scalars of one call, built from the table (aliases share memory)."""

    def __init__(self, tensors, scalars):
        self.scalars = scalars
        self.buffers, self.arrays = {}, {}
        for name, spec in tensors.items():
            if spec.get("absent"):
                self.arrays[name] = None
                continue
            dtype = np.dtype(DTYPES[spec["dtype"]])
            strides = spec.get("strides") or _dense_strides(spec["shape"])
            if "alias_of" in spec:
                continue
            buffer = np.zeros(max(_extent(spec["shape"], strides), 1), dtype=dtype)
            array = np.lib.stride_tricks.as_strided(
                buffer, spec["shape"], [s * dtype.itemsize for s in strides], writeable=True)
            values = spec.get("values")
            if values:
                flat = [_number(v) for v in values]
                for i, index in enumerate(np.ndindex(*spec["shape"])):
                    array[index] = flat[i % len(flat)]
            self.buffers[name], self.arrays[name] = buffer, array
        for name, spec in tensors.items():
            if "alias_of" in spec and not spec.get("absent"):
                dtype = np.dtype(DTYPES[spec["dtype"]])
                strides = spec.get("strides") or _dense_strides(spec["shape"])
                base = self.buffers[spec["alias_of"]][spec.get("alias_offset", 0):]
                self.arrays[name] = np.lib.stride_tricks.as_strided(
                    base, spec["shape"], [s * dtype.itemsize for s in strides], writeable=True)

    def __getitem__(self, name):
        return self.arrays.get(name)

    def s(self, name, default=None):
        return self.scalars.get(name, default)

    def f(self, name):
        return _number(self.scalars[name])


def _config(c):
    return mlakit.MlaConfig(
        scale=c.f("scale"), num_heads=c.s("num_heads"), kv_lora_rank=c.s("kv_lora_rank"),
        qk_rope_head_dim=c.s("qk_rope_head_dim"), qk_nope_head_dim=c.s("qk_nope_head_dim"),
        v_head_dim=c.s("v_head_dim"), act_dtype=ACT_DTYPES[c.s("act_dtype")],
        kv_cache_dtype=c.s("kv_cache_dtype", "auto"), block_size=c.s("block_size", 64),
        decode_threshold=c.s("decode_threshold", 1), workspace_tokens=c.s("workspace_tokens", 0),
        max_model_len=c.s("max_model_len", 4096), max_num_seqs=c.s("max_num_seqs", 256),
        query_len_support=c.s("query_len_support", "varlen"), device=c.s("device", "cpu"))


def _decode(c, tensor_scales=False):
    scales = ((c["q_scale"], c["k_scale"]) if tensor_scales else (c.f("q_scale"), c.f("k_scale")))
    args = (c["q"], c["kv_cache"], c["block_table"], c["seq_lens"], c["out"], c["lse"],
            c.f("scale"), c.s("kv_cache_dtype"), *scales)
    if c.s("form") == "host":
        mlakit.mla_decode(*args, kv_lora_rank=c.s("kv_lora_rank"))
        return
    schedule = mlakit.DecodeSchedule(np.array(c.s("schedule_lens"), np.int32),
                                     c.s("schedule_block_size"), c.s("num_workers"))
    mlakit.mla_decode(*args, schedule=schedule, split_workspace=c["split_workspace"],
                      kv_lora_rank=c.s("kv_lora_rank"))


RUNNERS = {
    "concat_and_cache_mla": lambda c: mlakit.concat_and_cache_mla(
        c["kv_c"], c["k_pe"], c["kv_cache"], c["slot_mapping"], c.s("kv_cache_dtype"),
        c.f("scale")),
    "gather_and_maybe_dequant_cache": lambda c: mlakit.gather_and_maybe_dequant_cache(
        c["src_cache"], c["dst"], c["block_table"], c["cu_seq_lens"], c["token_to_seq"],
        c.s("num_tokens"), c.s("kv_cache_dtype"), c.f("scale"), c["seq_starts"]),
    "cp_gather_cache": lambda c: mlakit.cp_gather_cache(
        c["src_cache"], c["dst"], c["block_table"], c["cu_seq_lens"], c.s("batch_size"),
        c["seq_starts"]),
    "merge_attn_states": lambda c: mlakit.merge_attn_states(
        c["output"], c["prefix_output"], c["prefix_lse"], c["suffix_output"], c["suffix_lse"],
        c["output_lse"]),
    "scaled_fp8_quant": lambda c: mlakit.static_scaled_fp8_quant(c["out"], c["input"],
                                                                 c.f("scale")),
    "concat_and_cache_mla_tensor_scale": lambda c: mlakit.concat_and_cache_mla(
        c["kv_c"], c["k_pe"], c["kv_cache"], c["slot_mapping"], c.s("kv_cache_dtype"),
        c["scale"]),
    "gather_and_maybe_dequant_cache_tensor_scale": lambda c: mlakit.gather_and_maybe_dequant_cache(
        c["src_cache"], c["dst"], c["block_table"], c["cu_seq_lens"], c["token_to_seq"],
        c.s("num_tokens"), c.s("kv_cache_dtype"), c["scale"], c["seq_starts"]),
    "scaled_fp8_quant_tensor_scale": lambda c: mlakit.static_scaled_fp8_quant(
        c["out"], c["input"], c["scale"]),
    "dynamic_scaled_fp8_quant": lambda c: mlakit.dynamic_scaled_fp8_quant(
        c["out"], c["input"], c["scale"]),
    "mla_decode": _decode,
    "mla_decode_tensor_scale": lambda c: _decode(c, tensor_scales=True),
    "mla_prefill": lambda c: mlakit.mla_prefill(
        c["q"], c["k_nope"], c["k_pe"], c["v"], c["cu_seqlens_q"], c["cu_seqlens_k"],
        c.s("max_seqlen_q"), c.s("max_seqlen_k"), c.f("scale"), bool(c.s("causal")), c["out"],
        c["lse"]),
    # absorb_kv_b_proj has no Python entry point: Python reaches it through MlaAttention.
    "absorb_kv_b_proj": lambda c: mlakit.MlaAttention(_config(c), c["kv_b_proj_weight"],
                                                      c["kv_b_proj_scale_inv"]),
    "mla_attention": lambda c: mlakit.MlaAttention(_config(c), c["kv_b_proj_weight"],
                                                   c["kv_b_proj_scale_inv"]),
}


def _tables():
    if not CASES.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(CASES.glob("*.json"))]


def _runs_in_python(entry):
    return "python" in entry.get("layers", ["python"])


def _call(table, patch_tensors=None, patch_scalars=None):
    tensors = {name: _merge(spec, (patch_tensors or {}).get(name, {}))
               for name, spec in table["base"]["tensors"].items()}
    for name, spec in (patch_tensors or {}).items():
        tensors.setdefault(name, spec)
    scalars = {**table["base"].get("scalars", {}), **(patch_scalars or {})}
    return Call(tensors, scalars)


@pytest.mark.parametrize("table", [t for t in _tables() if _runs_in_python(t)],
                         ids=lambda t: t["op"])
def test_every_malformed_call_raises_naming_the_argument(table):
    run = RUNNERS[table["op"]]
    run(_call(table))  # the valid base call
    cuda_build = mlakit.build_info()["cuda"]
    cases = [c for c in table["cases"]
             if _runs_in_python(c) and not (c.get("cpu_only_build") and cuda_build)]
    assert cases, f"no case of {table['op']} runs in Python"
    for case in cases:
        call = _call(table, case.get("tensors"), case.get("scalars"))
        with pytest.raises(mlakit.MlakitError) as info:
            run(call)
        message = str(info.value)
        assert info.value.status == case["status"], f"{case['name']}: {message}"
        for part in case["expect"]:
            assert part in message, f"{case['name']}: {message!r} lacks {part!r}"


def test_the_table_is_there():
    if not CASES.is_dir():
        pytest.skip(f"{CASES} not found (tests run outside the repository)")
    assert len(_tables()) >= 10
