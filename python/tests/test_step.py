"""The engine path from Python: one Workspace, one StepPlan per step, every layer run against it.
NumPy on the CPU against the single-call forward (bitwise) and the fp64 reference; torch ops on
the CPU (skipped without torch); a CUDA-graph replay of a decode step through torch.ops.mlakit
(skipped without torch, a CUDA device or the CUDA backend)."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mlakit
from layer_case import L, N, P, V, Batch, config

DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"
TOKENS_LIMIT = 32  # max_num_batched_tokens of these tests: Batch has 12 tokens


def random_weight(rng):
    return (rng.standard_normal((N * (P + V), L)) / np.sqrt(L)).astype(np.float32)


def nan_output(batch):
    return np.full((batch.T + batch.padding, N * V), np.nan, dtype=np.float32)


def torch_or_skip():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not mlakit.torch_ops_registered:
        pytest.skip("torch.ops.mlakit is not registered (MLAKIT_DISABLE_TORCH=1?)")
    return torch


# ---- NumPy, CPU -------------------------------------------------------------------------------


def test_one_plan_serves_three_layers(rng):
    step_config = config(max_num_batched_tokens=TOKENS_LIMIT)
    first = Batch(rng)
    batches = [first, first.another_layer(rng), first.another_layer(rng)]
    weights = [random_weight(rng) for _ in batches]
    layers = [mlakit.MlaAttention(step_config, w) for w in weights]
    workspace = mlakit.Workspace(step_config)
    workspace.touch()

    plan = mlakit.plan_step(step_config, first.forward_batch(), workspace)
    assert workspace.current_plan is plan
    assert plan.split == mlakit.SplitCounts(2, 2, 2, 10)
    assert (plan.num_reqs, plan.num_actual_tokens) == (4, first.T)
    assert plan.num_context_chunks >= 3  # 37 context tokens through a 16-row workspace
    assert 0 < plan.workspace_bytes_used <= workspace.bytes
    single_plan = layers[0].plan(first.forward_batch())
    assert plan.plan.split == single_plan.split
    assert len(plan.plan.context_chunks) == len(single_plan.context_chunks)
    for ours, theirs in zip(plan.plan.context_chunks, single_plan.context_chunks):
        assert np.array_equal(ours.cu_seq_lens, theirs.cu_seq_lens)

    caches_before = [b.cache.copy() for b in batches]
    outputs = []
    for layer, b in zip(layers, batches):  # the engine loop: launches only
        outputs.append(nan_output(b))
        layer.forward(b.q, b.kv_c, b.k_pe, b.cache, plan, outputs[-1])

    for layer, b, w, out, cache in zip(layers, batches, weights, outputs, caches_before):
        single = nan_output(b)
        layer.forward(b.q, b.kv_c, b.k_pe, cache, b.forward_batch(), single)
        assert np.array_equal(out.view(np.uint32), single.view(np.uint32))  # bitwise, NaN rows too
        assert np.array_equal(b.cache, cache, equal_nan=True)
        np.testing.assert_allclose(out[:b.T], b.reference(w.astype(np.float64)), rtol=2e-4,
                                   atol=2e-4)
        assert np.isnan(out[b.T:]).all()  # padding rows untouched
    assert not np.array_equal(outputs[0][:first.T], outputs[1][:first.T])


def test_workspace_is_sized_by_the_limits_only(rng):
    small = config(max_num_batched_tokens=TOKENS_LIMIT)
    workspace = mlakit.Workspace(small)
    assert workspace.bytes == mlakit.workspace_bytes(small)
    # The new tokens' up-projection [tokens, N * (P + V)] f32 alone is a lower bound.
    assert workspace.bytes >= TOKENS_LIMIT * N * (P + V) * 4
    larger = config(max_num_batched_tokens=4 * TOKENS_LIMIT)
    assert mlakit.workspace_bytes(larger) > workspace.bytes
    # A step within the limits uses part of it; the same step again uses the same part.
    batch = Batch(rng)
    used = mlakit.plan_step(small, batch.forward_batch(), workspace).workspace_bytes_used
    assert 0 < used <= workspace.bytes
    assert mlakit.plan_step(small, batch.forward_batch(), workspace).workspace_bytes_used == used
    with pytest.raises(ValueError, match="max_num_batched_tokens must be > 0, got 256, 8 and 0"):
        mlakit.workspace_bytes(config(max_num_batched_tokens=0))


def test_stale_plans_raise_with_the_library_message(rng):
    step_config = config(max_num_batched_tokens=TOKENS_LIMIT)
    batch = Batch(rng)
    layer = mlakit.MlaAttention(step_config, random_weight(rng))
    workspace = mlakit.Workspace(step_config)
    first = mlakit.plan_step(step_config, batch.forward_batch(), workspace)
    second = mlakit.plan_step(step_config, batch.forward_batch(), workspace)
    assert first.same_launches(second)  # the same step again: a captured graph would replay it
    assert workspace.current_plan is second
    out = nan_output(batch)
    with pytest.raises(ValueError) as info:
        layer.forward(batch.q, batch.kv_c, batch.k_pe, batch.cache, first, out)
    assert str(info.value) == ("MlaAttention::forward: the StepPlan is stale: a later plan_step "
                               "on its workspace overwrote its indices")
    assert info.value.status == "invalid_argument"
    assert np.isnan(out).all()
    layer.forward(batch.q, batch.kv_c, batch.k_pe, batch.cache, second, out)
    assert not np.isnan(out[:batch.T]).any()


def test_steps_beyond_the_limits_are_rejected_by_name(rng):
    limits = config(max_num_seqs=3, max_model_len=64, max_num_batched_tokens=10)
    workspace = mlakit.Workspace(limits)
    batch = Batch(rng)  # 4 requests, 12 tokens, the longest 43 tokens
    with pytest.raises(ValueError, match=r"plan_step: the batch has 4 requests, more than "
                                         r"max_num_seqs \(3\)"):
        mlakit.plan_step(limits, batch.forward_batch(), workspace)
    workspace = mlakit.Workspace(config(max_model_len=40, max_num_batched_tokens=TOKENS_LIMIT))
    with pytest.raises(ValueError, match=r"plan_step: seq_lens\[2\] \(43\) exceeds max_model_len "
                                         r"\(40\)"):
        mlakit.plan_step(config(), batch.forward_batch(), workspace)
    workspace = mlakit.Workspace(config(max_num_batched_tokens=10))
    with pytest.raises(ValueError, match=r"num_actual_tokens \(12\) exceeds "
                                         r"max_num_batched_tokens \(10\)"):
        mlakit.plan_step(config(), batch.forward_batch(), workspace)
    assert workspace.current_plan is None


def test_plans_and_layers_must_share_the_configuration(rng):
    step_config = config(max_num_batched_tokens=TOKENS_LIMIT)
    batch = Batch(rng)
    workspace = mlakit.Workspace(step_config)
    with pytest.raises(ValueError, match="differs from the one the workspace was sized for"):
        mlakit.plan_step(config(batch_invariant=True), batch.forward_batch(), workspace)
    plan = mlakit.plan_step(step_config, batch.forward_batch(), workspace)
    other = mlakit.MlaAttention(config(batch_invariant=True), random_weight(rng))
    with pytest.raises(ValueError, match="the StepPlan was made for another configuration"):
        other.forward(batch.q, batch.kv_c, batch.k_pe, batch.cache, plan, nan_output(batch))
    elsewhere = mlakit.plan_step(step_config, batch.forward_batch(),
                                 mlakit.Workspace(step_config))
    assert not plan.same_launches(elsewhere)  # another workspace: other addresses
    with pytest.raises(TypeError, match="plan_step takes a Workspace, got MlaConfig"):
        mlakit.plan_step(step_config, batch.forward_batch(), step_config)
    with pytest.raises(TypeError, match="same_launches takes a StepPlan"):
        plan.same_launches(batch)


def test_batch_invariant_config_reaches_the_library(rng):
    step_config = config(max_num_batched_tokens=TOKENS_LIMIT, batch_invariant=True)
    batch = Batch(rng)
    weight = random_weight(rng)
    layer = mlakit.MlaAttention(step_config, weight)
    workspace = mlakit.Workspace(step_config)
    plan = mlakit.plan_step(step_config, batch.forward_batch(), workspace)
    out = nan_output(batch)
    layer.forward(batch.q, batch.kv_c, batch.k_pe, batch.cache, plan, out)
    np.testing.assert_allclose(out[:batch.T], batch.reference(weight.astype(np.float64)),
                               rtol=2e-4, atol=2e-4)


def test_docs_engine_example_runs_as_written(tmp_path):
    if not DOC.is_file():
        pytest.skip(f"{DOC} not found (tests run outside the repository)")
    text = DOC.read_text()
    code = re.search(r"## Engine steps.*?```python\n(.*?)```", text, re.S).group(1)
    script = tmp_path / "engine_example.py"
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "3 steps x 2 layers on one workspace: ok"


# ---- torch, CPU -------------------------------------------------------------------------------


class TorchStep:
    """Batch's step as torch CPU tensors, two layers, a workspace and its current plan."""

    def __init__(self, torch, rng):
        self.config = config(max_num_batched_tokens=TOKENS_LIMIT)
        first = Batch(rng)
        self.batches = [first, first.another_layer(rng)]
        self.layers = [mlakit.MlaAttention(self.config, random_weight(rng)) for _ in self.batches]
        self.workspace = mlakit.Workspace(self.config)
        self.block_table = torch.from_numpy(first.block_table)
        self.slot_mapping = torch.from_numpy(first.slot_mapping)
        self.inputs = [[torch.from_numpy(a) for a in (b.q, b.kv_c, b.k_pe, b.cache)]
                       for b in self.batches]
        self.T, self.rows = first.T, first.T + first.padding

    def plan(self):
        first = self.batches[0]
        batch = mlakit.ForwardBatch(first.qsl, first.seq_lens, self.block_table,
                                    self.slot_mapping)
        return mlakit.plan_step(self.config, batch, self.workspace)


def test_forward_step_op_matches_the_python_method(rng):
    torch = torch_or_skip()
    s = TorchStep(torch, rng)
    plan = s.plan()
    for layer, (q, kv_c, k_pe, cache) in zip(s.layers, s.inputs):
        cache_copy = cache.clone()
        out_op = torch.full((s.rows, N * V), float("nan"))
        torch.ops.mlakit.mla_attention_forward_step(layer.layer_id, s.workspace.workspace_id, q,
                                                    kv_c, k_pe, cache, out_op)
        out_py = torch.full((s.rows, N * V), float("nan"))
        layer.forward(q, kv_c, k_pe, cache_copy, plan, out_py)
        assert torch.equal(out_op[:s.T], out_py[:s.T])
        assert torch.isnan(out_op[s.T:]).all()
        assert torch.equal(cache.nan_to_num(7.0), cache_copy.nan_to_num(7.0))


def test_forward_step_op_names_missing_plans_and_objects(rng):
    torch = torch_or_skip()
    s = TorchStep(torch, rng)
    q, kv_c, k_pe, cache = s.inputs[0]
    out = torch.empty(s.rows, N * V)
    with pytest.raises(ValueError, match=f"workspace_id {s.workspace.workspace_id} has no "
                                         "StepPlan yet"):
        torch.ops.mlakit.mla_attention_forward_step(s.layers[0].layer_id,
                                                    s.workspace.workspace_id, q, kv_c, k_pe,
                                                    cache, out)
    s.plan()
    with pytest.raises(ValueError, match="no live Workspace with workspace_id -1"):
        torch.ops.mlakit.mla_attention_forward_step(s.layers[0].layer_id, -1, q, kv_c, k_pe,
                                                    cache, out)
    with pytest.raises(ValueError, match="no live MlaAttention with layer_id -1"):
        torch.ops.mlakit.mla_attention_forward_step(-1, s.workspace.workspace_id, q, kv_c, k_pe,
                                                    cache, out)


def test_forward_step_op_passes_opcheck(rng):
    torch = torch_or_skip()
    s = TorchStep(torch, rng)
    s.plan()
    q, kv_c, k_pe, cache = s.inputs[0]
    out = torch.zeros(s.rows, N * V)
    torch.library.opcheck(torch.ops.mlakit.mla_attention_forward_step.default,
                          (s.layers[0].layer_id, s.workspace.workspace_id, q, kv_c, k_pe, cache,
                           out))


def test_compiled_layers_follow_new_plans_without_recompiling(rng):
    torch = torch_or_skip()
    s = TorchStep(torch, rng)
    workspace_id = s.workspace.workspace_id
    layer_ids = [layer.layer_id for layer in s.layers]

    def layers_forward(inputs):
        outs = []
        for layer_id, (q, kv_c, k_pe, cache) in zip(layer_ids, inputs):
            out = torch.zeros(q.shape[0], N * V)
            torch.ops.mlakit.mla_attention_forward_step(layer_id, workspace_id, q, kv_c, k_pe,
                                                        cache, out)
            outs.append(out * 2)
        return outs

    compiled = torch.compile(layers_forward, backend="aot_eager", fullgraph=True)
    for step in range(3):
        s.plan()  # a new plan per step: the op's arguments stay the same
        # Each run writes into fresh copies of the caches, so both read the same cache.
        eager = layers_forward([[t.clone() for t in inputs] for inputs in s.inputs])
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            ours = compiled([[t.clone() for t in inputs] for inputs in s.inputs])
        for a, b in zip(eager, ours):
            assert torch.equal(a, b)


# ---- torch, CUDA graphs -----------------------------------------------------------------------

# A decode step at bucket size 8 with DeepSeek-V2-Lite dims (the CUDA decode kernel's 576-wide
# entries), two layers, bf16.
GRAPH_BATCH = 8
GRAPH_HEADS, GRAPH_L, GRAPH_R, GRAPH_P, GRAPH_V = 16, 512, 64, 128, 128
GRAPH_BLOCK = 64
GRAPH_MAX_LEN = 1024  # 16 blocks per request
GRAPH_LAYERS = 2
GRAPH_STEPS = 6


def cuda_or_skip():
    torch = torch_or_skip()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not mlakit.build_info()["cuda"]:
        pytest.skip("this build of libmlakit_c.so has no CUDA backend")
    return torch


class GraphStep:
    """The static tensors of a captured decode step: the engine writes each step's values into
    them, plans the step, then replays."""

    def __init__(self, torch, rng):
        self.torch = torch
        self.rng = rng
        self.config = mlakit.MlaConfig(
            scale=0.1147214, num_heads=GRAPH_HEADS, kv_lora_rank=GRAPH_L,
            qk_rope_head_dim=GRAPH_R, qk_nope_head_dim=GRAPH_P, v_head_dim=GRAPH_V,
            act_dtype="bfloat16", block_size=GRAPH_BLOCK, max_model_len=GRAPH_MAX_LEN,
            max_num_seqs=GRAPH_BATCH, max_num_batched_tokens=GRAPH_BATCH, device="cuda")
        self.width = GRAPH_MAX_LEN // GRAPH_BLOCK
        self.num_blocks = GRAPH_BATCH * self.width + 5
        cuda = torch.device("cuda")
        gen = torch.Generator(device="cpu").manual_seed(int(rng.integers(2**31)))
        self.layers = [
            mlakit.MlaAttention(self.config, torch.randn(
                GRAPH_HEADS * (GRAPH_P + GRAPH_V), GRAPH_L, generator=gen) / GRAPH_L**0.5)
            for _ in range(GRAPH_LAYERS)]
        self.caches = [torch.randn(self.num_blocks, GRAPH_BLOCK, GRAPH_L + GRAPH_R, generator=gen)
                       .to(cuda, torch.bfloat16) for _ in range(GRAPH_LAYERS)]
        self.workspace = mlakit.Workspace(self.config)
        self.workspace.touch()
        self.block_table = torch.zeros(GRAPH_BATCH, self.width, dtype=torch.int32, device=cuda)
        self.slot_mapping = torch.zeros(GRAPH_BATCH, dtype=torch.int64, device=cuda)
        self.q = torch.zeros(GRAPH_BATCH, GRAPH_HEADS, GRAPH_P + GRAPH_R, dtype=torch.bfloat16,
                             device=cuda)
        self.kv_c = torch.zeros(GRAPH_BATCH, GRAPH_L, dtype=torch.bfloat16, device=cuda)
        self.k_pe = torch.zeros(GRAPH_BATCH, GRAPH_R, dtype=torch.bfloat16, device=cuda)
        self.outputs = [torch.full((GRAPH_BATCH, GRAPH_HEADS * GRAPH_V), float("nan"),
                                   dtype=torch.bfloat16, device=cuda)
                        for _ in range(GRAPH_LAYERS)]
        self.gen = gen

    def new_step(self):
        """Writes a new step into the static tensors (lengths across block boundaries, a fresh
        block table and slots) and plans it; returns the plan."""
        torch = self.torch
        # >= 2: a decode has context (a 1-token request without context is a prefill).
        seq_lens = self.rng.integers(2, GRAPH_MAX_LEN + 1, GRAPH_BATCH).astype(np.int32)
        seq_lens[0] = GRAPH_BLOCK + 1  # one token into a second block
        blocks = self.rng.permutation(self.num_blocks)[:GRAPH_BATCH * self.width]
        table = blocks.reshape(GRAPH_BATCH, self.width).astype(np.int32)
        last = seq_lens - 1  # position of each request's new token
        slots = table[np.arange(GRAPH_BATCH), last // GRAPH_BLOCK].astype(np.int64) * GRAPH_BLOCK
        slots += last % GRAPH_BLOCK
        self.block_table.copy_(torch.from_numpy(table))
        self.slot_mapping.copy_(torch.from_numpy(slots))
        for t in (self.q, self.kv_c, self.k_pe):
            t.copy_(torch.randn(t.shape, generator=self.gen))
        qsl = np.arange(GRAPH_BATCH + 1, dtype=np.int32)
        batch = mlakit.ForwardBatch(qsl, seq_lens, self.block_table, self.slot_mapping)
        return mlakit.plan_step(self.config, batch, self.workspace)

    def run_layers(self):
        """The decode step of every layer through torch.ops.mlakit (what the graph captures)."""
        for layer, cache, out in zip(self.layers, self.caches, self.outputs):
            self.torch.ops.mlakit.mla_attention_forward_step(
                layer.layer_id, self.workspace.workspace_id, self.q, self.kv_c, self.k_pe, cache,
                out)


def test_cuda_graph_replays_decode_steps_like_eager_runs(rng):
    torch = cuda_or_skip()
    s = GraphStep(torch, rng)
    captured_plan = s.new_step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on the capture stream (lazy library resources)
        s.run_layers()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        s.run_layers()

    for _ in range(GRAPH_STEPS):
        plan = s.new_step()  # new lengths, table and slots written; indices uploaded
        assert plan.same_launches(captured_plan)
        caches_before = [c.clone() for c in s.caches]
        for out in s.outputs:
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        replayed = [o.clone() for o in s.outputs]
        replayed_caches = [c.clone() for c in s.caches]

        for cache, before in zip(s.caches, caches_before):
            cache.copy_(before)
        for out in s.outputs:
            out.fill_(float("nan"))
        s.run_layers()  # eager, against the same plan
        torch.cuda.synchronize()
        for ours, eager in zip(replayed, s.outputs):
            assert not torch.isnan(eager).any()
            assert torch.equal(ours.view(torch.int16), eager.view(torch.int16))
        for ours, eager in zip(replayed_caches, s.caches):
            assert torch.equal(ours.view(torch.int16), eager.view(torch.int16))
    mlakit.check_device_errors("cuda")
