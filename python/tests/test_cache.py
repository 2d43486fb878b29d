"""Cache write and gathers from NumPy, bit-exact against NumPy references (the fp8 codes from the
independent encoder of reference.py)."""

import ml_dtypes
import numpy as np
import pytest

import mlakit
from reference import E4M3_VALUES, e4m3_encode

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn
ACT_DTYPES = [np.float32, np.float16, BF16]
FLT_MIN = np.float32(np.finfo(np.float32).tiny)  # fp8_ds_mla: smallest tile scale


def bits(a):
    """The raw bits of an array (exact comparisons that see NaN payloads and -0)."""
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def nan_filled(shape, dtype):
    return np.full(shape, np.nan, dtype=np.float32).astype(dtype)


def distinct_slots(rng, count, num_slots):
    return rng.permutation(num_slots)[:count].astype(np.int64)


def test_e4m3_encoder_agrees_with_ml_dtypes_in_range(rng):
    # Reference of the reference: below 448 both are plain round-to-nearest-even.
    x = np.concatenate([rng.standard_normal(4000) * 50, rng.standard_normal(1000) * 1e-3,
                        [0.0, -0.0, 448.0, -448.0, 2.0**-9, 2.0**-10]]).astype(np.float32)
    assert np.array_equal(e4m3_encode(x), x.astype(FP8).view(np.uint8))
    assert e4m3_encode(np.float32(1000.0)) == 0x7E  # saturates to 448
    assert e4m3_encode(np.float32(-1e9)) == 0xFE
    assert e4m3_encode(np.float32(np.nan)) == 0x7F


@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_concat_and_cache_mla_auto_copies_bits(rng, dtype):
    L, R, num_blocks, block_size, T, padded = 32, 16, 6, 4, 7, 9
    wide = rng.standard_normal((padded, L + 8)).astype(dtype)
    kv_c = wide[:, :L]  # [T', L], row stride L + 8
    k_pe = rng.standard_normal((padded, 1, R)).astype(dtype)  # vLLM's unsqueezed [T', 1, R]
    slots = distinct_slots(rng, T, num_blocks * block_size)
    slots[2] = -1  # padding token: skipped
    cache = nan_filled((num_blocks, block_size, L + R), dtype)

    expected = cache.copy()
    for t, slot in enumerate(slots):
        if slot >= 0:
            expected[slot // block_size, slot % block_size] = np.concatenate([kv_c[t], k_pe[t, 0]])

    mlakit.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", 1.0)
    assert np.array_equal(bits(cache), bits(expected))


@pytest.mark.parametrize("cache_dtype", [np.uint8, FP8])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_concat_and_cache_mla_fp8_encodes_x_over_scale(rng, dtype, cache_dtype):
    L, R, num_blocks, block_size, T = 24, 8, 5, 4, 9
    scale = np.float32(0.37)
    kv_c = (rng.standard_normal((T, L)) * 60).astype(dtype)  # |x| > 448 * 0.37 saturates
    kv_c[0, :4] = [0.0, -0.0, 1e-4, -3e-3]  # zeros and subnormal quotients
    k_pe = (rng.standard_normal((T, R)) * 60).astype(dtype)
    slots = distinct_slots(rng, T, num_blocks * block_size)
    cache = np.full((num_blocks, block_size, L + R), 0xFF, dtype=np.uint8)  # poison: fp8 NaN

    expected = cache.copy()
    for t, slot in enumerate(slots):
        quotient = np.concatenate([kv_c[t], k_pe[t]]).astype(np.float32) / scale  # f32 division
        expected[slot // block_size, slot % block_size] = e4m3_encode(quotient)

    target = cache.view(cache_dtype)
    mlakit.concat_and_cache_mla(kv_c, k_pe, target, slots, "fp8", float(scale))
    assert np.array_equal(cache, expected)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_concat_and_cache_mla_fp8_ds_mla_layout(rng, dtype):
    L, R, num_blocks, block_size, T = 512, 64, 3, 2, 4
    kv_c = (rng.standard_normal((T, L)) * rng.uniform(0.01, 100, (T, 1))).astype(dtype)
    kv_c[1, 128:256] = 0  # an all-zero tile: scale FLT_MIN, codes 0
    k_pe = rng.standard_normal((T, R)).astype(dtype)
    slots = np.array([5, 0, 3, -1], dtype=np.int64)
    cache = np.full((num_blocks, block_size, 656), 0xFF, dtype=np.uint8)

    expected = cache.copy()
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        entry = np.empty(656, dtype=np.uint8)
        x = kv_c[t].astype(np.float32)
        for tile in range(4):
            values = x[tile * 128:(tile + 1) * 128]
            tile_scale = np.maximum(np.abs(values).max() / np.float32(448.0), FLT_MIN)
            entry[tile * 128:(tile + 1) * 128] = e4m3_encode(values / tile_scale)
            entry[512 + 4 * tile:516 + 4 * tile] = np.float32(tile_scale).reshape(1).view(np.uint8)
        entry[528:656] = k_pe[t].view(np.uint8)
        expected[slot // block_size, slot % block_size] = entry

    mlakit.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla", 1.0)
    assert np.array_equal(cache, expected)


def make_gather_batch(rng, num_blocks, block_size, table_width):
    """Three requests (one empty) with token-granular starts; returns the index arrays."""
    block_table = rng.permutation(num_blocks)[:3 * table_width].reshape(3, table_width)
    seq_starts = np.array([0, 3, 5], dtype=np.int32)
    lens = np.array([5, 0, 6], dtype=np.int32)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    token_to_seq = np.repeat(np.arange(3), lens).astype(np.int32)
    return block_table.astype(np.int32), seq_starts, lens, cu, token_to_seq


def gathered_entries(cache, block_table, seq_starts, lens):
    """Rows of the gather, read from the cache by (block, offset)."""
    block_size = cache.shape[1]
    rows = []
    for b in range(len(lens)):
        for p in range(lens[b]):
            pos = seq_starts[b] + p
            rows.append(cache[block_table[b, pos // block_size], pos % block_size])
    return np.stack(rows)


@pytest.mark.parametrize("dst_dtype", [np.float32, BF16])
def test_gather_and_maybe_dequant_cache_auto(rng, dst_dtype):
    num_blocks, block_size, W = 16, 4, 40
    cache = rng.standard_normal((num_blocks, block_size, W)).astype(dst_dtype)
    block_table, starts, lens, cu, token_to_seq = make_gather_batch(rng, num_blocks, block_size, 4)
    num_tokens = int(cu[-1])
    dst = nan_filled((num_tokens + 2, W), dst_dtype)  # two rows past num_tokens stay NaN

    mlakit.gather_and_maybe_dequant_cache(cache, dst, block_table, cu, token_to_seq, num_tokens,
                                          "auto", 1.0, seq_starts=starts)
    expected = nan_filled(dst.shape, dst_dtype)
    expected[:num_tokens] = gathered_entries(cache, block_table, starts, lens)
    assert np.array_equal(bits(dst), bits(expected))


@pytest.mark.parametrize("dst_dtype", [np.float32, np.float16, BF16])
def test_gather_and_maybe_dequant_cache_fp8_multiplies_by_scale(rng, dst_dtype):
    num_blocks, block_size, W = 16, 4, 24
    codes = rng.integers(0, 0x7F, (num_blocks, block_size, W)).astype(np.uint8)  # no NaN codes
    codes |= (rng.integers(0, 2, codes.shape) * 0x80).astype(np.uint8)  # random signs
    scale = np.float32(0.37)
    block_table, starts, lens, cu, token_to_seq = make_gather_batch(rng, num_blocks, block_size, 4)
    num_tokens = int(cu[-1])
    dst = nan_filled((num_tokens, W), dst_dtype)

    mlakit.gather_and_maybe_dequant_cache(codes, dst, block_table, cu, token_to_seq, num_tokens,
                                          "fp8_e4m3", float(scale), seq_starts=starts)
    picked = gathered_entries(codes, block_table, starts, lens)
    expected = (E4M3_VALUES[picked].astype(np.float32) * scale).astype(dst_dtype)  # f32 product
    assert np.array_equal(bits(dst), bits(expected))


@pytest.mark.parametrize("dtype", [np.uint8, BF16])
def test_cp_gather_cache_copies_raw_entries(rng, dtype):
    num_blocks, block_size, W = 16, 4, 20
    cache = rng.integers(0, 255, (num_blocks, block_size, W)).astype(np.uint8)
    cache = cache if dtype == np.uint8 else rng.standard_normal(cache.shape).astype(dtype)
    block_table, starts, lens, cu, _ = make_gather_batch(rng, num_blocks, block_size, 4)
    dst = np.zeros((int(cu[-1]), W), dtype=dtype)

    mlakit.cp_gather_cache(cache, dst, block_table, cu, 3, seq_starts=starts)
    assert np.array_equal(bits(dst), bits(gathered_entries(cache, block_table, starts, lens)))


def test_cp_gather_cache_without_starts_begins_at_zero(rng):
    num_blocks, block_size, W = 16, 4, 8
    cache = rng.standard_normal((num_blocks, block_size, W)).astype(np.float32)
    block_table, _, lens, cu, _ = make_gather_batch(rng, num_blocks, block_size, 4)
    dst = np.zeros((int(cu[-1]), W), dtype=np.float32)
    mlakit.cp_gather_cache(cache, dst, block_table, cu, 3)
    zero = np.zeros(3, dtype=np.int32)
    assert np.array_equal(dst, gathered_entries(cache, block_table, zero, lens))


def test_slot_past_the_cache_is_a_value_error(rng):
    cache = np.zeros((2, 4, 12), dtype=np.float32)
    kv_c = np.zeros((1, 8), dtype=np.float32)
    k_pe = np.zeros((1, 4), dtype=np.float32)
    with pytest.raises(ValueError, match=r"concat_and_cache_mla: token 0 has slot 8") as info:
        mlakit.concat_and_cache_mla(kv_c, k_pe, cache, np.array([8], dtype=np.int64), "auto", 1.0)
    assert info.value.status == "out_of_range"
    assert not cache.any()
