"""mlakit.compat.flash_mla on CUDA tensors, captured in torch.cuda.graph: flash_mla_with_kvcache
reads no tensor on the host (cache_seqlens, descales), so the capture itself must succeed; then
the captured q, cache_seqlens, block table and descale tensors get NEW values, the graph is
replayed, and the outputs the capture returned must equal a fresh eager call bit for bit and the
float64 reference of test_compat_flash_mla.py. Covers s_q 1, causal s_q 2 with a request shorter
than its queries (the per-query call and the torch.where merge), non-causal s_q 2, and fp8 with
per-request descales. A descale that is not finite and > 0 gives NaN rows for its request and a
device error.

Skipped without a GPU (the whole module). To run on a GPU machine, after a CUDA build:
  cmake --preset cuda && cmake --build --preset cuda
  MLAKIT_LIBRARY=$PWD/build/cuda/src/capi/libmlakit_c.so PYTHONPATH=python \\
      python -m pytest -q python/tests/test_compat_flash_mla_cuda.py
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="mlakit.compat needs torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)

import mlakit  # noqa: E402
from mlakit.compat import flash_mla  # noqa: E402

if not mlakit.build_info()["cuda"]:
    pytest.skip("mlakit was built without CUDA", allow_module_level=True)

from compat_case import E4M3  # noqa: E402
from test_compat_flash_mla import (D, DV, H_Q, PAGE, check_against_reference,  # noqa: E402
                                   f64, fp8_codes, reference_decode)
from test_compat_vllm_cuda import capture, same_bits  # noqa: E402

DEV = "cuda"
WIDTH = 6  # block-table columns: lengths up to 6 pages


def pool_and_table(rng, batch, num_blocks):
    """A random block table over the pool (every column a block id: any length up to
    WIDTH * PAGE can be replayed)."""
    return torch.from_numpy(rng.permutation(num_blocks)[:batch * WIDTH].reshape(batch, WIDTH)
                            .astype(np.int32)).to(DEV)


def new_lengths(rng, batch, s_q):
    """Lengths for a replay: 0, a request shorter than its queries (causal: its first queries
    see nothing), tile and page edges, long ones."""
    choices = [0, 1, s_q, 63, 64, 65, 200, WIDTH * PAGE - 1, WIDTH * PAGE]
    lens = rng.choice(choices, size=batch).astype(np.int32)
    lens[0] = 1 if s_q > 1 else 0
    return lens


@pytest.mark.parametrize("s_q,causal", [(1, False), (2, True), (2, False)])
def test_bf16_graph_follows_new_lengths_tables_and_queries(rng, s_q, causal):
    batch, num_blocks = 4, 4 * WIDTH + 2
    cache = torch.from_numpy(rng.standard_normal((num_blocks, PAGE, 1, D))).bfloat16().to(DEV)
    q = torch.from_numpy(rng.standard_normal((batch, s_q, H_Q, D))).bfloat16().to(DEV)
    table = pool_and_table(rng, batch, num_blocks)
    lens = torch.tensor([64] * batch, dtype=torch.int32, device=DEV)
    metadata = flash_mla.get_mla_metadata(lens, s_q * H_Q, 1)
    graph, (out, lse) = capture(lambda: flash_mla.flash_mla_with_kvcache(
        q, cache, table, lens, DV, *metadata, causal=causal))
    for _ in range(3):
        host_lens = new_lengths(rng, batch, s_q)
        lens.copy_(torch.from_numpy(host_lens))
        table.copy_(pool_and_table(rng, batch, num_blocks))
        q.copy_(torch.from_numpy(rng.standard_normal((batch, s_q, H_Q, D))).bfloat16())
        graph.replay()
        want_out, want_lse = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, DV,
                                                              *metadata, causal=causal)
        torch.cuda.synchronize()
        assert same_bits(out, want_out) and same_bits(lse, want_lse)
        ref, ref_lse = reference_decode(f64(q), f64(cache[:, :, 0]), table.cpu().numpy(),
                                        host_lens, DV, D ** -0.5, causal)
        check_against_reference(out, lse, ref, ref_lse, torch.bfloat16)
    mlakit.check_device_errors(DEV)


@pytest.mark.parametrize("causal", [True, False])
def test_fp8_graph_follows_new_per_request_descales_and_lengths(rng, causal):
    batch, s_q, num_blocks = 3, 2, 3 * WIDTH + 2
    cache = fp8_codes(rng, (num_blocks, PAGE, 1, D), 16.0).to(DEV)
    q = fp8_codes(rng, (batch, s_q, H_Q, D), 16.0).to(DEV)
    table = pool_and_table(rng, batch, num_blocks)
    lens = torch.tensor([100, 7, 300], dtype=torch.int32, device=DEV)
    descale_q = torch.full((batch,), 0.05, dtype=torch.float32, device=DEV)
    descale_k = torch.full((batch,), 0.05, dtype=torch.float32, device=DEV)
    metadata = flash_mla.get_mla_metadata(lens, s_q * H_Q, 1)
    graph, (out, lse) = capture(lambda: flash_mla.flash_mla_with_kvcache(
        q, cache, table, lens, DV, *metadata, causal=causal, descale_q=descale_q,
        descale_k=descale_k))
    k_codes = cache[:, :, 0].view(torch.uint8).cpu().numpy()
    for _ in range(3):
        host_lens = new_lengths(rng, batch, s_q)
        lens.copy_(torch.from_numpy(host_lens))
        dq, dk = rng.uniform(0.01, 0.1, batch), rng.uniform(0.01, 0.1, batch)
        descale_q.copy_(torch.from_numpy(dq).float())
        descale_k.copy_(torch.from_numpy(dk).float())
        graph.replay()
        want_out, want_lse = flash_mla.flash_mla_with_kvcache(
            q, cache, table, lens, DV, *metadata, causal=causal, descale_q=descale_q.clone(),
            descale_k=descale_k.clone())
        torch.cuda.synchronize()
        assert same_bits(out, want_out) and same_bits(lse, want_lse)
        q_codes = q.view(torch.uint8).cpu().numpy()
        dq32, dk32 = f64(descale_q), f64(descale_k)
        host_table = table.cpu().numpy()
        for b in range(batch):  # each request with its own descales, as the kernel read them
            ref, ref_lse = reference_decode(E4M3[q_codes[b:b + 1]] * dq32[b],
                                            E4M3[k_codes] * dk32[b], host_table[b:b + 1],
                                            host_lens[b:b + 1], DV, D ** -0.5, causal)
            check_against_reference(out[b:b + 1], lse[b:b + 1], ref, ref_lse, torch.bfloat16)
    mlakit.check_device_errors(DEV)


def test_bad_descale_gives_nan_rows_of_its_request_and_a_device_error(rng):
    batch, s_q, num_blocks = 3, 1, 3 * WIDTH + 2
    cache = fp8_codes(rng, (num_blocks, PAGE, 1, D), 16.0).to(DEV)
    q = fp8_codes(rng, (batch, s_q, H_Q, D), 16.0).to(DEV)
    table = pool_and_table(rng, batch, num_blocks)
    lens = torch.tensor([90, 40, 200], dtype=torch.int32, device=DEV)
    metadata = flash_mla.get_mla_metadata(lens, s_q * H_Q, 1)
    good = torch.full((batch,), 0.05, dtype=torch.float32, device=DEV)
    bad = torch.tensor([0.05, float("nan"), 0.05], dtype=torch.float32, device=DEV)
    out, lse = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, DV, *metadata,
                                                descale_q=good, descale_k=bad)
    want, want_lse = flash_mla.flash_mla_with_kvcache(q, cache, table, lens, DV, *metadata,
                                                      descale_q=good, descale_k=good)
    assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all()
    assert same_bits(out[0::2], want[0::2]) and same_bits(lse[0::2], want_lse[0::2])
    with pytest.raises(mlakit.MlakitError, match="mla_decode: a q_scale or k_scale tensor held"):
        mlakit.check_device_errors(DEV)
    mlakit.check_device_errors(DEV)  # cleared
