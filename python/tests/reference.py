"""Independent NumPy references for the tests: an e4m3 encoder written from the OCP format
definition, and fp64 attention (MQA decode, MHA prefill, LSE merge, non-absorbed MLA)."""

import numpy as np

E4M3_MAX = 448.0  # largest finite e4m3fn value: 1.75 * 2^8
E4M3_NAN = 0x7F


def e4m3_decode_table():
    """float64 value of every e4m3fn code: sign, 4 exponent bits (bias 7), 3 mantissa bits;
    exponent 0 is subnormal (m/8 * 2^-6); 0x7f and 0xff are NaN (no infinities)."""
    values = np.empty(256, dtype=np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exponent = (code >> 3) & 0xF
        mantissa = code & 0x7
        if exponent == 0xF and mantissa == 0x7:
            values[code] = np.nan
        elif exponent == 0:
            values[code] = sign * mantissa / 8.0 * 2.0**-6
        else:
            values[code] = sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)
    return values


E4M3_VALUES = e4m3_decode_table()
_POSITIVE = E4M3_VALUES[:0x7F]  # codes 0..0x7e: increasing finite magnitudes


def e4m3_encode(x):
    """Saturating round-to-nearest-even e4m3fn codes (uint8) of float values: |x| > 448 -> 448,
    NaN -> 0x7f."""
    x = np.asarray(x, dtype=np.float64)
    magnitude = np.minimum(np.abs(x), E4M3_MAX)
    hi = np.clip(np.searchsorted(_POSITIVE, magnitude, side="left"), 0, 0x7E)
    lo = np.maximum(hi - 1, 0)
    d_lo = magnitude - _POSITIVE[lo]
    d_hi = _POSITIVE[hi] - magnitude
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))  # ties: even mantissa
    code = np.where(take_hi, hi, lo).astype(np.uint8)
    code = np.where(np.signbit(x), code | 0x80, code).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(E4M3_NAN), code).astype(np.uint8)


def round_to(x, dtype):
    """x (float64) rounded to `dtype` and back to float64."""
    return np.asarray(x, dtype=np.float64).astype(dtype).astype(np.float64)


def merge_attn_states(prefix, prefix_lse, suffix, suffix_lse):
    """fp64 LSE merge. prefix, suffix: [T, H, D]; lses: [H, T]. +inf counts as -inf; both empty
    gives 0 and -inf."""
    p = np.where(prefix_lse == np.inf, -np.inf, prefix_lse).astype(np.float64).T  # [T, H]
    s = np.where(suffix_lse == np.inf, -np.inf, suffix_lse).astype(np.float64).T
    m = np.maximum(p, s)
    empty = np.isneginf(m)
    m_safe = np.where(empty, 0.0, m)
    wp = np.where(empty, 0.0, np.exp(p - m_safe))
    ws = np.where(empty, 0.0, np.exp(s - m_safe))
    total = wp + ws
    denom = np.where(empty, 1.0, total)
    out = (prefix * (wp / denom)[..., None] + suffix * (ws / denom)[..., None])
    lse = np.where(empty, -np.inf, np.log(np.where(empty, 1.0, total)) + m_safe)
    return out, lse.T


def attend(q, k, v, scale, visible):
    """Softmax attention of one head group. q: [Q, D], k: [K, D], v: [K, Dv], visible: [Q, K]
    bool. Returns (out [Q, Dv], lse [Q]) with out 0 and lse -inf for rows without keys."""
    logits = np.where(visible, scale * (q @ k.T), -np.inf)
    m = logits.max(axis=1, initial=-np.inf)
    empty = np.isneginf(m)
    w = np.where(visible, np.exp(logits - np.where(empty, 0.0, m)[:, None]), 0.0)
    total = w.sum(axis=1)
    out = (w @ v) / np.where(empty, 1.0, total)[:, None]
    lse = np.where(empty, -np.inf, np.log(np.where(empty, 1.0, total)) + np.where(empty, 0.0, m))
    return out, lse


def causal_mask(num_q, num_k):
    """Bottom-right causal: query i sees keys [0, num_k - num_q + i]."""
    return np.arange(num_k)[None, :] <= (num_k - num_q + np.arange(num_q))[:, None]


def mha_prefill(q, k_nope, k_pe, v, cu_q, cu_k, scale, causal):
    """fp64 varlen MHA. q: [T, N, P+R]; k_nope: [S, N, P]; k_pe: [S, R]; v: [S, N, V].
    Returns out [T, N, V], lse [N, T]."""
    tokens, heads = q.shape[0], q.shape[1]
    out = np.zeros((tokens, heads, v.shape[2]))
    lse = np.full((heads, tokens), -np.inf)
    for b in range(len(cu_q) - 1):
        qs, qe, ks, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        visible = causal_mask(qe - qs, ke - ks) if causal else np.ones((qe - qs, ke - ks), bool)
        for n in range(heads):
            k = np.concatenate([k_nope[ks:ke, n], k_pe[ks:ke]], axis=1)
            o, l = attend(q[qs:qe, n], k, v[ks:ke, n], scale, visible)
            out[qs:qe, n] = o
            lse[n, qs:qe] = l
    return out, lse


def paged_entries(cache_values, block_table, b, length):
    """[length, W] float64 entries of request b read through its block-table row."""
    block_size = cache_values.shape[1]
    positions = np.arange(length)
    blocks = block_table[b, positions // block_size]
    return cache_values[blocks, positions % block_size]


def mqa_decode(q, cache_values, block_table, seq_lens, kv_lora_rank, scale):
    """fp64 latent MQA. q: [B, s_q, N, L+R]; cache_values: [num_blocks, block_size, L+R] float64
    (already dequantized). Returns out [B, s_q, N, L], lse [B, s_q, N]."""
    batch, s_q, heads, _ = q.shape
    out = np.zeros((batch, s_q, heads, kv_lora_rank))
    lse = np.full((batch, s_q, heads), -np.inf)
    for b in range(batch):
        entries = paged_entries(cache_values, block_table, b, seq_lens[b])
        visible = causal_mask(s_q, seq_lens[b])
        for n in range(heads):
            o, l = attend(q[b, :, n], entries, entries[:, :kv_lora_rank], scale, visible)
            out[b, :, n] = o
            lse[b, :, n] = l
    return out, lse
