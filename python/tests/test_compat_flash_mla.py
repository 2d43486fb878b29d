"""mlakit.compat.flash_mla against FlashMLA's dense-decode contract (get_mla_metadata,
flash_mla_with_kvcache), on torch tensors. The expected values come from a float64 paged
attention written in this file; inputs are fresh random values from the seeded `rng` fixture
(conftest.py); cache slots past each request's length and blocks nobody owns hold NaN, so a key
read outside the contract shows.

GPU: the tests parametrized with DEVICES also run on torch CUDA tensors when torch sees a GPU
(and mlakit was built with CUDA); everything else is CPU only. Descales read on the device and
CUDA-graph capture: test_compat_flash_mla_cuda.py. Not tested anywhere: torch.compile.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="mlakit.compat needs torch")

import mlakit  # noqa: E402
from mlakit.compat import flash_mla  # noqa: E402

from compat_case import DEVICES, E4M3  # noqa: E402

FP8 = torch.float8_e4m3fn
D, DV, PAGE = 576, 512, 64  # FlashMLA's MLA decode: q/k head dim, v head dim, page size
H_Q = 8
# out: f32 accumulation over <= 256 keys plus the 16-bit output rounding (2^-8 relative);
# lse: f32 sums of 576 products.
OUT_TOL, LSE_TOL = 1.6e-2, 2e-4


# ---- float64 reference ---------------------------------------------------------------------------


def reference_decode(q, cache, block_table, seq_lens, dv, scale, causal):
    """FlashMLA's dense decode in float64. q: [b, s_q, h, d]; cache: [num_blocks, page, d]
    (dequantized values); V = the first dv values of a key. Query i of request b sees keys
    [0, n) with n = seq_lens[b] (causal=False) or seq_lens[b] - s_q + 1 + i (bottom-right).
    Returns out [b, s_q, h, dv] and lse [b, h, s_q]; a query without keys: out 0, lse +inf."""
    batch, s_q, heads, _ = q.shape
    page = cache.shape[1]
    out = np.zeros((batch, s_q, heads, dv))
    lse = np.full((batch, heads, s_q), np.inf)
    for b in range(batch):
        positions = np.arange(seq_lens[b])
        keys = cache[block_table[b, positions // page], positions % page]  # [seq_len, d]
        for i in range(s_q):
            n = max(0, seq_lens[b] - s_q + 1 + i) if causal else seq_lens[b]
            if n == 0:
                continue
            logits = scale * (q[b, i] @ keys[:n].T)  # [h, n]
            top = logits.max(axis=1, keepdims=True)
            weights = np.exp(logits - top)
            total = weights.sum(axis=1)
            out[b, i] = (weights @ keys[:n, :dv]) / total[:, None]
            lse[b, :, i] = np.log(total) + top[:, 0]
    return out, lse


# ---- inputs --------------------------------------------------------------------------------------


def paged_layout(rng, seq_lens, width, spare_blocks=2):
    """A block table over a permuted pool (columns a request does not need hold -1, which must
    not be read) and the pool size."""
    num_blocks = len(seq_lens) * width + spare_blocks
    table = rng.permutation(num_blocks)[:len(seq_lens) * width].reshape(len(seq_lens), width)
    for b, n in enumerate(seq_lens):
        table[b, -(-n // PAGE):] = -1
    return table.astype(np.int32), num_blocks


def unused_slots(num_blocks, block_table, seq_lens):
    """[num_blocks, PAGE] bool: slots no request's keys [0, seq_len) reach."""
    used = np.zeros((num_blocks, PAGE), dtype=bool)
    for b, n in enumerate(seq_lens):
        for p in range(n):
            used[block_table[b, p // PAGE], p % PAGE] = True
    return ~used


def to_device(device, *arrays):
    return [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays]


def f64(t):
    return t.detach().cpu().double().numpy()


def check_against_reference(out, lse, ref, ref_lse, q_dtype):
    out_np, lse_np = f64(out), f64(lse)
    assert out.dtype == q_dtype and tuple(out.shape) == ref.shape
    assert lse.dtype == torch.float32 and tuple(lse.shape) == ref_lse.shape
    assert lse.is_contiguous()
    np.testing.assert_allclose(out_np, ref, rtol=OUT_TOL, atol=OUT_TOL)
    empty = np.isposinf(ref_lse)
    assert np.array_equal(np.isposinf(lse_np), empty)  # no keys: +inf, FlashMLA's convention
    np.testing.assert_allclose(lse_np[~empty], ref_lse[~empty], rtol=LSE_TOL, atol=LSE_TOL)
    assert (out_np.transpose(0, 2, 1, 3)[empty] == 0).all()  # no keys: out 0


def bf16_case(rng, seq_lens, s_q, dtype, device, width=4):
    """q [b, s_q, H_Q, D] and a NaN-poisoned k_cache [num_blocks, PAGE, 1, D] of `dtype`."""
    block_table, num_blocks = paged_layout(rng, seq_lens, width)
    cache = rng.standard_normal((num_blocks, PAGE, D))
    cache[unused_slots(num_blocks, block_table, seq_lens)] = np.nan
    q = rng.standard_normal((len(seq_lens), s_q, H_Q, D))
    q_t = torch.from_numpy(q).to(dtype).to(device)
    cache_t = torch.from_numpy(cache).to(dtype).to(device).unsqueeze(2)  # h_kv = 1
    table_t, lens_t = to_device(device, block_table, np.asarray(seq_lens, np.int32))
    return q_t, cache_t, table_t, lens_t, block_table


# ---- get_mla_metadata ----------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_get_mla_metadata_gives_int32_tensors_of_flash_mlas_shapes(device):
    seq_lens = torch.tensor([5, 0, 130], dtype=torch.int32, device=device)
    tile_scheduler_metadata, num_splits = flash_mla.get_mla_metadata(seq_lens, 2 * H_Q, 1)
    assert tile_scheduler_metadata.dtype == torch.int32 == num_splits.dtype
    assert tile_scheduler_metadata.dim() == 2 and tile_scheduler_metadata.shape[1] == 8
    assert tuple(num_splits.shape) == (4,)  # batch_size + 1
    assert tile_scheduler_metadata.device == num_splits.device == seq_lens.device


def test_get_mla_metadata_refuses_more_than_one_kv_head_and_sparse():
    seq_lens = torch.tensor([5], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"h_kv \(num_heads_k\) must be 1 .* got 2"):
        flash_mla.get_mla_metadata(seq_lens, H_Q, 2)
    with pytest.raises(NotImplementedError, match=r"topk \(sparse attention\) is not supported"):
        flash_mla.get_mla_metadata(seq_lens, H_Q, 1, topk=2048)
    with pytest.raises(TypeError, match=r"cache_seqlens must have dtype int32, got int64"):
        flash_mla.get_mla_metadata(seq_lens.long(), H_Q, 1)


# ---- flash_mla_with_kvcache: bf16 / fp16 ---------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("s_q", [1, 2, 4])
@pytest.mark.parametrize("lengths", ["long", "short"])
def test_decode_matches_the_float64_reference(rng, device, causal, s_q, lengths):
    # long: 0 or >= s_q keys (bottom-right causal is mlakit's own masking); short: a request
    # with fewer keys than queries (causal: its first queries see no keys at all).
    seq_lens = [0, 1 + s_q, 2 * PAGE - 1, 4 * PAGE]
    if lengths == "short":
        seq_lens[1] = max(1, s_q - 1)
    q, k_cache, table, lens, block_table = bf16_case(rng, seq_lens, s_q, torch.bfloat16, device)
    metadata = flash_mla.get_mla_metadata(lens, s_q * H_Q, 1)

    out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache, table, lens, DV, *metadata,
                                                causal=causal)

    ref, ref_lse = reference_decode(f64(q), f64(k_cache[:, :, 0]), block_table, seq_lens, DV,
                                    D ** -0.5, causal)  # default scale: 1 / sqrt(q's head dim)
    check_against_reference(out, lse, ref, ref_lse, torch.bfloat16)
    assert np.isposinf(f64(lse)[0]).all() and (f64(out)[0] == 0).all()  # 0 keys


@pytest.mark.parametrize("softmax_scale", [0.02, 0.09])
def test_decode_uses_the_given_softmax_scale_with_fp16(rng, softmax_scale):
    seq_lens, s_q = [37, 150], 3
    q, k_cache, table, lens, block_table = bf16_case(rng, seq_lens, s_q, torch.float16, "cpu")
    metadata = flash_mla.get_mla_metadata(lens, s_q * H_Q, 1)

    out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache, table, lens, DV, *metadata,
                                                softmax_scale=softmax_scale, causal=False)

    ref, ref_lse = reference_decode(f64(q), f64(k_cache[:, :, 0]), block_table, seq_lens, DV,
                                    softmax_scale, False)
    check_against_reference(out, lse, ref, ref_lse, torch.float16)


def test_decode_allocates_new_outputs_and_metadata_serve_several_layers(rng):
    seq_lens, s_q = [70, 3], 2
    metadata = None
    for _ in range(2):  # two layers of one step: one get_mla_metadata
        q, k_cache, table, lens, block_table = bf16_case(rng, seq_lens, s_q, torch.bfloat16,
                                                         "cpu")
        metadata = metadata or flash_mla.get_mla_metadata(lens, s_q * H_Q, 1)
        out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache, table, lens, DV, *metadata,
                                                    causal=True)
        again, _ = flash_mla.flash_mla_with_kvcache(q, k_cache, table, lens, DV, *metadata,
                                                    causal=True)
        assert again.data_ptr() != out.data_ptr()  # a fresh output per call
        assert torch.equal(again, out)
        ref, ref_lse = reference_decode(f64(q), f64(k_cache[:, :, 0]), block_table, seq_lens, DV,
                                        D ** -0.5, True)
        check_against_reference(out, lse, ref, ref_lse, torch.bfloat16)


# ---- flash_mla_with_kvcache: fp8 -----------------------------------------------------------------


def fp8_codes(rng, shape, spread):
    """Random finite e4m3fn codes (torch's rounding of normal values times `spread`)."""
    values = torch.from_numpy(rng.standard_normal(shape) * spread).float()
    return values.to(FP8)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("per_request", [False, True])
def test_fp8_q_and_cache_are_dequantized_with_the_descales(rng, per_request, causal):
    # request 2 has fewer keys than queries: decoded query by query (its descales follow it)
    seq_lens, s_q = [90, 0, 1, 200], 2
    batch = len(seq_lens)
    block_table, num_blocks = paged_layout(rng, seq_lens, 4)
    cache = fp8_codes(rng, (num_blocks, PAGE, 1, D), 16.0)
    unused = torch.from_numpy(unused_slots(num_blocks, block_table, seq_lens))
    cache.view(torch.uint8)[:, :, 0][unused] = 0x7F  # e4m3 NaN
    q = fp8_codes(rng, (len(seq_lens), s_q, H_Q, D), 16.0)
    if per_request:  # FlashMLA documents descales of one value per request
        descale_q = torch.from_numpy(rng.uniform(0.02, 0.1, batch)).float()
        descale_k = torch.from_numpy(rng.uniform(0.02, 0.1, batch)).float()
    else:
        descale_q = torch.tensor([rng.uniform(0.02, 0.1)], dtype=torch.float32)
        descale_k = torch.tensor([rng.uniform(0.02, 0.1)], dtype=torch.float32)
    table, lens = to_device("cpu", block_table, np.asarray(seq_lens, np.int32))
    metadata = flash_mla.get_mla_metadata(lens, s_q * H_Q, 1)

    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, DV, *metadata,
                                                causal=causal, descale_q=descale_q,
                                                descale_k=descale_k)

    q_codes = q.view(torch.uint8).numpy()
    k_codes = cache[:, :, 0].view(torch.uint8).numpy()
    dq = np.broadcast_to(f64(descale_q), (batch,))
    dk = np.broadcast_to(f64(descale_k), (batch,))
    for b in range(batch):  # each request with its own descales
        ref, ref_lse = reference_decode(E4M3[q_codes[b:b + 1]] * dq[b], E4M3[k_codes] * dk[b],
                                        block_table[b:b + 1], seq_lens[b:b + 1], DV, D ** -0.5,
                                        causal)
        check_against_reference(out[b:b + 1], lse[b:b + 1], ref, ref_lse, torch.bfloat16)


def ds_mla_cache(rng, num_blocks, unused):
    """A hand-built fp8_ds_mla cache (uint8 [num_blocks, PAGE, 1, 656]: 512 e4m3 codes, four f32
    tile scales, 64 bf16 rope values) and its float64 values [num_blocks, PAGE, 576]; `unused`
    slots hold NaN codes and a NaN rope."""
    codes = fp8_codes(rng, (num_blocks, PAGE, 512), 30.0).view(torch.uint8).numpy().copy()
    scales = rng.uniform(0.01, 0.05, (num_blocks, PAGE, 4)).astype(np.float32)
    rope = torch.from_numpy(rng.standard_normal((num_blocks, PAGE, 64))).bfloat16()
    rope[torch.from_numpy(unused)] = float("nan")
    codes[unused] = 0x7F
    entries = np.concatenate([codes, scales.view(np.uint8), rope.view(torch.uint8).numpy()],
                             axis=-1)
    values = np.concatenate([E4M3[codes] * np.repeat(scales.astype(np.float64), 128, axis=-1),
                             rope.double().numpy()], axis=-1)
    return torch.from_numpy(entries).unsqueeze(2), values


def test_fp8_ds_mla_cache_with_is_fp8_kvcache(rng):
    seq_lens, s_q = [130, 5, 0], 2
    block_table, num_blocks = paged_layout(rng, seq_lens, 3)
    cache, values = ds_mla_cache(rng, num_blocks, unused_slots(num_blocks, block_table, seq_lens))
    q = torch.from_numpy(rng.standard_normal((3, s_q, H_Q, D))).bfloat16()
    table, lens = to_device("cpu", block_table, np.asarray(seq_lens, np.int32))
    metadata = flash_mla.get_mla_metadata(lens, s_q * H_Q, 1, is_fp8_kvcache=True)

    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, DV, *metadata,
                                                causal=False, is_fp8_kvcache=True)

    ref, ref_lse = reference_decode(f64(q), values, block_table, seq_lens, DV, D ** -0.5, False)
    check_against_reference(out, lse, ref, ref_lse, torch.bfloat16)


# ---- errors --------------------------------------------------------------------------------------


def test_flash_mla_with_kvcache_reports_what_it_cannot_serve(rng):
    seq_lens, s_q = [10, 20], 1
    q, k_cache, table, lens, _ = bf16_case(rng, seq_lens, s_q, torch.bfloat16, "cpu")
    metadata = flash_mla.get_mla_metadata(lens, s_q * H_Q, 1)
    call = flash_mla.flash_mla_with_kvcache

    with pytest.raises(ValueError, match=r"h_kv \(num_heads_k\) must be 1 .* got 2"):
        call(q, k_cache.expand(-1, -1, 2, -1), table, lens, DV, *metadata)
    with pytest.raises(NotImplementedError, match=r"indices \(sparse attention\) is not supported"):
        call(q, k_cache, table, lens, DV, *metadata, indices=torch.zeros((2, 1, 64)))
    with pytest.raises(ValueError, match=r"num_splits must be \[batch_size \+ 1\] = \[3\]"):
        call(q, k_cache, table, lens, DV, metadata[0], metadata[1][:2])
    with pytest.raises(TypeError, match=r"q and k_cache must have one dtype"):
        call(q, k_cache.half(), table, lens, DV, *metadata)
    with pytest.raises(ValueError, match=r"descale_q / descale_k apply only to an fp8"):
        call(q, k_cache, table, lens, DV, *metadata, descale_q=torch.ones(1))
    with pytest.raises(ValueError, match=r"an fp8 q and k_cache need descale_q and descale_k"):
        call(q.to(FP8), k_cache.to(FP8), table, lens, DV, *metadata, descale_q=torch.ones(1))
    with pytest.raises(ValueError, match=r"descale_k must have 1 or batch_size = 2 values, got "
                                         r"shape \(3,\)"):
        call(q.to(FP8), k_cache.to(FP8), table, lens, DV, *metadata, descale_q=torch.ones(1),
             descale_k=torch.ones(3))
    with pytest.raises(TypeError, match=r"q \(with an fp8 k_cache\) must have dtype float8_e4m3fn"):
        call(q, k_cache.to(FP8), table, lens, DV, *metadata, descale_q=torch.ones(1),
             descale_k=torch.ones(1))
    with pytest.raises(ValueError, match=r"is_fp8_kvcache needs 656-byte fp8_ds_mla entries"):
        call(q, k_cache, table, lens, DV, *metadata, is_fp8_kvcache=True)
