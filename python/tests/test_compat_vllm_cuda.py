"""mlakit.compat.vllm on CUDA tensors with scales as CUDA tensors (read by the kernels): each
function is captured in a torch.cuda.graph, then the captured input tensors get NEW values and
the scale tensor a NEW value (fill_), the graph is replayed, and the replay's outputs must equal,
bit for bit, a fresh eager call on those new values. A host read or synchronisation inside a
function makes the capture itself fail. Eager CUDA results against the float64 references are in
test_compat_vllm.py (its DEVICES include CUDA on a GPU machine).

Skipped without a GPU (the whole module). To run on a GPU machine, after a CUDA build:
  cmake --preset cuda && cmake --build --preset cuda
  MLAKIT_LIBRARY=$PWD/build/cuda/src/capi/libmlakit_c.so PYTHONPATH=python \\
      python -m pytest -q python/tests/test_compat_vllm_cuda.py python/tests/test_compat_vllm.py
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="mlakit.compat needs torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

import mlakit  # noqa: E402
from mlakit.compat import vllm  # noqa: E402

if not mlakit.build_info()["cuda"]:
    pytest.skip("mlakit was built without CUDA", allow_module_level=True)

FP8 = torch.float8_e4m3fn
DEV = "cuda"


def bits(t):
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]
    return t.detach().cpu().contiguous().view(view).numpy()


def same_bits(a, b):
    """Equal bits, any two NaNs equal (fp8 NaN codes 0x7f / 0xff, float NaNs)."""
    x, y = bits(a), bits(b)
    if a.dtype == FP8 or a.dtype == torch.uint8:
        return np.array_equal(np.where((x & 0x7F) == 0x7F, 0x7F, x),
                              np.where((y & 0x7F) == 0x7F, 0x7F, y))
    fx, fy = a.detach().cpu().float().numpy(), b.detach().cpu().float().numpy()
    return np.array_equal(fx, fy, equal_nan=True) and np.array_equal(
        np.where(np.isnan(fx), 0, x), np.where(np.isnan(fy), 0, y))


def capture(fn):
    """fn() warmed up on a side stream, then captured; returns (graph, what the capture returned)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result


def new_scale(rng):
    return float(np.float32(np.ldexp(rng.uniform(1.0, 2.0), int(rng.integers(-6, 3)))))


def randn(rng, shape, dtype, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape) * scale).to(dtype).to(DEV)


def test_concat_and_cache_mla_graph_follows_new_inputs_and_scale(rng):
    tokens, L, R, blocks, block_size = 12, 64, 16, 4, 8
    kv_c, k_pe = randn(rng, (tokens, L), torch.bfloat16), randn(rng, (tokens, 1, R), torch.bfloat16)
    slots = torch.from_numpy(rng.permutation(blocks * block_size)[:tokens]).to(DEV)
    slots[2] = -1
    cache = torch.full((blocks, block_size, L + R), 0xFF, dtype=torch.uint8, device=DEV)
    scale = torch.tensor([new_scale(rng)], dtype=torch.float32, device=DEV)
    graph, _ = capture(lambda: vllm.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8", scale))
    for _ in range(3):
        kv_c.copy_(randn(rng, (tokens, L), torch.bfloat16, 30.0))
        k_pe.copy_(randn(rng, (tokens, 1, R), torch.bfloat16, 30.0))
        scale.fill_(new_scale(rng))
        cache.fill_(0xFF)
        graph.replay()
        expected = torch.full_like(cache, 0xFF)
        vllm.concat_and_cache_mla(kv_c.clone(), k_pe.clone(), expected, slots, "fp8",
                                  scale.clone())
        torch.cuda.synchronize()
        assert same_bits(cache, expected)
        # and the host-float path (a different code path: the value read on the host)
        by_float = torch.full_like(cache, 0xFF)
        vllm.concat_and_cache_mla(kv_c, k_pe, by_float, slots, "fp8", float(scale.item()))
        assert same_bits(cache, by_float)
    mlakit.check_device_errors(DEV)


def test_gather_and_maybe_dequant_cache_graph_follows_new_inputs_and_scale(rng):
    blocks, block_size, W = 8, 4, 40
    codes = torch.from_numpy(rng.integers(0, 0x7F, (blocks, block_size, W)).astype(np.uint8)).to(DEV)
    table = torch.tensor([[3, 1, 6], [0, 7, 2]], dtype=torch.int32, device=DEV)
    cu = torch.tensor([0, 7, 12], dtype=torch.int32, device=DEV)
    tts = torch.tensor([0] * 7 + [1] * 5, dtype=torch.int32, device=DEV)
    starts = torch.tensor([2, 1], dtype=torch.int32, device=DEV)
    dst = torch.full((14, W), float("nan"), dtype=torch.bfloat16, device=DEV)
    scale = torch.tensor([new_scale(rng)], dtype=torch.float32, device=DEV)
    graph, _ = capture(lambda: vllm.gather_and_maybe_dequant_cache(
        codes, dst, table, cu, tts, 12, "fp8", scale, starts))
    for _ in range(3):
        codes.copy_(torch.from_numpy(rng.integers(0, 0x7F, codes.shape).astype(np.uint8)))
        scale.fill_(new_scale(rng))
        dst.fill_(float("nan"))
        graph.replay()
        expected = torch.full_like(dst, float("nan"))
        vllm.gather_and_maybe_dequant_cache(codes.clone(), expected, table, cu, tts, 12, "fp8",
                                            scale.clone(), starts)
        torch.cuda.synchronize()
        assert same_bits(dst, expected)
        assert torch.isnan(dst[12:]).all()
    mlakit.check_device_errors(DEV)


def test_cp_gather_cache_graph_follows_new_lengths_starts_and_bytes(rng):
    """cu_seq_lens / seq_starts stay on the device: after new cumulative lengths, new starts and new
    cache bytes, a replay equals an eager call bit for bit, and dst rows past the last request keep
    their values."""
    blocks, block_size, W, rows = 10, 4, 24, 20
    cache = torch.from_numpy(rng.integers(0, 256, (blocks, block_size, W)).astype(np.uint8)).to(DEV)
    table = torch.from_numpy(rng.permutation(blocks)[:8].reshape(2, 4).astype(np.int32)).to(DEV)
    cu = torch.tensor([0, 6, 9], dtype=torch.int32, device=DEV)
    starts = torch.tensor([1, 4], dtype=torch.int32, device=DEV)
    dst = torch.full((rows, W), 0xAB, dtype=torch.uint8, device=DEV)
    graph, _ = capture(lambda: vllm.cp_gather_cache(cache, dst, table, cu, 2, starts))
    for new_cu, new_starts in (([0, 16, 16], [0, 3]), ([0, 1, 13], [15, 2]), ([0, 0, 0], [7, 7])):
        cache.copy_(torch.from_numpy(rng.integers(0, 256, cache.shape).astype(np.uint8)))
        cu.copy_(torch.tensor(new_cu, dtype=torch.int32))
        starts.copy_(torch.tensor(new_starts, dtype=torch.int32))
        dst.fill_(0xAB)
        graph.replay()
        want = torch.full_like(dst, 0xAB)
        vllm.cp_gather_cache(cache.clone(), want, table, cu.clone(), 2, starts.clone())
        torch.cuda.synchronize()
        assert torch.equal(dst, want)
        assert (dst[new_cu[-1]:] == 0xAB).all()
        # the rows against the cache itself: request b's positions starts[b] + i
        host_cache, host_table = cache.cpu().numpy(), table.cpu().numpy()
        for b in range(2):
            for i in range(new_cu[b + 1] - new_cu[b]):
                pos = new_starts[b] + i
                entry = host_cache[host_table[b, pos // block_size], pos % block_size]
                assert np.array_equal(dst[new_cu[b] + i].cpu().numpy(), entry)
    mlakit.check_device_errors(DEV)


@pytest.mark.parametrize("mode", ["static", "dynamic_per_tensor", "dynamic_per_token"])
def test_scaled_fp8_quant_graph_follows_new_inputs_and_scale(rng, mode):
    x = randn(rng, (9, 64), torch.float16, 50.0)
    scale = torch.tensor([new_scale(rng)], dtype=torch.float32, device=DEV)
    scale_ub = torch.tensor([40.0], dtype=torch.float32, device=DEV)

    def call(inp, s):
        if mode == "static":
            return vllm.scaled_fp8_quant(inp, s)
        if mode == "dynamic_per_tensor":
            return vllm.scaled_fp8_quant(inp)
        return vllm.scaled_fp8_quant(inp, use_per_token_if_dynamic=True, scale_ub=s)

    graph, (out, out_scale) = capture(lambda: call(x, scale if mode == "static" else scale_ub))
    for _ in range(3):
        x.copy_(randn(rng, (9, 64), torch.float16, rng.uniform(0.1, 300)))
        scale.fill_(new_scale(rng))
        scale_ub.fill_(float(rng.uniform(1.0, 100.0)))
        graph.replay()
        want, want_scale = call(x.clone(), (scale if mode == "static" else scale_ub).clone())
        torch.cuda.synchronize()
        assert same_bits(out, want)
        assert same_bits(out_scale, want_scale)
    if mode == "dynamic_per_tensor":  # the device scale is amax / 448 in f32
        expected = np.float32(np.abs(x.float().cpu().numpy()).max()) / np.float32(448.0)
        assert out_scale.item() == expected
    mlakit.check_device_errors(DEV)


def test_merge_attn_states_with_output_scale_graph_follows_new_inputs_and_scale(rng):
    tokens, heads, dim = 7, 4, 32
    prefix, suffix = randn(rng, (tokens, heads, dim), torch.float32), randn(
        rng, (tokens, heads, dim), torch.float32)
    p_lse, s_lse = randn(rng, (heads, tokens), torch.float32, 3.0), randn(
        rng, (heads, tokens), torch.float32, 3.0)
    out = torch.empty((tokens, heads, dim), dtype=FP8, device=DEV)
    out_lse = torch.empty((heads, tokens), dtype=torch.float32, device=DEV)
    scale = torch.tensor([new_scale(rng)], dtype=torch.float32, device=DEV)
    graph, _ = capture(lambda: vllm.merge_attn_states(out, prefix, p_lse, suffix, s_lse, out_lse,
                                                      5, output_scale=scale))
    for _ in range(3):
        for t, s in ((prefix, 1.0), (suffix, 1.0), (p_lse, 3.0), (s_lse, 3.0)):
            t.copy_(randn(rng, tuple(t.shape), torch.float32, s))
        scale.fill_(new_scale(rng))
        graph.replay()
        want = torch.empty_like(out)
        want_lse = torch.empty_like(out_lse)
        vllm.merge_attn_states(want, prefix.clone(), p_lse.clone(), suffix.clone(), s_lse.clone(),
                               want_lse, 5, output_scale=scale.clone())
        torch.cuda.synchronize()
        assert same_bits(out, want)
        assert same_bits(out_lse, want_lse)
    mlakit.check_device_errors(DEV)


def test_bad_device_scale_gives_nan_and_a_device_error(rng):
    x = randn(rng, (4, 32), torch.bfloat16, 5.0)
    out, _ = vllm.scaled_fp8_quant(x, torch.tensor([0.0], device=DEV))
    assert ((bits(out) & 0x7F) == 0x7F).all()
    with pytest.raises(mlakit.MlakitError, match="scaled_fp8_quant: the scale tensor held"):
        mlakit.check_device_errors(DEV)
    mlakit.check_device_errors(DEV)  # cleared


def test_cp_gather_and_upconvert_reports_rows_past_dst_on_the_device(rng):
    """A request whose rows run past dst: the rows inside dst are written, the call reads nothing
    on the host, and check_device_errors reports it (as the gather's bad block-table entry)."""
    from test_compat_vllm import ds_mla_cache  # the hand-built fp8_ds_mla entries

    cache = ds_mla_cache(rng, 4, 4)[0].to(DEV)
    table = torch.tensor([[2, 0, 3, 1]], dtype=torch.int32, device=DEV)
    dst = torch.full((10, 576), -3.5, dtype=torch.bfloat16, device=DEV)
    lens = torch.tensor([5], dtype=torch.int32, device=DEV)
    starts = torch.tensor([7], dtype=torch.int32, device=DEV)  # rows 7..11 of 10
    vllm.cp_gather_and_upconvert_fp8_kv_cache(cache, dst, table, lens, starts, 1)
    with pytest.raises(mlakit.MlakitError, match="block"):
        mlakit.check_device_errors(DEV)
    mlakit.check_device_errors(DEV)  # cleared
    assert (dst[:7] == -3.5).all()
    assert not torch.isnan(dst[7:]).any() and not (dst[7:] == -3.5).all()
    # the same lengths inside dst: nothing reported
    starts.fill_(2)
    vllm.cp_gather_and_upconvert_fp8_kv_cache(cache, dst, table, lens, starts, 1)
    mlakit.check_device_errors(DEV)


def test_cp_gather_and_upconvert_graph_follows_new_lengths_and_starts(rng):
    """seq_lens / workspace_starts stay on the device: a replay after new lengths, new (out of
    order, gapped) starts and new cache bytes equals an eager call bit for bit; rows no request
    covers keep their values."""
    from test_compat_vllm import ds_mla_cache  # the hand-built fp8_ds_mla entries

    blocks, block_size, width, rows = 12, 4, 4, 40
    cache = ds_mla_cache(rng, blocks, block_size)[0].to(DEV)
    table = torch.from_numpy(rng.permutation(blocks)[:3 * width].reshape(3, width)
                             .astype(np.int32)).to(DEV)
    lens = torch.tensor([5, 0, 9], dtype=torch.int32, device=DEV)
    starts = torch.tensor([3, 8, 8], dtype=torch.int32, device=DEV)
    dst = torch.full((rows, 576), -3.5, dtype=torch.bfloat16, device=DEV)
    graph, _ = capture(lambda: vllm.cp_gather_and_upconvert_fp8_kv_cache(
        cache, dst, table, lens, starts, 3))
    for new_lens, new_starts in (([16, 2, 7], [20, 0, 2]), ([0, 0, 0], [1, 2, 3]),
                                 ([3, 16, 1], [36, 5, 0])):
        cache.copy_(ds_mla_cache(rng, blocks, block_size)[0].to(DEV))
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        starts.copy_(torch.tensor(new_starts, dtype=torch.int32))
        dst.fill_(-3.5)
        graph.replay()
        want = torch.full_like(dst, -3.5)
        vllm.cp_gather_and_upconvert_fp8_kv_cache(cache.clone(), want, table, lens.clone(),
                                                  starts.clone(), 3)
        torch.cuda.synchronize()
        assert same_bits(dst, want)
        covered = np.zeros(rows, dtype=bool)
        for n, s in zip(new_lens, new_starts):
            covered[s:s + n] = True
        assert (dst[torch.from_numpy(~covered).to(DEV)] == -3.5).all()
        assert not torch.isnan(dst).any()
    mlakit.check_device_errors(DEV)
