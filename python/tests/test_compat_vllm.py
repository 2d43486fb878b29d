"""mlakit.compat.vllm against vLLM's public contract of its MLA ops (vllm._custom_ops), on torch
tensors. Every expected value comes from a float64 reference written in this file (an e4m3 table
built from the OCP format definition, LSE merges and dequantization in float64); inputs are fresh
random values from the seeded `rng` fixture (conftest.py), outputs and unused cache slots are
poisoned with NaN so that a stray or missing write shows.

GPU: the tests parametrized with DEVICES also run on torch CUDA tensors when torch sees a GPU
(and mlakit was built with CUDA; the scales are then CUDA tensors, read on the device); everything
else is CPU only. CUDA-graph capture and replay with new scale values: test_compat_vllm_cuda.py.
Not tested anywhere: torch.compile of the compat functions.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="mlakit.compat needs torch")

import mlakit  # noqa: E402
from mlakit.compat import vllm  # noqa: E402

from compat_case import DEVICES, E4M3  # noqa: E402

FP8 = torch.float8_e4m3fn
FLT_MIN = float(np.finfo(np.float32).tiny)  # fp8_ds_mla's smallest tile scale
DS_ENTRY, DS_NOPE, DS_ROPE = 656, 512, 64  # fp8_ds_mla: entry bytes, e4m3 latent, bf16 rope


# ---- float64 references --------------------------------------------------------------------------

E4M3_FINITE = E4M3[:0x7F]  # codes 0x00..0x7e: the non-negative finite values, increasing


def e4m3_codes(x):
    """Saturating round-to-nearest-even e4m3fn codes (uint8) of values, by brute force: the
    nearest of the 127 non-negative finite values (ties: the even code), sign bit from x."""
    x = np.asarray(x, dtype=np.float64)
    magnitude = np.minimum(np.abs(x), 448.0)[..., None]
    distance = np.abs(magnitude - E4M3_FINITE)
    nearest = distance == distance.min(axis=-1, keepdims=True)
    index = np.arange(E4M3_FINITE.size)
    even = np.where(nearest & (index % 2 == 0), index, 999).min(axis=-1)
    code = np.where(even < 999, even, np.where(nearest, index, 999).min(axis=-1))
    code = np.where(np.signbit(x), code | 0x80, code)
    return np.where(np.isnan(x), 0x7F, code).astype(np.uint8)


def f32(x):
    """float64 values rounded to float32 (what an f32 operation stores)."""
    return np.asarray(x, dtype=np.float64).astype(np.float32)


def bits(t):
    """A tensor's raw bits on the host (exact comparisons, NaN included)."""
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]
    return t.detach().cpu().contiguous().view(view).numpy()


def f64(t):
    return t.detach().cpu().double().numpy()


def randn(rng, shape, dtype, device, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape) * scale).to(dtype).to(device)


def nan_tensor(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def test_e4m3_reference_agrees_with_torch_inside_the_range(rng):
    # The reference of the reference: below 448 both round to nearest even.
    x = np.concatenate([rng.standard_normal(3000) * 60, rng.standard_normal(1000) * 1e-3,
                        [0.0, 448.0, -448.0, 2.0**-9, 2.0**-10, 3 * 2.0**-11]])
    want = torch.from_numpy(x.astype(np.float32)).to(FP8).view(torch.uint8).numpy()
    assert np.array_equal(e4m3_codes(f32(x)), want)
    assert e4m3_codes(1e6) == 0x7E and e4m3_codes(-1e6) == 0xFE  # saturation at +-448
    assert e4m3_codes(np.nan) == 0x7F


def merge_f64(prefix, prefix_lse, suffix, suffix_lse):
    """float64 LSE merge. prefix, suffix: [T, H, D]; LSEs [H, T]; +inf counts as -inf (an empty
    key set); both empty: out 0, lse -inf."""
    p = np.where(np.isposinf(prefix_lse), -np.inf, prefix_lse).T
    s = np.where(np.isposinf(suffix_lse), -np.inf, suffix_lse).T
    m = np.maximum(p, s)
    empty = np.isneginf(m)
    shift = np.where(empty, 0.0, m)
    wp, ws = np.exp(p - shift), np.exp(s - shift)
    total = np.where(empty, 1.0, wp + ws)
    out = prefix * (wp / total)[..., None] + suffix * (ws / total)[..., None]
    out[empty] = 0.0
    lse = np.where(empty, -np.inf, np.log(total) + shift)
    return out, lse.T


# ---- concat_and_cache_mla ------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_concat_and_cache_mla_auto_writes_entries_and_skips_negative_slots(rng, device, dtype):
    L, R, num_blocks, block_size, padded, tokens = 32, 16, 5, 4, 9, 7
    kv_c = randn(rng, (padded, L), dtype, device)
    k_pe = randn(rng, (padded, 1, R), dtype, device)  # vLLM passes k_pe unsqueezed
    slots = rng.permutation(num_blocks * block_size)[:tokens].astype(np.int64)
    slots[3] = -1  # a padding token: skipped
    cache = nan_tensor((num_blocks, block_size, L + R), dtype, device)
    expected = bits(cache)
    for t, slot in enumerate(slots):
        if slot >= 0:
            row = torch.cat([kv_c[t], k_pe[t, 0]])
            expected[slot // block_size, slot % block_size] = bits(row)

    vllm.concat_and_cache_mla(kv_c, k_pe, cache, torch.from_numpy(slots).to(device), "auto",
                              torch.ones(1, device=device))  # vLLM's scale is a tensor
    assert np.array_equal(bits(cache), expected)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3"])
def test_concat_and_cache_mla_fp8_stores_x_over_the_tensor_scale(rng, kv_cache_dtype):
    L, R, num_blocks, block_size, tokens = 24, 8, 4, 4, 10
    scale = np.float32(rng.uniform(0.05, 0.5))
    kv_c = randn(rng, (tokens, L), torch.bfloat16, "cpu", 60.0)  # some |x / scale| > 448
    k_pe = randn(rng, (tokens, R), torch.bfloat16, "cpu", 60.0)
    slots = rng.permutation(num_blocks * block_size)[:tokens].astype(np.int64)
    cache = torch.full((num_blocks, block_size, L + R), 0xFF, dtype=torch.uint8)  # fp8 NaN
    expected = cache.numpy().copy()
    for t, slot in enumerate(slots):
        row = np.concatenate([f64(kv_c[t]), f64(k_pe[t])])
        quotient = f32(row) / scale  # vLLM divides by the scale in f32
        expected[slot // block_size, slot % block_size] = e4m3_codes(quotient)

    vllm.concat_and_cache_mla(kv_c, k_pe, cache, torch.from_numpy(slots), kv_cache_dtype,
                              torch.tensor([scale]))
    assert np.array_equal(cache.numpy(), expected)


# ---- fp8_ds_mla: cp_gather_and_upconvert_fp8_kv_cache --------------------------------------------


def ds_mla_cache(rng, num_blocks, block_size):
    """A hand-built fp8_ds_mla cache (uint8 [num_blocks, block_size, 656]): random finite e4m3
    codes, random positive f32 tile scales, random bf16 rope values. Returns the cache and its
    float64 dequantized entries [num_blocks, block_size, 576] (the rope as bf16 values)."""
    finite_codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    codes = rng.choice(finite_codes, size=(num_blocks, block_size, DS_NOPE))
    scales = f32(rng.uniform(1e-4, 1e-2, (num_blocks, block_size, 4)))
    rope = torch.from_numpy(rng.standard_normal((num_blocks, block_size, DS_ROPE))).bfloat16()
    cache = np.empty((num_blocks, block_size, DS_ENTRY), dtype=np.uint8)
    cache[..., :DS_NOPE] = codes
    cache[..., DS_NOPE:DS_NOPE + 16] = scales.view(np.uint8)
    cache[..., DS_NOPE + 16:] = rope.view(torch.uint8).numpy()
    values = np.empty((num_blocks, block_size, DS_NOPE + DS_ROPE))
    tile_scales = np.repeat(scales.astype(np.float64), 128, axis=-1)  # one scale per 128 codes
    values[..., :DS_NOPE] = E4M3[codes] * tile_scales  # exact in float64
    values[..., DS_NOPE:] = rope.double().numpy()
    return torch.from_numpy(cache), values


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["back_to_back", "gaps"])
def test_cp_gather_and_upconvert_dequantizes_ds_mla_entries_to_bf16(rng, device, layout):
    num_blocks, block_size, width = 12, 4, 4
    cache, values = ds_mla_cache(rng, num_blocks, block_size)
    block_table = rng.permutation(num_blocks)[:3 * width].reshape(3, width).astype(np.int32)
    lens = np.array([5, 0, 9], dtype=np.int32)
    if layout == "back_to_back":  # vLLM's usual workspace: an exclusive cumsum (+ an offset)
        starts = np.array([3, 8, 8], dtype=np.int32)
    else:  # any rows: request 2 before request 0, a gap between them
        starts = np.array([14, 30, 1], dtype=np.int32)
    rows = 24
    # Rows no request covers hold -3.5 and must keep it (neither NaN nor any entry may land there).
    dst = torch.full((rows, DS_NOPE + DS_ROPE), -3.5, dtype=torch.bfloat16, device=device)

    vllm.cp_gather_and_upconvert_fp8_kv_cache(
        cache.to(device), dst, torch.from_numpy(block_table).to(device),
        torch.from_numpy(lens).to(device), torch.from_numpy(starts).to(device), 3)

    expected = bits(torch.full((rows, DS_NOPE + DS_ROPE), -3.5, dtype=torch.bfloat16))
    for b in range(3):
        for p in range(lens[b]):
            block, offset = block_table[b, p // block_size], p % block_size
            entry = values[block, offset].copy()
            entry[:DS_NOPE] = f32(entry[:DS_NOPE])  # the product in f32, then bf16
            expected[starts[b] + p] = bits(torch.from_numpy(entry).bfloat16())
    assert np.array_equal(bits(dst), expected)  # unwritten rows keep their values


def test_ds_mla_round_trip_through_concat_and_cache_mla(rng):
    num_blocks, block_size, tokens = 4, 4, 11
    kv_c = randn(rng, (tokens, DS_NOPE), torch.bfloat16, "cpu")
    kv_c[2, 128:256] = 0  # an all-zero tile
    kv_c *= torch.from_numpy(rng.uniform(0.01, 100, (tokens, 1))).bfloat16()
    k_pe = randn(rng, (tokens, 1, DS_ROPE), torch.bfloat16, "cpu")
    slots = torch.arange(tokens, dtype=torch.int64)
    cache = torch.full((num_blocks, block_size, DS_ENTRY), 0xFF, dtype=torch.uint8)
    vllm.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla", torch.ones(1))

    dst = nan_tensor((tokens, DS_NOPE + DS_ROPE), torch.bfloat16, "cpu")
    table = torch.arange(num_blocks, dtype=torch.int32).reshape(1, num_blocks)
    vllm.cp_gather_and_upconvert_fp8_kv_cache(cache, dst, table, torch.tensor([tokens]),
                                              torch.tensor([0]), 1)
    x = f64(kv_c)
    tile_amax = np.abs(x).reshape(tokens, 4, 128).max(axis=-1)
    tile_scale = np.repeat(np.maximum(tile_amax / 448.0, FLT_MIN), 128, axis=-1)
    # e4m3 keeps 3 mantissa bits (half a step: 2^-4 relative), its subnormal step is 2^-9 scale
    # units; bf16 adds 2^-8 relative; the scale itself is an f32 rounding of amax / 448.
    bound = np.abs(x) * (2.0**-4 + 2.0**-8 + 1e-6) + tile_scale * 2.0**-10
    assert (np.abs(f64(dst)[:, :DS_NOPE] - x) <= bound).all()
    assert np.array_equal(bits(dst)[:, DS_NOPE:], bits(k_pe[:, 0]))  # rope copied bit for bit


def test_cp_gather_and_upconvert_rejects_what_vllm_rejects(rng):
    cache, _ = ds_mla_cache(rng, 2, 4)
    table = torch.zeros((1, 2), dtype=torch.int32)
    lens, starts = torch.tensor([3]), torch.tensor([0])
    with pytest.raises(TypeError, match=r"dst must have dtype bfloat16, got float16"):
        vllm.cp_gather_and_upconvert_fp8_kv_cache(
            cache, torch.empty((3, 576), dtype=torch.float16), table, lens, starts, 1)
    with pytest.raises(ValueError, match=r"src_cache entries must be 656 bytes"):
        vllm.cp_gather_and_upconvert_fp8_kv_cache(
            cache[..., :576], torch.empty((3, 576), dtype=torch.bfloat16), table, lens, starts, 1)
    with pytest.raises(ValueError, match=r"request 0: rows \[2, 5\) are not inside the 4 rows"):
        vllm.cp_gather_and_upconvert_fp8_kv_cache(
            cache, torch.empty((4, 576), dtype=torch.bfloat16), table, lens, torch.tensor([2]), 1)


# ---- gathers -------------------------------------------------------------------------------------


def gather_layout(rng, num_blocks, width):
    """Three requests (one empty) with seq_starts: block_table, starts, lens, cu, token_to_seq."""
    block_table = rng.permutation(num_blocks)[:3 * width].reshape(3, width).astype(np.int32)
    starts = np.array([1, 2, 3], dtype=np.int32)
    lens = np.array([6, 0, 5], dtype=np.int32)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    token_to_seq = np.repeat(np.arange(3), lens).astype(np.int32)
    return block_table, starts, lens, cu, token_to_seq


def picked(cache_values, block_table, starts, lens):
    """[sum(lens), W] entries at positions starts[b] + p of each request, read by hand."""
    block_size = cache_values.shape[1]
    return np.stack([cache_values[block_table[b, (starts[b] + p) // block_size],
                                  (starts[b] + p) % block_size]
                     for b in range(len(lens)) for p in range(lens[b])])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dst_dtype", [torch.float32, torch.bfloat16])
def test_gather_and_maybe_dequant_cache_fp8_multiplies_by_the_tensor_scale(rng, device,
                                                                           dst_dtype):
    num_blocks, block_size, W = 12, 4, 40
    codes = rng.integers(0, 0x7F, (num_blocks, block_size, W)).astype(np.uint8)  # finite
    codes |= (rng.integers(0, 2, codes.shape) * 0x80).astype(np.uint8)  # random signs
    scale = np.float32(rng.uniform(0.1, 2.0))
    block_table, starts, lens, cu, token_to_seq = gather_layout(rng, num_blocks, 4)
    tokens = int(cu[-1])
    dst = nan_tensor((tokens + 2, W), dst_dtype, device)  # two rows past num_tokens stay NaN
    as_t = lambda a: torch.from_numpy(a).to(device)  # noqa: E731

    vllm.gather_and_maybe_dequant_cache(as_t(codes), dst, as_t(block_table), as_t(cu),
                                        as_t(token_to_seq), tokens, "fp8",
                                        torch.tensor([scale], device=device), as_t(starts))
    expected = bits(nan_tensor((tokens + 2, W), dst_dtype, "cpu"))
    product = f32(E4M3[picked(codes, block_table, starts, lens)] * scale)  # the f32 product
    expected[:tokens] = bits(torch.from_numpy(product).to(dst_dtype))
    assert np.array_equal(bits(dst), expected)


def test_cp_gather_cache_copies_raw_entries(rng):
    num_blocks, block_size = 12, 4
    cache = rng.integers(0, 256, (num_blocks, block_size, DS_ENTRY)).astype(np.uint8)
    block_table, starts, lens, cu, _ = gather_layout(rng, num_blocks, 4)
    rows = int(cu[-1]) + 3
    dst = torch.full((rows, DS_ENTRY), 0xA5, dtype=torch.uint8)  # rows past cu[-1] keep 0xA5

    vllm.cp_gather_cache(torch.from_numpy(cache), dst, torch.from_numpy(block_table),
                         torch.from_numpy(cu), 3, torch.from_numpy(starts))
    expected = np.full((rows, DS_ENTRY), 0xA5, dtype=np.uint8)
    expected[:cu[-1]] = picked(cache, block_table, starts, lens)
    assert np.array_equal(dst.numpy(), expected)


# ---- mla_decode_kvcache_cpu ----------------------------------------------------------------------


def decode_f64(query, cache, block_table, lens, scale, value_dim):
    """Each head of request b over its first lens[b] cache entries, in float64: softmax(scale q K^T)
    V with K the whole entry and V its first value_dim values; zeros without keys."""
    q, kv = f64(query), f64(cache)
    out = np.zeros(q.shape[:2] + (value_dim,))
    block_size = kv.shape[1]
    for b, length in enumerate(lens):
        if length == 0:
            continue
        pos = np.arange(length)
        keys = kv[block_table[b, pos // block_size], pos % block_size]  # [length, L + R]
        scores = scale * q[b] @ keys.T  # [N, length]
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[b] = (weights / weights.sum(axis=1, keepdims=True)) @ keys[:, :value_dim]
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mla_decode_kvcache_cpu_attends_every_key_of_each_request(rng, device, dtype):
    if device != "cpu" and dtype == torch.float32:
        pytest.skip("mlakit's CUDA decode reads 16-bit caches only (f32: MlakitError unsupported)")
    heads, L, R, block_size, width = 16, 512, 64, 16, 5
    lens = np.array([1, 80, 0, 33], dtype=np.int32)  # one empty request: zeros
    batch = len(lens)
    num_blocks = batch * width + 2
    block_table = rng.permutation(num_blocks)[:batch * width].reshape(batch, width).astype(np.int32)
    cache = randn(rng, (num_blocks, block_size, L + R), dtype, "cpu")
    used = np.zeros((num_blocks, block_size), dtype=bool)
    for b, length in enumerate(lens):
        pos = np.arange(length)
        used[block_table[b, pos // block_size], pos % block_size] = True
    cache[torch.from_numpy(~used)] = float("nan")  # slots no request reaches: never read
    query = randn(rng, (batch, heads, L + R), dtype, "cpu")
    scale = float((L + R) ** -0.5)
    out = nan_tensor((batch, heads, L), dtype, device)

    vllm.mla_decode_kvcache_cpu(out, query.to(device), cache.to(device),
                                scale, torch.from_numpy(block_table).to(device),
                                torch.from_numpy(lens).to(device))
    want = decode_f64(query, cache.nan_to_num(), block_table, lens, scale, L)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4  # bf16 P and out rounding; f32 sums
    got = f64(out.cpu())
    assert not np.isnan(got).any()
    assert np.allclose(got, want, rtol=tol, atol=tol)
    assert (got[2] == 0).all()


def test_mla_decode_kvcache_cpu_reports_bad_arguments(rng):
    query = randn(rng, (2, 4, 576), torch.bfloat16, "cpu")
    cache = randn(rng, (4, 16, 576), torch.bfloat16, "cpu")
    table = torch.zeros((2, 2), dtype=torch.int32)
    lens = torch.tensor([3, 5], dtype=torch.int32)
    out = nan_tensor((2, 4, 512), torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="query must be"):
        vllm.mla_decode_kvcache_cpu(out, query.unsqueeze(1), cache, 0.04, table, lens)
    with pytest.raises(ValueError, match="out must be"):
        vllm.mla_decode_kvcache_cpu(out.unsqueeze(0), query, cache, 0.04, table, lens)
    with pytest.raises(mlakit.MlakitError, match="out"):  # 500 latent values: not the cache's
        vllm.mla_decode_kvcache_cpu(out[..., :500], query, cache, 0.04, table, lens)
    with pytest.raises(TypeError, match="kv_cache must have query's dtype bfloat16, got float16"):
        vllm.mla_decode_kvcache_cpu(out, query, cache.half(), 0.04, table, lens)
    with pytest.raises(TypeError, match="block_tables must have dtype int32, got int64"):
        vllm.mla_decode_kvcache_cpu(out, query, cache, 0.04, table.long(), lens)
    with pytest.raises(ValueError, match="seq_lens has 1 requests, query 2"):
        vllm.mla_decode_kvcache_cpu(out, query, cache, 0.04, table, lens[:1])
    with pytest.raises(ValueError, match="out has 3 heads, query 4"):
        vllm.mla_decode_kvcache_cpu(out[:, :3], query, cache, 0.04, table, lens)


# ---- merge_attn_states ---------------------------------------------------------------------------


def merge_inputs(rng, tokens, heads, dim, dtype, device):
    """Random states and LSEs with FlashAttention's +inf (empty) and -inf entries; token 1 has
    both halves empty for head 0."""
    prefix = randn(rng, (tokens, heads, dim), dtype, device)
    suffix = randn(rng, (tokens, heads, dim), dtype, device)
    p_lse = rng.standard_normal((heads, tokens)) * 3
    s_lse = rng.standard_normal((heads, tokens)) * 3
    p_lse[0, 0] = np.inf  # FlashAttention's "no keys"
    p_lse[1, 2] = -np.inf
    s_lse[2, 3] = -np.inf
    p_lse[0, 1] = s_lse[0, 1] = -np.inf  # both empty
    as_t = lambda a: torch.from_numpy(a.astype(np.float32)).to(device)  # noqa: E731
    return prefix, as_t(p_lse), suffix, as_t(s_lse)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_context", [None, 0, 4, 7])
@pytest.mark.parametrize("with_output_lse", [True, False])
def test_merge_attn_states_merges_the_first_tokens_and_copies_the_suffix(
        rng, device, dtype, with_context, with_output_lse):
    T, H, D = 7, 4, 32
    prefix, p_lse, suffix, s_lse = merge_inputs(rng, T, H, D, dtype, device)
    output = nan_tensor((T, H, D), dtype, device)
    output_lse = nan_tensor((H, T), torch.float32, device) if with_output_lse else None

    vllm.merge_attn_states(output, prefix, p_lse, suffix, s_lse, output_lse,
                           prefill_tokens_with_context=with_context)

    merged = T if with_context is None else with_context
    ref, ref_lse = merge_f64(f64(prefix), f64(p_lse), f64(suffix), f64(s_lse))
    tol = 1e-5 if dtype == torch.float32 else 2.0**-8  # f32 math; bf16 output rounding
    np.testing.assert_allclose(f64(output)[:merged], ref[:merged], rtol=tol, atol=tol)
    assert np.array_equal(bits(output)[merged:], bits(suffix)[merged:])  # copied as is
    if with_output_lse:
        lse = f64(output_lse)
        np.testing.assert_allclose(lse[:, :merged], ref_lse[:, :merged], rtol=1e-6, atol=1e-6)
        assert np.array_equal(bits(output_lse)[:, merged:], bits(s_lse)[:, merged:])
    if merged > 1:
        assert (f64(output)[1, 0] == 0).all()  # both empty: 0 (and LSE -inf)


def test_merge_attn_states_in_place_over_the_suffix(rng):
    T, H, D = 6, 4, 16
    prefix, p_lse, suffix, s_lse = merge_inputs(rng, T, H, D, torch.float32, "cpu")
    ref, _ = merge_f64(f64(prefix), f64(p_lse), f64(suffix), f64(s_lse))
    ref[3:] = f64(suffix)[3:]
    vllm.merge_attn_states(suffix, prefix, p_lse, suffix, s_lse, None,
                           prefill_tokens_with_context=3)
    np.testing.assert_allclose(f64(suffix), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_context", [None, 5])
def test_merge_attn_states_fp8_output_is_divided_by_output_scale(rng, device, with_context):
    T, H, D = 8, 4, 32
    prefix, p_lse, suffix, s_lse = merge_inputs(rng, T, H, D, torch.bfloat16, device)
    prefix, suffix = prefix * 40, suffix * 40  # some |merged / scale| > 448: saturation
    scale = np.float32(rng.uniform(0.05, 0.2))
    output = torch.full((T, H, D), 0x7F, dtype=torch.uint8, device=device).view(FP8)
    merged_f32 = nan_tensor((T, H, D), torch.float32, device)
    vllm.merge_attn_states(merged_f32, prefix, p_lse, suffix, s_lse, None, with_context)

    vllm.merge_attn_states(output, prefix, p_lse, suffix, s_lse, None, with_context,
                           output_scale=torch.tensor([scale], device=device))

    # Exact: e4m3 of the f32 merge times the f32 inverse of the scale (vLLM's static fp8 form).
    inverse = np.float32(1.0) / scale
    assert np.array_equal(bits(output), e4m3_codes(f32(f64(merged_f32) * inverse)))
    # And against float64: within half an e4m3 step (2^-4 relative) plus the subnormal step.
    merged = T if with_context is None else with_context
    ref, _ = merge_f64(f64(prefix), f64(p_lse), f64(suffix), f64(s_lse))
    ref[merged:] = f64(suffix)[merged:]
    want = np.clip(ref / np.float64(scale), -448, 448)
    got = E4M3[bits(output)]
    assert (np.abs(got - want) <= np.abs(want) * (2.0**-4 + 1e-4) + 2.0**-10 + 1e-6).all()


def test_merge_attn_states_reports_bad_arguments(rng):
    T, H, D = 7, 4, 8
    prefix, p_lse, suffix, s_lse = merge_inputs(rng, T, H, D, torch.float32, "cpu")
    out = torch.empty((T, H, D))
    with pytest.raises(ValueError, match=r"prefill_tokens_with_context must be in \[0, 7\] "
                                         r"\(num_tokens\), got 8"):
        vllm.merge_attn_states(out, prefix, p_lse, suffix, s_lse, None, 8)
    with pytest.raises(ValueError, match=r"an fp8 output needs output_scale"):
        vllm.merge_attn_states(out.to(FP8), prefix, p_lse, suffix, s_lse)
    with pytest.raises(TypeError, match=r"output \(with output_scale\) must have dtype "
                                        r"float8_e4m3fn, got float32"):
        vllm.merge_attn_states(out, prefix, p_lse, suffix, s_lse, output_scale=torch.ones(1))
    with pytest.raises(ValueError, match=r"prefix_lse must be \[num_heads, num_tokens\] = "
                                         r"\[4, 7\], got \[7, 4\]"):
        vllm.merge_attn_states(out, prefix, p_lse.T.contiguous(), suffix, s_lse, None, 0)
    with pytest.raises(ValueError, match=r"output_scale must have exactly one element"):
        vllm.merge_attn_states(out.to(FP8), prefix, p_lse, suffix, s_lse,
                               output_scale=torch.ones(2))


# ---- scaled_fp8_quant ----------------------------------------------------------------------------


def static_codes(x, scale):
    """vLLM's static fp8 quantization in float64 terms: e4m3(clamp(f32(x * f32(1 / scale))))."""
    inverse = np.float32(1.0) / np.float32(scale)
    return e4m3_codes(np.clip(f32(f32(x) * inverse), -448.0, 448.0))


@pytest.mark.parametrize("device", DEVICES)
def test_scaled_fp8_quant_static_uses_the_given_scale(rng, device):
    x = randn(rng, (9, 64), torch.bfloat16, device, 100.0)  # some saturate at 448
    scale = torch.tensor([rng.uniform(0.1, 0.5)], dtype=torch.float32, device=device)

    out, scale_out = vllm.scaled_fp8_quant(x, scale)

    assert scale_out is scale
    assert out.dtype == FP8 and tuple(out.shape) == (9, 64) and out.device == x.device
    assert np.array_equal(bits(out), static_codes(f64(x), f64(scale)[0]))


@pytest.mark.parametrize("device", DEVICES)
def test_scaled_fp8_quant_dynamic_per_tensor_scale_is_amax_over_448(rng, device):
    x = randn(rng, (12, 48), torch.float16, device, rng.uniform(0.1, 300))

    out, scale = vllm.scaled_fp8_quant(x)

    assert scale.dtype == torch.float32 and tuple(scale.shape) == (1,)
    assert scale.device == x.device
    expected_scale = np.float32(np.abs(f64(x)).max()) / np.float32(448.0)  # an f32 division
    assert f64(scale)[0] == expected_scale
    assert np.array_equal(bits(out), static_codes(f64(x), expected_scale))
    assert np.abs(E4M3[bits(out)]).max() == 448.0  # amax lands on the top of the range


def test_scaled_fp8_quant_dynamic_zero_input_gives_zero_scale_and_zero_codes():
    out, scale = vllm.scaled_fp8_quant(torch.zeros((3, 8)))
    assert f64(scale).tolist() == [0.0]
    assert not bits(out).any()


def test_scaled_fp8_quant_pads_tokens_and_writes_a_given_output(rng):
    x = randn(rng, (5, 16), torch.bfloat16, "cpu", 10.0)
    scale = torch.tensor([0.03])
    out, _ = vllm.scaled_fp8_quant(x, scale, num_token_padding=8)
    assert tuple(out.shape) == (8, 16)  # max(num_token_padding, T) rows
    assert np.array_equal(bits(out)[:5], static_codes(f64(x), 0.03))
    out, _ = vllm.scaled_fp8_quant(x, scale, num_token_padding=2)
    assert tuple(out.shape) == (5, 16)

    given = torch.full((5, 16), 0x7F, dtype=torch.uint8).view(FP8)
    out, _ = vllm.scaled_fp8_quant(x, scale, output=given)
    assert out is given
    assert np.array_equal(bits(given), static_codes(f64(x), 0.03))


@pytest.mark.parametrize("with_ub", [False, True])
def test_scaled_fp8_quant_dynamic_per_token(rng, with_ub):
    x = randn(rng, (6, 32), torch.bfloat16, "cpu")
    x *= torch.from_numpy(rng.uniform(0.01, 500, (6, 1))).bfloat16()
    x[2] = 0  # an all-zero row: the floor scale
    ub = np.float32(np.median(np.abs(f64(x)).max(axis=1)))
    scale_ub = torch.tensor([ub]) if with_ub else None

    out, scales = vllm.scaled_fp8_quant(x, scale_ub=scale_ub, use_per_token_if_dynamic=True,
                                        num_token_padding=7)

    assert scales.dtype == torch.float32 and tuple(scales.shape) == (7, 1)
    amax = f32(np.abs(f64(x)).max(axis=1))
    if with_ub:
        amax = np.minimum(amax, ub)
    floor = np.float32(1.0) / np.float32(448.0 * 512.0)  # vLLM's smallest per-token scale
    want_scales = np.maximum(amax / np.float32(448.0), floor)
    assert np.array_equal(f64(scales)[:6, 0], want_scales.astype(np.float64))
    quotient = np.clip(f32(f64(x)) / want_scales[:, None], -448.0, 448.0)  # f32 division
    assert np.array_equal(bits(out)[:6], e4m3_codes(quotient))


def test_scaled_fp8_quant_reports_bad_arguments():
    x = torch.ones((4, 8))
    with pytest.raises(ValueError, match=r"input must be \[num_tokens, hidden_size\], got shape "
                                         r"\(2, 2, 8\)"):
        vllm.scaled_fp8_quant(x.reshape(2, 2, 8), torch.ones(1))
    with pytest.raises(ValueError, match=r"scale must have exactly one element, got shape \(2,\)"):
        vllm.scaled_fp8_quant(x, torch.ones(2))
    with pytest.raises(ValueError, match=r"num_token_padding cannot be used together with output"):
        vllm.scaled_fp8_quant(x, torch.ones(1), num_token_padding=8,
                              output=torch.empty((4, 8), dtype=FP8))
    with pytest.raises(TypeError, match=r"output must have dtype float8_e4m3fn, got bfloat16"):
        vllm.scaled_fp8_quant(x, torch.ones(1), output=torch.empty((4, 8), dtype=torch.bfloat16))


def test_upconvert_rows_find_their_requests_without_host_reads():
    """The row -> (request, position) map of cp_gather_and_upconvert_fp8_kv_cache (device tensor
    ops): starts out of order, an empty request sharing a start with a full one, a gap, and a
    range reaching past the rows (cut there, as on CUDA)."""
    lens = torch.tensor([3, 0, 2, 4], dtype=torch.int32)
    starts = torch.tensor([5, 1, 1, 8], dtype=torch.int32)
    request, position, valid = vllm._rows_to_requests(lens, starts, 10)
    want = {1: (2, 0), 2: (2, 1), 5: (0, 0), 6: (0, 1), 7: (0, 2), 8: (3, 0), 9: (3, 1)}
    for t in range(10):
        assert bool(valid[t]) == (t in want), t
        if t in want:
            assert (int(request[t]), int(position[t])) == want[t], t
