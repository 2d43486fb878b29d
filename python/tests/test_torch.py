"""torch tensors and torch.ops.mlakit (skipped where torch is not installed)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mlakit  # noqa: E402  (after torch: the ops register on import)
from reference import e4m3_encode, merge_attn_states as merge_reference  # noqa: E402

OPS = ["concat_and_cache_mla", "gather_and_maybe_dequant_cache", "cp_gather_cache",
       "merge_attn_states", "static_scaled_fp8_quant", "mla_decode", "mla_decode_tensor_scale",
       "mla_prefill", "mla_attention_forward", "mla_attention_forward_step"]


def merge_inputs(rng, T=6, H=3, D=16):
    prefix = torch.from_numpy(rng.standard_normal((T, H, D)).astype(np.float32))
    suffix = torch.from_numpy(rng.standard_normal((T, H, D)).astype(np.float32))
    p_lse = torch.from_numpy(rng.standard_normal((H, T)).astype(np.float32))
    s_lse = torch.from_numpy(rng.standard_normal((H, T)).astype(np.float32))
    p_lse[0, 0] = s_lse[0, 0] = float("-inf")
    return prefix, p_lse, suffix, s_lse


def expected_merge(prefix, p_lse, suffix, s_lse):
    out, _ = merge_reference(prefix.double().numpy(), p_lse.numpy(), suffix.double().numpy(),
                             s_lse.numpy())
    return torch.from_numpy(out).float()


def test_ops_are_registered():
    assert mlakit.torch_ops_registered
    for name in OPS:
        assert hasattr(torch.ops.mlakit, name), name


def test_python_api_takes_cpu_tensors(rng):
    prefix, p_lse, suffix, s_lse = merge_inputs(rng)
    out = torch.full_like(prefix, float("nan"))
    mlakit.merge_attn_states(out, prefix, p_lse, suffix, s_lse)
    torch.testing.assert_close(out, expected_merge(prefix, p_lse, suffix, s_lse), rtol=1e-5,
                               atol=1e-5)


def test_torch_op_writes_its_output(rng):
    prefix, p_lse, suffix, s_lse = merge_inputs(rng)
    out = torch.full_like(prefix, float("nan"))
    out_lse = torch.full_like(p_lse, float("nan"))
    torch.ops.mlakit.merge_attn_states(out, prefix, p_lse, suffix, s_lse, out_lse)
    torch.testing.assert_close(out, expected_merge(prefix, p_lse, suffix, s_lse), rtol=1e-5,
                               atol=1e-5)
    assert torch.isneginf(out_lse[0, 0])


def test_torch_op_passes_opcheck(rng):
    prefix, p_lse, suffix, s_lse = merge_inputs(rng)
    out, out_lse = torch.empty_like(prefix), torch.empty_like(p_lse)
    torch.library.opcheck(torch.ops.mlakit.merge_attn_states.default,
                          (out, prefix, p_lse, suffix, s_lse, out_lse))


def test_torch_compile_fullgraph(rng):
    prefix, p_lse, suffix, s_lse = merge_inputs(rng)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def merged(p, pl, s, sl):
        out = torch.empty_like(p)
        torch.ops.mlakit.merge_attn_states(out, p, pl, s, sl, None)
        return out * 2

    expected = expected_merge(prefix, p_lse, suffix, s_lse) * 2
    torch.testing.assert_close(merged(prefix, p_lse, suffix, s_lse), expected, rtol=1e-5,
                               atol=1e-5)


def test_bf16_cache_write_is_bit_exact_and_strided(rng):
    L, R = 16, 8
    wide = torch.from_numpy(rng.standard_normal((5, L + 4)).astype(np.float32)).bfloat16()
    kv_c = wide[:, :L]  # row stride L + 4
    k_pe = torch.from_numpy(rng.standard_normal((5, 1, R)).astype(np.float32)).bfloat16()
    cache = torch.full((3, 2, L + R), float("nan"), dtype=torch.bfloat16)
    slots = torch.tensor([4, -1, 0, 5, 2], dtype=torch.int64)
    torch.ops.mlakit.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", 1.0)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            entry = torch.cat([kv_c[t], k_pe[t, 0]])
            assert torch.equal(cache[slot // 2, slot % 2].view(torch.int16),
                               entry.view(torch.int16))
    assert torch.isnan(cache[0, 1]).all() and torch.isnan(cache[1, 1]).all()


def test_fp8_quant_returns_a_float8_tensor(rng):
    x = torch.from_numpy((rng.standard_normal((4, 9)) * 300).astype(np.float32))
    out = mlakit.scaled_fp8_quant(x, 0.5)
    assert out.dtype == torch.float8_e4m3fn
    inverse = np.float32(1.0) / np.float32(0.5)
    expected = e4m3_encode(x.numpy() * inverse)
    assert np.array_equal(out.view(torch.uint8).numpy(), expected)


def test_mla_attention_forward_op_matches_the_python_method(rng):
    N, L, R, P, V, block = 2, 32, 8, 16, 16, 4
    config = mlakit.MlaConfig(scale=0.2, num_heads=N, kv_lora_rank=L, qk_rope_head_dim=R,
                              qk_nope_head_dim=P, v_head_dim=V, act_dtype="float32",
                              block_size=block, workspace_tokens=16, max_num_seqs=4)
    weight = torch.from_numpy(rng.standard_normal((N * (P + V), L)).astype(np.float32) / 6)
    layer = mlakit.MlaAttention(config, weight)
    qsl = torch.tensor([0, 1, 4], dtype=torch.int32)  # a decode, then a 3-token prefill
    seq_lens = torch.tensor([5, 3], dtype=torch.int32)
    block_table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    slots = torch.tensor([4, 8, 9, 10], dtype=torch.int64)
    q = torch.from_numpy(rng.standard_normal((4, N, P + R)).astype(np.float32))
    kv_c = torch.from_numpy(rng.standard_normal((4, L)).astype(np.float32))
    k_pe = torch.from_numpy(rng.standard_normal((4, R)).astype(np.float32))
    cache = torch.from_numpy(rng.standard_normal((4, block, L + R)).astype(np.float32))
    cache_copy = cache.clone()

    out_op = torch.empty(4, N * V)
    torch.ops.mlakit.mla_attention_forward(layer.layer_id, q, kv_c, k_pe, cache, qsl, seq_lens,
                                           block_table, slots, 4, out_op)
    out_py = torch.empty(4, N * V)
    batch = mlakit.ForwardBatch(qsl, seq_lens, block_table, slots)
    layer.forward(q, kv_c, k_pe, cache_copy, batch, out_py)
    assert torch.equal(out_op, out_py)
    assert torch.equal(cache, cache_copy)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensors_reach_the_library(rng):
    prefix, p_lse, suffix, s_lse = [t.cuda() for t in merge_inputs(rng)]
    out = torch.empty_like(prefix)
    if not mlakit.build_info()["cuda"]:
        with pytest.raises(NotImplementedError, match="cuda:0"):
            mlakit.merge_attn_states(out, prefix, p_lse, suffix, s_lse)
        return
    mlakit.merge_attn_states(out, prefix, p_lse, suffix, s_lse)
    torch.cuda.synchronize()
    expected = expected_merge(prefix.cpu(), p_lse.cpu(), suffix.cpu(), s_lse.cpu())
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_bad_slot_on_the_gpu_is_reported_by_check_device_errors():
    if not mlakit.build_info()["cuda"]:
        pytest.skip("this build has no CUDA backend")
    L, R, block = 32, 8, 4
    cache = torch.full((2, block, L + R), float("nan"), device="cuda")
    kv_c = torch.randn(2, L, device="cuda")
    k_pe = torch.randn(2, R, device="cuda")
    slots = torch.tensor([1, 2 * block], dtype=torch.int64, device="cuda")  # the second is past
    mlakit.check_device_errors("cuda")  # start clean
    mlakit.concat_and_cache_mla(kv_c, k_pe, cache, slots)
    with pytest.raises(ValueError, match="slot_mapping") as info:
        mlakit.check_device_errors("cuda")
    assert info.value.status == "out_of_range"
    mlakit.check_device_errors(torch.device("cuda"))  # the record was cleared
    flat = cache.reshape(-1, L + R).cpu()
    torch.testing.assert_close(flat[1], torch.cat([kv_c[0], k_pe[0]]).cpu())
    assert torch.isnan(flat[[0] + list(range(2, 2 * block))]).all()  # nothing else written


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_decode_plans_itself_or_takes_the_librarys_schedule(rng):
    if not mlakit.build_info()["cuda"]:
        pytest.skip("this build has no CUDA backend")
    L, R, N, block = 512, 64, 16, 16  # the CUDA kernel's latent width
    seq_lens = torch.tensor([700, 3, 0, 129, 2000], dtype=torch.int32)
    width = -(-int(seq_lens.max()) // block)
    num_blocks = len(seq_lens) * width
    table = torch.from_numpy(rng.permutation(num_blocks).astype(np.int32)).reshape(-1, width)
    cache = torch.from_numpy(rng.standard_normal((num_blocks, block, L + R)).astype(np.float32))
    cache = cache.to(torch.bfloat16)
    q = torch.from_numpy(rng.standard_normal((len(seq_lens), 1, N, L + R)).astype(np.float32))
    q = q.to(torch.bfloat16)
    out_cpu = torch.empty(len(seq_lens), 1, N, L)
    lse_cpu = torch.empty(len(seq_lens), 1, N)
    mlakit.mla_decode(q, cache, table, seq_lens, out_cpu, lse_cpu, 0.1, kv_lora_rank=L)

    gpu = [t.cuda() for t in (q, cache, table, seq_lens)]
    out = torch.full((len(seq_lens), 1, N, L), float("nan"), device="cuda")
    lse = torch.full((len(seq_lens), 1, N), float("nan"), device="cuda")
    # plans from the shape, workspace from torch
    mlakit.mla_decode(*gpu, out, lse, 0.1, kv_lora_rank=L)
    torch.cuda.synchronize()
    # bf16 MMAs with bf16 probabilities against the CPU's f32 (decode_test_support.hpp).
    torch.testing.assert_close(out.cpu(), out_cpu, rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(lse.cpu(), lse_cpu, rtol=1e-4, atol=1e-4)

    for invariant in (False, True):
        schedule = mlakit.plan_mla_decode("cuda", len(seq_lens), 1, N, block, width * block,
                                          batch_invariant=invariant)
        workspace = torch.empty(schedule.workspace_elems(1, N, L), device="cuda")
        out.fill_(float("nan"))
        mlakit.mla_decode(*gpu, out, lse, 0.1, schedule=schedule, split_workspace=workspace,
                          kv_lora_rank=L)
        torch.cuda.synchronize()
        torch.testing.assert_close(out.cpu(), out_cpu, rtol=1.6e-2, atol=1e-2)
        torch.testing.assert_close(lse.cpu(), lse_cpu, rtol=1e-4, atol=1e-4)
    mlakit.check_device_errors("cuda")


def test_torch_op_decode_tensor_scale_equals_floats(rng):
    """torch.ops.mlakit.mla_decode_tensor_scale with one-element CPU tensors gives the float
    form's bits; per-request tensors give each request its own scales."""
    L, R, N, block = 32, 8, 2, 4
    seq_lens = torch.tensor([5, 9], dtype=torch.int32)
    table = torch.tensor([[0, 1, -1], [2, 3, 4]], dtype=torch.int32)
    cache = torch.from_numpy(e4m3_encode(rng.standard_normal((5, block, L + R)) * 3))
    q = torch.from_numpy(e4m3_encode(rng.standard_normal((2, 1, N, L + R)) * 3))
    q = q.view(torch.float8_e4m3fn)
    outs = [torch.full((2, 1, N, L), float("nan")) for _ in range(4)]
    lses = [torch.full((2, 1, N), float("nan")) for _ in range(4)]
    torch.ops.mlakit.mla_decode(q, cache, table, seq_lens, outs[0], lses[0], L, 0.2, "fp8", 0.5,
                                2.0)
    torch.ops.mlakit.mla_decode_tensor_scale(q, cache, table, seq_lens, outs[1], lses[1], L, 0.2,
                                             "fp8", torch.tensor([0.5]), torch.tensor([2.0]))
    assert torch.equal(outs[0], outs[1]) and torch.equal(lses[0], lses[1])
    # per request: request b with (q_scales[b], k_scales[b]) alone, by the float form
    q_scales, k_scales = torch.tensor([0.5, 0.25]), torch.tensor([2.0, 1.5])
    torch.ops.mlakit.mla_decode_tensor_scale(q, cache, table, seq_lens, outs[2], lses[2], L, 0.2,
                                             "fp8", q_scales, k_scales)
    for b in range(2):
        torch.ops.mlakit.mla_decode(q[b:b + 1], cache, table[b:b + 1], seq_lens[b:b + 1],
                                    outs[3][b:b + 1], lses[3][b:b + 1], L, 0.2, "fp8",
                                    float(q_scales[b]), float(k_scales[b]))
    torch.testing.assert_close(outs[2], outs[3], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lses[2], lses[3], rtol=1e-6, atol=1e-6)
