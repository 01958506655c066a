"""The vLLM builder on a CUDA GPU: builds never synchronize, every field is the seed's,
and the stepplan kernels over the builder's plan buffer agree replayed, eager and with
the reference, across buckets.

Run on a CUDA machine: ``python -m pytest -q -m gpu tests/test_vllm_builder_gpu.py``.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
from vllm_cases import CONFIGS, FakeCommonMetadata, Step, assert_seed_exact, expected, random_step

from stepplan.executor import reference
from stepplan.executor.kernels import launch_shape, launch_short_conv
from stepplan.executor.vllm import PlanMetadataBuilder, StepShare
from stepplan.planner import PlannerConfig, StepBatch, compile_plan

pytestmark = pytest.mark.gpu

GROUPS = 3
WEIGHTS = [(7, 6, 4, 3), (1, 0, 0, 0), (0, 1, 0, 0), (1, 0, 1, 1), (0, 0, 1, 0), (1, 1, 0, 0)]


def cuda_metadata(step: Step, group: int, first: FakeCommonMetadata | None = None):
    """``step``'s metadata for ``group`` on the GPU; the shared fields ``first``'s."""
    m = step.metadata("cuda", group)
    if first is not None:
        m = attrs.evolve(m, query_start_loc=first.query_start_loc, seq_lens=first.seq_lens)
    return m


def prepared_steps(rng, config, count: int):
    """Steps with every input already on the GPU (made outside the sync checks)."""
    steps = []
    for index in range(count):
        step = random_step(
            rng, int(rng.integers(1, 40)), config.query_len_max, WEIGHTS[index % 6], GROUPS
        )
        if not (step.q > 0).any():
            continue
        first = cuda_metadata(step, 0)
        metadata = [first] + [cuda_metadata(step, g, first) for g in range(1, GROUPS)]
        steps.append((step, metadata, step.device_accepted("cuda"), step.host_drafts()))
    torch.cuda.synchronize()
    return steps


def make_builders(config, *, direct: bool = True, tables=None):
    share = StepShare(
        config, "cuda", num_groups=GROUPS, max_num_tokens=2048, direct_launches=direct
    )
    if tables is not None:
        share.register_block_tables(tables)
    return share, [PlanMetadataBuilder(config, "cuda", share=share, group=g) for g in range(GROUPS)]


def build_all(builders, metadata, accepted, drafts):
    return [
        b.build(0, m, num_accepted_tokens=accepted, num_decode_draft_tokens_cpu=drafts)
        for b, m in zip(builders, metadata, strict=True)
    ]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"Q{c.query_len_max}-{c.graph_mode}")
def test_builds_never_synchronize_and_are_seed_exact(config):
    rng = np.random.default_rng(0)
    share, builders = make_builders(config)
    steps = prepared_steps(rng, config, 24)
    build_all(builders, *steps[0][1:])  # compiles the kernels (not a step's work)
    torch.cuda.synchronize()
    for step, metadata, accepted, drafts in steps:
        torch.cuda.set_sync_debug_mode("error")
        try:
            built = build_all(builders, metadata, accepted, drafts)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        for group, (md, m) in enumerate(zip(built, metadata, strict=True)):
            assert_seed_exact(md, expected(step, config, group), m, drafts, "cuda")
    assert share.num_steps == len(steps) + 1


def test_capture_builds_never_synchronize():
    config = CONFIGS[0]
    _, builders = make_builders(config)
    rng = np.random.default_rng(4)
    q = rng.integers(1, 5, 16).astype(np.int32)
    drawn = random_step(rng, 16, 4, (1, 0, 0, 0))
    step = Step(q, drawn.computed[:16], drawn.slots[:, :16], q - 1, q, 0)
    m = step.metadata("cuda")
    builders[0].build_for_cudagraph_capture(m)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        md = builders[0].build_for_cudagraph_capture(m)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert_seed_exact(
        md, expected(step, config, capture=True), m, md.num_decode_draft_tokens_cpu, "cuda"
    )


@pytest.mark.parametrize("registered", [False, True])
def test_builds_with_the_gpu_busy_read_the_step_in_stream_order(registered):
    """Builds queued behind a long kernel, more steps than the host would run ahead of
    a real engine: each step's fields come out right once the GPU catches up."""
    config = CONFIGS[0]
    rng = np.random.default_rng(1)
    tables = [torch.zeros(64, 4, dtype=torch.int32, device="cuda") for _ in range(GROUPS)]
    _, builders = make_builders(config, tables=tables if registered else None)
    steps = prepared_steps(rng, config, 12)
    build_all(builders, *steps[0][1:])
    outputs = []
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # ~25 ms: every build below is queued behind it
    for step, metadata, accepted, drafts in steps:
        rows = len(step.q)
        if registered:  # the engine's own copy into its persistent tables, in stream order
            for group, table in enumerate(tables):
                table[:rows, 0].copy_(metadata[group].block_table_tensor[:, 0])
            metadata = [
                attrs.evolve(m, block_table_tensor=t[:rows])
                for m, t in zip(metadata, tables, strict=True)
            ]
        built = build_all(builders, metadata, accepted, drafts)
        # Copies in stream order: what each step's kernels would have read.
        outputs.append([{name: _clone(getattr(md, name)) for name in md._fields} for md in built])
    torch.cuda.synchronize()
    for (step, *_), fields in zip(steps, outputs, strict=True):
        for group, copied in enumerate(fields):
            want = expected(step, config, group)
            for name, value in want.items():
                if isinstance(value, np.ndarray):
                    np.testing.assert_array_equal(copied[name].cpu().numpy(), value, err_msg=name)


def _clone(value):
    return value.clone() if isinstance(value, torch.Tensor) and value.is_cuda else value


def test_direct_launches_write_what_triton_launches_write():
    config = CONFIGS[0]
    rng = np.random.default_rng(2)
    steps = prepared_steps(rng, config, 16)
    direct, direct_builders = make_builders(config, direct=True)
    plain, plain_builders = make_builders(config, direct=False)
    for _, metadata, accepted, drafts in steps:
        build_all(direct_builders, metadata, accepted, drafts)
        build_all(plain_builders, metadata, accepted, drafts)
        torch.cuda.synchronize()
        staged = direct.buffer.regions.staged
        assert torch.equal(direct.buffer.words[staged:], plain.buffer.words[staged:])
        assert torch.equal(direct.buffer.words[64:staged], plain.buffer.words[64:staged])


class PersistentInputs:
    """Device inputs in persistent buffers, sliced per step, as vLLM keeps them: the same
    addresses every step, so the gather kernels' launches recur and replay as graphs."""

    def __init__(self, rows: int) -> None:
        self.query_start = torch.zeros(rows + 1, dtype=torch.int32, device="cuda")
        self.seq_lens = torch.zeros(rows, dtype=torch.int32, device="cuda")
        self.accepted = torch.ones(rows, dtype=torch.int32, device="cuda")
        self.tables = [
            torch.zeros(rows, 2, dtype=torch.int32, device="cuda") for _ in range(GROUPS)
        ]

    def step(self, step: Step, metadata: list) -> tuple[list, torch.Tensor]:
        """``metadata`` over the persistent buffers (their values copied in, in stream
        order) and the accepted counts' view."""
        rows = len(step.q)
        self.query_start[: rows + 1].copy_(metadata[0].query_start_loc)
        self.seq_lens[:rows].copy_(metadata[0].seq_lens)
        self.accepted[:rows].copy_(step.device_accepted("cuda"))
        for m, table in zip(metadata, self.tables, strict=True):
            table[:rows].copy_(m.block_table_tensor)
        views = dict(query_start_loc=self.query_start[: rows + 1], seq_lens=self.seq_lens[:rows])
        moved = [
            attrs.evolve(m, block_table_tensor=t[:rows], **views)
            for m, t in zip(metadata, self.tables, strict=True)
        ]
        return moved, self.accepted[:rows]


def test_graph_replays_write_what_direct_launches_write_and_never_synchronize():
    """Recurring launches (persistent inputs, a ring of two entries) replay as graphs,
    captured without a synchronization; every field stays the seed's, and the buffer
    equals that of a share that launches every kernel directly."""
    config = CONFIGS[0]
    rng = np.random.default_rng(5)
    steps = prepared_steps(rng, config, 30)
    inputs = PersistentInputs(64)
    shares = {}
    for graphs in (True, False):
        share = StepShare(
            config, "cuda", num_groups=GROUPS, max_num_tokens=2048, ring_size=2,
            graph_launches=graphs,
        )  # fmt: skip
        builders = [
            PlanMetadataBuilder(config, "cuda", share=share, group=g) for g in range(GROUPS)
        ]
        shares[graphs] = (share, builders)
    for step, metadata, _, drafts in steps:
        moved, accepted = inputs.step(step, metadata)
        torch.cuda.synchronize()
        built = {}
        for graphs, (_, builders) in shares.items():
            torch.cuda.set_sync_debug_mode("error")
            try:
                built[graphs] = build_all(builders, moved, accepted, drafts)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
        for group, (md, m) in enumerate(zip(built[True], moved, strict=True)):
            assert_seed_exact(md, expected(step, config, group), m, drafts, "cuda")
        replayed, direct = (shares[g][0].buffer.words for g in (True, False))
        assert torch.equal(replayed[64:], direct[64:])
    launcher = shares[True][0].buffer._launcher
    assert launcher.num_captures >= 3  # the opening and the further groups
    assert launcher.num_replays > len(steps)
    assert shares[False][0].buffer._launcher.num_replays == 0


def test_builds_inside_an_engine_capture_launch_into_it():
    """Once its launches replay as graphs, a step built while the engine captures a graph
    launches directly into that capture: replaying the engine's graph writes the fields."""
    config = CONFIGS[0]
    step, metadata, _, drafts = prepared_steps(np.random.default_rng(6), config, 1)[0]
    inputs = PersistentInputs(64)
    moved, accepted = inputs.step(step, metadata)
    share = StepShare(config, "cuda", num_groups=GROUPS, max_num_tokens=2048, ring_size=1)
    builders = [PlanMetadataBuilder(config, "cuda", share=share, group=g) for g in range(GROUPS)]
    for _ in range(4):  # compiled, seen, captured, replayed
        share.new_step()
        build_all(builders, moved, accepted, drafts)
        torch.cuda.synchronize()
    launcher = share.buffer._launcher
    assert launcher.num_replays > 0
    replays = launcher.num_replays
    engine_graph = torch.cuda.CUDAGraph()
    share.new_step()
    with torch.cuda.graph(engine_graph):
        built = build_all(builders, moved, accepted, drafts)
    assert launcher.num_replays == replays  # launched into the capture, not replayed
    regions = share.buffer.regions
    share.buffer.words[regions.spec_qsl : regions.tables] = -7  # what the kernels write
    engine_graph.replay()
    torch.cuda.synchronize()
    for group, (md, m) in enumerate(zip(built, moved, strict=True)):
        assert_seed_exact(md, expected(step, config, group), m, drafts, "cuda")


# --- the kernels over the builder's plan buffer ------------------------------------------

CHANNELS, TAPS, DILATION, SLOTS, LAYERS = 200, 4, 3, 80, 2
GRAPH_CONFIG = PlannerConfig(
    num_spec_tokens=3,
    graph_mode="mixed",
    graph_sizes=(8, 16, 32, 64, 128),
    max_num_seqs=32,
    prefill_tile_tokens=16,
)


def operands(seed: int):
    gen = torch.Generator().manual_seed(seed)
    window = (TAPS - 1) * DILATION + GRAPH_CONFIG.query_len_max - 1
    weights = [torch.randn(CHANNELS, TAPS, generator=gen).cuda() for _ in range(LAYERS)]
    # vLLM's [slot, window, channel] memory, seen as [slot, channel, window].
    states = [
        torch.randn(SLOTS, window, CHANNELS, generator=gen).cuda().permute(0, 2, 1)
        for _ in range(GROUPS * LAYERS)
    ]
    return weights, states


def run_layers(md_by_group, x, residual, weights, states):
    """Every group's layers over its metadata's plan buffer (one launch shape per step)."""
    shape = launch_shape(md_by_group[0].plan)
    for group, md in enumerate(md_by_group):
        for layer, weight in enumerate(weights):
            state = states[group * LAYERS + layer]
            launch_short_conv(
                shape, md.plan_buffer, x, residual, state, weight, dilation=DILATION, group=group
            )


def oracle(step: Step, config: PlannerConfig, x, residual, weights, states):
    """The reference convolution over the plan compiled from every field on the host."""
    batch = StepBatch(
        query_lens=step.q,
        num_computed_tokens=step.computed,
        slots=np.where(step.q > 0, step.slots, 0),
        num_draft_tokens=step.drafts,
        num_accepted_tokens=step.accepted,
        allow_null_slots=True,
    )
    plan = compile_plan(batch, attrs.evolve(config, graph_mode="none"))
    for group in range(GROUPS):
        for layer, weight in enumerate(weights):
            state = states[group * LAYERS + layer]
            reference.short_conv(plan, x, residual, state, weight, dilation=DILATION, group=group)


def graph_step(rng, rows: int, weights, tokens_cap: int) -> Step:
    step = random_step(rng, rows, 4, weights, GROUPS)
    slots = np.where(
        step.q > 0,
        np.stack([rng.permutation(np.arange(1, SLOTS))[: len(step.q)] for _ in range(GROUPS)]),
        -1,
    )
    accepted = np.where(step.drafts >= 0, np.minimum(step.accepted, step.q), 1)
    q = np.minimum(step.q, 12)  # prefills of at most 12 tokens keep steps in the buckets
    drafts = np.where(step.drafts >= 0, q - 1, -1)
    return Step(
        q.astype(np.int32),
        step.computed,
        slots.astype(np.int32),
        drafts.astype(np.int32),
        accepted.astype(np.int32),
        0,
    )


def test_graph_replay_equals_eager_equals_reference_over_the_builders_buffer():
    """Per bucket one CUDA graph, captured over a first step's metadata; every later step
    of the bucket (a small one after a large one included) replays it over the fields
    its own build wrote into the same buffers."""
    rng = np.random.default_rng(5)
    share = StepShare(GRAPH_CONFIG, "cuda", num_groups=GROUPS, max_num_tokens=512)
    builders = [
        PlanMetadataBuilder(GRAPH_CONFIG, "cuda", share=share, group=g) for g in range(GROUPS)
    ]
    weights, states = operands(0)
    x = torch.randn(512, CHANNELS, device="cuda")
    residual = torch.zeros_like(x)
    graphs: dict = {}
    plan_shapes = ((30, (1, 0, 0, 0)), (3, (1, 0, 0, 0)), (28, (0, 1, 0, 0)), (2, (0, 1, 0, 0)),
                   (20, (2, 2, 1, 0)), (5, (2, 2, 1, 1)), (31, (1, 0, 0, 0)), (1, (1, 0, 0, 0)),
                   (12, (1, 1, 1, 0)), (30, (2, 2, 1, 0)))  # fmt: skip
    replays = 0
    for number, (rows, kinds) in enumerate(plan_shapes):
        step = graph_step(rng, rows, kinds, 512)
        if not (step.q > 0).any():
            continue
        first = cuda_metadata(step, 0)
        metadata = [first] + [cuda_metadata(step, g, first) for g in range(1, GROUPS)]
        tokens = int(step.q.sum())
        x[:tokens].copy_(torch.randn(tokens, CHANNELS, device="cuda"))
        start = torch.randn(tokens, CHANNELS, device="cuda")
        built = build_all(builders, metadata, step.device_accepted("cuda"), step.host_drafts())
        key = built[0].plan.graph
        eager_states = [s.clone() for s in states]
        eager_residual = residual.clone()
        eager_residual[:tokens] = start
        run_layers(built, x, eager_residual, weights, eager_states)
        oracle_states = [s.clone() for s in states]
        oracle_residual = residual.clone()
        oracle_residual[:tokens] = start
        oracle(step, GRAPH_CONFIG, x, oracle_residual, weights, oracle_states)
        what = f"step {number} ({key or 'eager'})"
        if key is not None:
            if key not in graphs:
                graphs[key] = _capture(built, x, residual, weights, states)
            residual[:tokens] = start
            graphs[key].replay()
            replays += 1
            torch.cuda.synchronize()
            torch.testing.assert_close(
                residual[:tokens], eager_residual[:tokens], atol=0, rtol=0, msg=what
            )
            for a, b in zip(states, eager_states, strict=True):
                torch.testing.assert_close(a, b, atol=0, rtol=0, msg=what)
        else:
            for a, b in zip(states, eager_states, strict=True):
                a.copy_(b)
        torch.testing.assert_close(
            eager_residual[:tokens], oracle_residual[:tokens], atol=1e-5, rtol=1e-5, msg=what
        )
        for a, b in zip(eager_states, oracle_states, strict=True):
            torch.testing.assert_close(a, b, atol=0, rtol=0, msg=what)
    assert replays >= 5 and len(graphs) >= 3


def _capture(built, x, residual, weights, states):
    """A graph of every group's layers over ``built``'s plan buffers (run once on copies
    first: capture runs nothing, and the warm-up's launches must not touch the states)."""
    scratch_states = [s.clone() for s in states]
    scratch = residual.clone()
    run_layers(built, x, scratch, weights, scratch_states)  # compiles the kernels
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_layers(built, x, residual, weights, states)
    return graph
