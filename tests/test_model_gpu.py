"""The hybrid model engine on a CUDA GPU: flash attention == the per-row reference, graph
replay == eager across buckets, the triton conv in fp32 == the dense oracle, and the
mid-size preset builds and steps.

Run on the device machine: ``python -m pytest -q -m gpu tests/test_model_gpu.py``.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import model_schedules as sched
import numpy as np
import pytest
import torch

from stepplan.executor.model import HybridModelRunner, MemoryTooSmallError, ModelShape, metadata
from stepplan.executor.model.attention import flash_attention, sdpa_attention
from stepplan.planner import GraphKey, PlannerConfig, StepBatch
from stepplan.sim.settings.presets import MODEL_PRESETS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import model_bench as bench

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
SMALL = dict(
    layer_kinds=("conv", "attention") * 2,
    hidden_size=256,
    conv_channels=512,
    conv_kernel_size=4,
    conv_dilation=3,
    mlp_size=512,
    num_heads=8,
    num_kv_heads=2,
    head_dim=64,
    vocab_size=512,
    dtype="bfloat16",
    max_model_len=4096,
    rope_theta=10000.0,
)
BF16 = ModelShape(**SMALL, seed=5)
TINY = ModelShape(**MODEL_PRESETS["tiny"], seed=5)
CONFIG = PlannerConfig(
    num_spec_tokens=3, graph_mode="mixed", graph_sizes=(1, 4, 8, 16, 32, 64, 256), max_num_seqs=8
)
STEP = {"spec": 3, "chunk": 48, "budget": 160, "max_rows": 6}


def runner(shape: ModelShape, **kwargs) -> HybridModelRunner:
    arguments = {"num_slots": 9, "max_len": 256, "num_groups": 2, "device": CUDA, **kwargs}
    return HybridModelRunner(shape, CONFIG, backend="triton", **arguments)


def lockstep(runners, seed, vocab, compare, count=6):
    """Serve one random schedule on every runner at once; ``compare(batch, ids, samples)``
    runs each step on all of them."""
    rng = np.random.default_rng(seed)
    requests = sched.make_requests(rng, count=count, vocab=vocab, longest=120, groups=2, spec=3)
    steps = 0
    while rows := sched.next_step(rng, requests, vocab=vocab, **STEP):
        batch = sched.batch_of(rows, requests, 2)
        ids, samples, _ = sched.step_inputs(rows, requests, batch)
        compare([r.planner.compile(batch) for r in runners], ids, samples)
        sched.advance(rows, requests)
        steps += 1
    return steps


@pytest.fixture
def no_tf32(monkeypatch):
    # The dense oracle's conv1d goes through cuDNN, which may use TF32 unless told not to.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


@pytest.mark.parametrize("seed", [0, 1])
def test_triton_conv_in_fp32_gives_the_dense_oracles_tokens(no_tf32, seed):
    model = runner(TINY, attention="sdpa", max_len=128)  # fp32: no flash, so no graphs
    rng = np.random.default_rng(seed)
    requests = sched.make_requests(rng, count=5, vocab=64, longest=100, groups=2, spec=3)
    answers = sched.oracle(model.weights, TINY, requests)
    checked = sched.serve(model, requests, rng, vocab=64, **STEP)
    assert sched.mismatches(checked, answers, 1e-3) == []


def test_flash_attention_equals_the_reference_in_bf16():
    flash, sdpa = runner(BF16, use_graphs=False), runner(BF16, attention="sdpa")
    agree, total = [0], [0]

    def compare(plans, ids, samples):
        got = flash.logits(plans[0], ids, samples).float()
        want = sdpa.logits(plans[1], ids, samples).float()
        assert (got - want).norm() <= 0.03 * want.norm()
        agree[0] += int((got.argmax(-1) == want.argmax(-1)).sum())
        total[0] += len(samples)

    assert lockstep([flash, sdpa], seed=2, vocab=512, compare=compare) > 5
    assert agree[0] >= 0.8 * total[0]  # bf16 logits tie often; the norm bound is the check
    got, want = flash.cache.memory[:, :, 1:].float(), sdpa.cache.memory[:, :, 1:].float()
    assert (got - want).norm() <= 0.03 * want.norm()


def _attention_case(batch: StepBatch, shape: metadata.StepShape | None, seed: int):
    gen = torch.Generator(CUDA).manual_seed(seed)
    slots, max_len, kv_heads, heads, dim = 8, 64, 2, 8, 64
    cache = torch.randn(2, slots, max_len, kv_heads, dim, generator=gen, device=CUDA)
    keys, values = cache.to(torch.bfloat16).unbind(0)
    rows = metadata.LiveRows.of(batch)
    ids = np.zeros(batch.num_tokens, np.int64)
    samples = np.zeros(0, np.int64)
    shape = shape or metadata.eager_shape(rows, batch.num_tokens, 0)
    buffer = np.empty(shape.nbytes, np.uint8)
    host = metadata.fill(buffer, shape, rows, ids, samples, max_len)
    meta = metadata.device_views(torch.from_numpy(buffer).to(CUDA), shape)
    q = torch.randn(shape.num_tokens, heads, dim, generator=gen, device=CUDA).to(torch.bfloat16)
    flat = (slots * max_len, kv_heads, dim)
    got = flash_attention(q, keys.reshape(flat), values.reshape(flat), meta)
    want = sdpa_attention(q, keys, values, host)
    live = batch.num_tokens
    torch.testing.assert_close(got[:live], want[:live], atol=2e-2, rtol=2e-2)
    return got[:live]


def test_flash_reads_rows_at_unordered_key_starts():
    """Rows on slots 7, 2, 5, 1 (key starts not monotonic), a prefill, spec rows, and a
    live decode on the NULL slot, which attends over nothing."""
    batch = StepBatch(
        query_lens=[3, 9, 1, 4, 1],
        num_computed_tokens=[40, 0, 20, 17, 5],
        slots=[7, 2, 0, 5, 1],
        num_draft_tokens=[2, -1, -1, 3, -1],
        num_accepted_tokens=[1, 1, 1, 2, 1],
        allow_null_slots=True,
    )
    out = _attention_case(batch, None, seed=0)
    assert not out[12].any()  # the NULL row's token (after 3 + 9 tokens)


@pytest.mark.parametrize("kind", ["decode", "spec", "mixed"])
def test_flash_inert_padding_in_graph_shapes(kind):
    """Graph shapes: padding rows and tokens; decode graphs take flash's one-query path."""
    q = {"decode": 1, "spec": 4, "mixed": 2}[kind]
    drafts = q - 1 if kind == "spec" else -1
    batch = StepBatch(
        query_lens=[q, q, 0, q],
        num_computed_tokens=[30, 11, 0, 50],
        slots=[6, 3, -1, 4],
        num_draft_tokens=[drafts, drafts, -1, drafts],
        num_accepted_tokens=[1, 1, 1, 1],
    )
    key = GraphKey(kind, 8 * (4 if kind == "spec" else 1), 8, 0)
    _attention_case(batch, metadata.graph_shape(key, 4, 64), seed=1)


def test_graph_replay_equals_eager_across_buckets():
    graphed, eager = runner(BF16), runner(BF16, use_graphs=False)
    assert graphed.executor.use_graphs and not eager.executor.use_graphs
    sizes = []

    def compare(plans, ids, samples):
        got = graphed.run_plan(plans[0], ids, samples)
        want = eager.run_plan(plans[1], ids, samples)
        np.testing.assert_array_equal(got, want, err_msg=str(plans[0].graph))
        sizes.append(plans[0].padded_tokens)

    assert lockstep([graphed, eager], seed=3, vocab=512, compare=compare) > 5
    assert len(graphed.captured_graphs) >= 3
    assert any(later < earlier for earlier, later in itertools.pairwise(sizes))
    # Slot 0 is left out: every padding token writes its entry 0, in no fixed order.
    torch.testing.assert_close(
        graphed.cache.memory[:, :, 1:], eager.cache.memory[:, :, 1:], atol=0, rtol=0
    )
    torch.testing.assert_close(graphed.conv_state_memory, eager.conv_state_memory, atol=0, rtol=0)


def test_warm_up_captures_ahead_and_changes_nothing():
    model = runner(BF16)
    batch = StepBatch(
        query_lens=[4, 4],
        num_computed_tokens=[9, 3],
        slots=[[1, 2], [3, 4]],
        num_draft_tokens=[3, 3],
        num_accepted_tokens=[1, 1],
    )
    plan = model.planner.compile(batch)
    model.warm_up([plan])
    assert model.captured_graphs == (plan.graph,)
    assert not model.cache.memory[:, :, 1:].any() and not model.conv_state_memory.any()
    greedy, timing = model.timed_run(plan, np.arange(8), np.arange(8))
    assert greedy.shape == (8,) and timing.gpu_s > 0 and timing.wall_s >= timing.host_s


def test_hybrid_1b_builds_and_steps():
    shape = ModelShape(**MODEL_PRESETS["hybrid-1b"], seed=0)
    model = HybridModelRunner(
        shape, bench.planner_config(16), num_slots=17, max_len=4096, device=CUDA, backend="triton"
    )
    rng = np.random.default_rng(0)
    steps = bench.make_steps(rng, rows=16, max_len=4096, prefill=1024, vocab=32000)
    results = bench.run_bench(model, steps, repeats=2)
    for row in results:
        assert row["bucket"] != "eager" and row["graph"]["gpu_ms"] > 0
        assert row["agree_same_plan"] == 1.0  # the replay runs the eager plan's very shapes
    first = steps[0]
    greedy = model.run_plan(model.planner.compile(first.batch), first.token_ids, first.sample_index)
    assert greedy.min() >= 0 and greedy.max() < 32000


def test_too_large_a_cache_is_refused_before_allocating():
    before = torch.cuda.memory_allocated(CUDA)
    shape = ModelShape(**MODEL_PRESETS["hybrid-8b"])
    with pytest.raises(MemoryTooSmallError, match="lower num_slots or max_len"):
        HybridModelRunner(
            shape, CONFIG, num_slots=2000, max_len=65536, device=CUDA, backend="triton"
        )
    assert torch.cuda.memory_allocated(CUDA) == before
