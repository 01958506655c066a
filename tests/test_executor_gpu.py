"""The executor on a CUDA GPU: graph replay == eager == reference, over steps crossing buckets.

Run on a CUDA machine: ``python -m pytest -q -m gpu tests/test_executor_gpu.py``.
"""

from __future__ import annotations

import gc

import attrs
import numpy as np
import pytest
import torch

from stepplan.executor import Executor, ReplayMismatchError
from stepplan.executor.kernels import VARIANTS
from stepplan.executor.staging_kernel import pull_plan
from stepplan.executor.upload import StagingRing
from stepplan.executor.vllm import PlanMetadataBuilder, plan_from_common_metadata, seed_view
from stepplan.planner import PlannerConfig, StepBatch, compile_plan

pytestmark = pytest.mark.gpu

CHANNELS, TAPS, DILATION, SLOTS = 200, 4, 3, 80
LAYER_GROUPS = (0, 0, 1, 2, 2, 1)
CONFIG = PlannerConfig(
    num_spec_tokens=3,
    graph_mode="mixed",
    graph_sizes=(4, 8, 16, 32, 48, 64, 128, 256),
    max_num_seqs=48,
    prefill_tile_tokens=16,
)
# Rows per step and the kinds they are drawn from (spec, decode, prefill, padding): big then
# small, pure spec and pure decode (uniform graphs), mixed, and a step beyond every bucket.
STEPS = (
    (40, (4, 3, 2, 1)),
    (2, (4, 3, 2, 1)),
    (1, (1, 0, 0, 0)),
    (48, (0, 1, 0, 0)),
    (3, (0, 1, 0, 0)),
    (30, (1, 0, 0, 0)),
    (12, (2, 2, 3, 1)),
    (6, (0, 0, 1, 0)),  # prefills up to 120 tokens: beyond 256 tokens runs eagerly
    (1, (0, 1, 0, 0)),
    (25, (4, 3, 2, 1)),
    (5, (1, 1, 1, 1)),
    (48, (1, 0, 0, 0)),
    (1, (1, 0, 0, 0)),
)


def random_batch(rng: np.random.Generator, rows: int, weights, max_prefill: int) -> StepBatch:
    kinds = rng.choice(4, size=rows, p=np.array(weights) / sum(weights))
    q = np.choose(
        kinds,
        [
            1 + rng.integers(0, CONFIG.query_len_max, rows),
            np.ones(rows, int),
            rng.integers(2, max_prefill + 1, rows),
            0 * kinds,
        ],
    )
    computed = rng.integers(0, 50, rows) * (rng.random(rows) < 0.7)
    computed = np.where(kinds == 0, computed + 1, np.where(kinds == 3, 0, computed))
    slots = np.stack([rng.permutation(np.arange(1, SLOTS))[:rows] for _ in range(3)])
    return StepBatch(
        query_lens=q,
        num_computed_tokens=computed,
        slots=np.where(kinds == 3, 0, slots),
        num_draft_tokens=np.where(kinds == 0, q - 1, -1),
        num_accepted_tokens=np.where(kinds == 0, rng.integers(1, 5, rows), 1),
    )


def base_operands(dtype: torch.dtype, seed: int = 0):
    """Weights and states (layer 0 in [slot, C, W] memory, the rest vLLM's [slot, W, C])."""
    gen = torch.Generator().manual_seed(seed)
    window = (TAPS - 1) * DILATION + CONFIG.query_len_max - 1
    weights = [torch.randn(CHANNELS, TAPS, generator=gen).to(dtype) for _ in LAYER_GROUPS]
    states = [torch.randn(SLOTS, window, CHANNELS, generator=gen).to(dtype) for _ in LAYER_GROUPS]
    return weights, states


def build(
    backend: str, use_graphs: bool, dtype: torch.dtype, kernel_variant: str | None = None
) -> Executor:
    weights, states = base_operands(dtype)
    views = [
        s.permute(0, 2, 1).contiguous() if i == 0 else s.permute(0, 2, 1)
        for i, s in enumerate(states)
    ]
    return Executor(
        weights=[w.cuda() for w in weights],
        layer_groups=LAYER_GROUPS,
        conv_states=[v.cuda() for v in views],  # .cuda() keeps each layout's strides
        dilation=DILATION,
        config=CONFIG,
        backend=backend,
        use_graphs=use_graphs,
        kernel_variant=kernel_variant,
    )


def assert_states_close(a: Executor, b: Executor, atol: float, what: str) -> None:
    for layer, (sa, sb) in enumerate(zip(a.conv_states, b.conv_states, strict=True)):
        torch.testing.assert_close(sa, sb, atol=atol, rtol=atol, msg=f"{what}: layer {layer}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replay_equals_eager_equals_reference(dtype):
    graphs, eager = build("triton", True, dtype), build("triton", False, dtype)
    reference = build("reference", False, dtype)
    assert graphs.conv_states[0].stride(2) == 1 and graphs.conv_states[1].stride(1) == 1
    # bf16: a one-ulp difference of one layer's output shifts later roundings of the sum.
    atol, rtol = (1e-5, 1e-5) if dtype == torch.float32 else (0.125, 0.04)
    rng = np.random.default_rng(1)
    eager_steps = 0
    for index, (rows, weights) in enumerate(STEPS):
        batch = random_batch(rng, rows, weights, max_prefill=120 if index == 7 else 24)
        plan = compile_plan(batch, CONFIG)
        eager_steps += plan.graph is None
        tokens = batch.num_tokens
        x = torch.randn(tokens + 3, CHANNELS, device="cuda").to(dtype)
        residual = torch.randn_like(x)
        if plan.graph is not None and index % 2:
            # Every staged row the plan does not name is NaN: reading one would show.
            staged_x, staged_r = graphs.staging(graphs.capacity.num_tokens)
            staged_x.fill_(float("nan"))
            staged_r.fill_(float("nan"))
            staged_x[:tokens].copy_(x[:tokens])
            staged_r[:tokens].copy_(residual[:tokens])
            graphs.step(plan, *graphs.staging(tokens))
            out_graph = torch.cat([staged_r[:tokens], residual[tokens:]])
        else:
            out_graph = residual.clone()
            graphs.step(plan, x, out_graph)
        out_eager, out_reference = residual.clone(), residual.clone()
        eager.step(plan, x, out_eager)
        reference.step(plan, x, out_reference)
        torch.cuda.synchronize()
        what = f"step {index} ({plan.graph or 'eager'})"
        assert not out_graph.isnan().any(), what
        torch.testing.assert_close(out_graph, out_eager, atol=0, rtol=0, msg=what)
        torch.testing.assert_close(out_eager, out_reference, atol=atol, rtol=rtol, msg=what)
        assert_states_close(graphs, eager, 0, what)
        assert_states_close(eager, reference, 0, what)  # states are copies: exact
    assert len(graphs.captured_graphs) >= 6 and eager_steps >= 1
    kinds = {key.kind for key in graphs.captured_graphs}
    assert kinds == {"spec", "decode", "mixed"}, kinds


@pytest.mark.parametrize("variant", VARIANTS)
def test_graph_replay_equals_eager_unpadded_steps_for_every_variant(variant):
    """bf16, each kernel variant: a graph step (its bucket's padded plan, replayed) equals
    the same batch's eager step on its unpadded plan bit for bit, over steps that cross
    buckets (a small step after a large one replays over the large one's stale plan)."""
    graphs = build("triton", True, torch.bfloat16, variant)
    eager = build("triton", False, torch.bfloat16, variant)
    unpadded = attrs.evolve(CONFIG, graph_mode="none")
    rng = np.random.default_rng(2)
    for index, (rows, weights) in enumerate(STEPS):
        batch = random_batch(rng, rows, weights, max_prefill=120 if index == 7 else 24)
        plan, plain = compile_plan(batch, CONFIG), compile_plan(batch, unpadded)
        x = torch.randn(batch.num_tokens, CHANNELS, device="cuda").to(torch.bfloat16)
        residual = torch.randn_like(x)
        out_graph, out_eager = residual.clone(), residual.clone()
        graphs.step(plan, x, out_graph)
        eager.step(plain, x, out_eager)
        torch.cuda.synchronize()
        what = f"step {index} ({plan.graph or 'eager'})"
        torch.testing.assert_close(out_graph, out_eager, atol=0, rtol=0, msg=what)
        assert_states_close(graphs, eager, 0, what)


def test_many_steps_without_host_syncs_reuse_the_staging_ring_safely():
    """Thirty steps queued behind a sleeping GPU: the host runs ahead until a staging entry's
    ticket has not come back (the first wait outlasts the ring's poll and takes its
    synchronize fallback), so an entry rewritten too early would change results."""
    graphs, eager = build("triton", True, torch.float32), build("triton", False, torch.float32)
    rng = np.random.default_rng(7)
    kinds = ((4, 3, 2, 1), (1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0))
    plans = [  # index 3: long prefills, beyond every bucket (eager between replays)
        compile_plan(random_batch(rng, rows, kinds[i % 4], max_prefill=24 + 96 * (i == 3)), CONFIG)
        for i, rows in enumerate((40, 2, 30, 6, 12, 48, 5, 3))
    ]
    assert sum(plan.graph is not None for plan in plans) >= 6
    assert any(plan.graph is None and plan.num_tokens for plan in plans)
    graphs.warm_up(plans)
    order = rng.integers(0, len(plans), 30)
    steps = []
    for index in order:
        tokens = plans[index].num_tokens
        x = torch.randn(tokens, CHANNELS, device="cuda")
        steps.append((plans[index], x, torch.randn_like(x)))
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s: every replay below is queued behind it
    outs = []
    for plan, x, residual in steps:
        outs.append(residual.clone())
        graphs.step(plan, x, outs[-1])
    torch.cuda.synchronize()
    for number, (plan, x, residual) in enumerate(steps):
        want = residual.clone()
        eager.step(plan, x, want)
        torch.testing.assert_close(outs[number], want, atol=0, rtol=0, msg=f"step {number}")
    assert_states_close(graphs, eager, 0, "after the queued steps")
    issued, done = graphs._step_graphs._ring.tickets()
    assert issued.tolist() == done.tolist() and issued.min() > 0


def test_every_ticket_comes_back_after_the_replays():
    """Graph steps queued behind a short GPU sleep (the claims poll), then a synchronize:
    each staging entry's done word holds the last ticket written into it."""
    graphs = build("triton", True, torch.float32)
    rng = np.random.default_rng(3)
    plans = [
        compile_plan(random_batch(rng, rows, kinds, max_prefill=24), CONFIG)
        for rows, kinds in ((5, (4, 3, 2, 1)), (20, (1, 0, 0, 0)), (9, (0, 1, 0, 0)))
    ]
    assert all(plan.graph is not None for plan in plans)
    graphs.warm_up(plans)
    ring = graphs._step_graphs._ring
    issued, done = ring.tickets()
    assert issued.tolist() == done.tolist()  # each capture's warm-up ticket came back
    inputs = [torch.randn(plan.num_tokens, CHANNELS, device="cuda") for plan in plans]
    torch.cuda.synchronize()
    torch.cuda._sleep(20_000_000)  # ~10 ms, inside the ring's 50 ms poll
    for number in range(7):
        x = inputs[number % 3]
        graphs.step(plans[number % 3], x, torch.zeros_like(x))
    torch.cuda.synchronize()
    issued, done = ring.tickets()
    assert issued.tolist() == done.tolist()
    assert len(set(issued.tolist())) == ring.ring_size and issued.min() > 0


def test_staging_ring_is_pinned_and_lets_go_cleanly():
    """A graph of a step's upload kernel over ring entry 0: the replay reads plan and
    ticket as they are at replay time and stores the ticket back; claim() hands out the
    lowest free entry, and with every entry in use waits for the oldest, polling and past
    its timeout; a ring dropped with a replay queued waits for it."""
    rings = [StagingRing(4000, torch.device("cuda")) for _ in range(3)]
    ring = rings[0]
    tensor, _ = ring.host_int32(0, 1000)
    source, done = ring.graph_source(0, 1000), ring.done_word(0)
    assert tensor.is_pinned() and source.is_pinned() and done.is_pinned()
    device = torch.zeros(1001, dtype=torch.int32, device="cuda")
    warm = torch.zeros_like(device)  # compiles the kernel outside the capture, on entry 1
    pull_plan(ring.graph_source(1, 1000), warm, ring.done_word(1))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pull_plan(source, device, done)
    assert not device.any() and not done.any()  # captured, not run
    assert [ring.claim(), ring.claim()] == [0, 0]  # never-used entries are free
    ticket = ring.write(0, np.arange(1000, dtype=np.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert device.tolist() == [*range(1000), ticket] and done.item() == ticket
    for cycles in (20_000_000, 400_000_000):  # ~10 ms (polled) and ~0.2 s (past 50 ms)
        torch.cuda._sleep(cycles)
        ticket = ring.write(0, np.full(1000, cycles, dtype=np.int32))
        graph.replay()
        assert ring.claim() == 1  # entry 0 is read by the queued replay
        other = ring.write(1, np.zeros(1000, dtype=np.int32))  # never launched
        assert ring.claim() == 0  # every entry in use: the oldest, once its ticket is back
        issued, done_words = ring.tickets()
        assert issued[0] == done_words[0] == ticket
        assert device.tolist() == [cycles] * 1000 + [ticket]
        ring.done_word(1).fill_(other)  # plays entry 1's copy-back
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)
    ring.write(0, np.zeros(1000, dtype=np.int32))
    graph.replay()
    del ring, rings, tensor, source, done  # the finalizer waits for the queued replay
    gc.collect()
    assert torch.cuda.current_stream().query()  # so nothing is left queued
    del graph


def test_signature_mismatch_refuses_to_replay():
    graphs = build("triton", True, torch.float32)
    batch = StepBatch(
        query_lens=[4, 2, 1],
        num_computed_tokens=[9, 3, 5],
        slots=[[1, 2, 3]] * 3,
        num_draft_tokens=[3, 1, 0],
        num_accepted_tokens=[2, 4, 1],
    )
    x = torch.randn(7, CHANNELS, device="cuda")
    states = [s.clone() for s in graphs.conv_states]
    graphs.warm_up([compile_plan(batch, CONFIG)])  # captures without touching any state
    assert len(graphs.captured_graphs) == 1
    for before, after in zip(states, graphs.conv_states, strict=True):
        assert torch.equal(before, after)
    graphs.step(compile_plan(batch, CONFIG), x, torch.zeros_like(x))
    other = PlannerConfig(
        num_spec_tokens=3,
        graph_mode="mixed",
        graph_sizes=CONFIG.graph_sizes,
        max_num_seqs=48,
        prefill_tile_tokens=32,
    )
    plan = compile_plan(batch, other)
    assert plan.graph in graphs.captured_graphs
    states = [s.clone() for s in graphs.conv_states]
    residual = torch.zeros_like(x)
    with pytest.raises(ReplayMismatchError, match="tile_tokens: captured 16, plan has 32"):
        graphs.step(plan, x, residual)
    torch.cuda.synchronize()
    assert not residual.any()
    for before, after in zip(states, graphs.conv_states, strict=True):
        assert torch.equal(before, after)


def test_vllm_builder_uploads_to_the_gpu():
    config = PlannerConfig(num_spec_tokens=3, graph_mode="full", max_num_seqs=16)
    builder = PlanMetadataBuilder(config, "cuda")

    class Metadata:  # the fields of vLLM's CommonAttentionMetadata the planner reads
        query_start_loc_cpu = torch.tensor([0, 4, 5, 12, 16], dtype=torch.int32)
        query_start_loc = query_start_loc_cpu.cuda()
        seq_lens = torch.tensor([9, 4, 7, 20], dtype=torch.int32).cuda()
        block_table_tensor = torch.tensor([[3], [1], [2], [7]], dtype=torch.int32).cuda()
        num_reqs, num_actual_tokens = 4, 16

        def compute_num_computed_tokens(self):
            return torch.tensor([5, 3, 0, 16], dtype=torch.int32).cuda()

    m = Metadata()
    accepted = torch.tensor([2, 1, 1, 4], dtype=torch.int32).cuda()
    drafts = torch.tensor([3, -1, -1, 3], dtype=torch.int32)
    md = builder.build(0, m, num_accepted_tokens=accepted, num_decode_draft_tokens_cpu=drafts)
    plan = plan_from_common_metadata(
        m, num_accepted_tokens=accepted, num_decode_draft_tokens_cpu=drafts, config=config
    )
    for name, value in seed_view(plan).items():
        got = getattr(md, name)
        if isinstance(value, np.ndarray):
            assert got.device.type == "cuda", name
            np.testing.assert_array_equal(got.cpu().numpy(), value, err_msg=name)
        else:
            assert got == value, name
