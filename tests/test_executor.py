"""The executor on the CPU: triton (interpreted) eager equals the reference, errors are clear."""

from __future__ import annotations

import threading

import attrs
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.executor import (
    BACKENDS,
    Executor,
    ReferenceBackend,
    ReplayMismatchError,
    StepGraphs,
    TritonBackend,
    check_replay,
)
from stepplan.executor.graphs import _Captured
from stepplan.executor.kernels import VARIANTS, launch_shape
from stepplan.executor.staging_kernel import pull_plan
from stepplan.executor.upload import PinnedUpload, StagingRing
from stepplan.planner import PlannerConfig, StepBatch, compile_plan

CHANNELS, TAPS, DILATION, SLOTS = 12, 3, 2, 24
LAYER_GROUPS = (0, 1, 1)  # three layers, two groups


def random_batch(
    rng: np.random.Generator,
    num_rows: int,
    q_max: int,
    groups: int,
    kind_weights: tuple[float, ...] = (0.35, 0.3, 0.2, 0.15),
    max_prefill: int = 20,
) -> StepBatch:
    """Random valid rows of the kinds (spec, decode, prefill, padding) in random order."""
    kinds = rng.choice(4, size=num_rows, p=np.array(kind_weights) / sum(kind_weights))
    spec_q = 1 + rng.integers(0, q_max, size=num_rows)
    prefill_q = rng.integers(2, max_prefill + 1, num_rows)
    q = np.choose(kinds, [spec_q, np.ones(num_rows, int), prefill_q, 0 * kinds])
    computed = rng.integers(0, 40, size=num_rows) * (rng.random(num_rows) < 0.7)
    computed = np.where(kinds == 0, computed + 1, np.where(kinds == 3, 0, computed))
    pool = np.arange(1, max(SLOTS, num_rows + 1))
    slots = np.stack([rng.permutation(pool)[:num_rows] for _ in range(groups)])
    return StepBatch(
        query_lens=q,
        num_computed_tokens=computed,
        slots=np.where(kinds == 3, 0, slots),
        num_draft_tokens=np.where(kinds == 0, q - 1, -1),
        num_accepted_tokens=np.where(kinds == 0, rng.integers(1, q_max + 1, num_rows), 1),
    )


def make_executor(
    backend: str, config: PlannerConfig, seed: int = 0, kernel_variant: str | None = None
) -> Executor:
    """Three layers over two groups, fp32, states in vLLM's [slot, window, channel] memory."""
    gen = torch.Generator().manual_seed(seed)
    window = (TAPS - 1) * DILATION + config.query_len_max - 1
    states = [
        torch.randn(SLOTS, window, CHANNELS, generator=gen).permute(0, 2, 1) for _ in LAYER_GROUPS
    ]
    return Executor(
        weights=[torch.randn(CHANNELS, TAPS, generator=gen) for _ in LAYER_GROUPS],
        layer_groups=LAYER_GROUPS,
        conv_states=states,
        dilation=DILATION,
        config=config,
        backend=backend,
        kernel_variant=kernel_variant,
    )


CONFIGS = (
    PlannerConfig(num_spec_tokens=2, graph_mode="mixed", max_num_seqs=16, prefill_tile_tokens=8),
    PlannerConfig(num_spec_tokens=2, graph_mode="full", max_num_seqs=16, prefill_tile_tokens=8),
    PlannerConfig(num_spec_tokens=2, graph_mode="none", max_num_seqs=16, prefill_tile_tokens=8),
)


def assert_same_state(a: Executor, b: Executor) -> None:
    for layer, (sa, sb) in enumerate(zip(a.conv_states, b.conv_states, strict=True)):
        torch.testing.assert_close(sa, sb, atol=1e-5, rtol=1e-5, msg=f"state of layer {layer}")


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), config_index=st.integers(0, len(CONFIGS) - 1))
def test_eager_triton_equals_reference_over_steps(seed, config_index):
    """A large step, then smaller ones on the same persistent plan buffer: stale bytes are inert."""
    config = CONFIGS[config_index]
    rng = np.random.default_rng(seed)
    triton_ex, reference_ex = make_executor("triton", config), make_executor("reference", config)
    for num_rows in (12, 3, 1, 7):
        batch = random_batch(rng, num_rows, config.query_len_max, groups=2)
        plan = compile_plan(batch, config)
        extra = int(rng.integers(0, 4))  # engine padding rows nobody may touch
        x = torch.randn(batch.num_tokens + extra, CHANNELS)
        residual = torch.randn_like(x)
        got, want = residual.clone(), residual.clone()
        triton_ex.step(plan, x, got)
        reference_ex.step(plan, x, want)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[batch.num_tokens :], residual[batch.num_tokens :])
        assert_same_state(triton_ex, reference_ex)


def test_inert_plan_touches_nothing():
    config = CONFIGS[0]
    executor = make_executor("triton", config)
    batch = random_batch(np.random.default_rng(3), 10, config.query_len_max, groups=2)
    plan = compile_plan(batch, config)
    assert plan.graph is not None
    before = [s.clone() for s in executor.conv_states]
    x = torch.randn(plan.padded_tokens, CHANNELS)
    residual = torch.randn_like(x)
    kept = residual.clone()
    buffer = executor.graph_plan_buffer(plan)  # as StepGraphs warms up before capture
    buffer.copy_(torch.from_numpy(plan.layout.inert_buffer()))
    executor.prepare_graphed(plan, buffer)
    executor.run_layers(x, residual)
    torch.testing.assert_close(residual, kept, atol=0, rtol=0)
    for layer, state in enumerate(executor.conv_states):
        torch.testing.assert_close(state, before[layer], atol=0, rtol=0)


def _one_key_two_tile_sizes() -> tuple[PlannerConfig, PlannerConfig, StepBatch]:
    """Two configs that differ only in prefill tile size, and a pure spec batch (a spec
    graph, whose key has no tiles): both configs give it the same graph key."""
    other = PlannerConfig(
        num_spec_tokens=2, graph_mode="mixed", max_num_seqs=16, prefill_tile_tokens=16
    )
    batch = StepBatch(
        query_lens=[3, 1, 3],
        num_computed_tokens=[4, 2, 9],
        slots=[[1, 2, 3], [4, 5, 6]],
        num_draft_tokens=[2, 0, 2],
        num_accepted_tokens=[1, 1, 3],
    )
    return CONFIGS[0], other, batch


def test_replay_signature_mismatch_names_the_fields():
    """Same batch, same graph key, other tile size: replaying the first graph would be wrong."""
    base, other, batch = _one_key_two_tile_sizes()
    executor = make_executor("triton", base)
    first, second = compile_plan(batch, base), compile_plan(batch, other)
    assert first.graph == second.graph and first.graph is not None
    captured = executor.signature(first)
    check_replay(captured, executor.signature(compile_plan(batch, base)))  # equal: no error
    with pytest.raises(ReplayMismatchError, match="tile_tokens: captured 8, plan has 16"):
        check_replay(captured, executor.signature(second))
    mixed = compile_plan(random_batch(np.random.default_rng(9), 9, 3, groups=2), base)
    assert mixed.graph is not None and mixed.graph != first.graph
    with pytest.raises(ReplayMismatchError, match="layout"):
        check_replay(captured, executor.signature(mixed))


def test_bad_plans_and_operands_are_refused():
    config = CONFIGS[0]
    executor = make_executor("triton", config)
    one_group = compile_plan(
        StepBatch(
            query_lens=[1],
            num_computed_tokens=[0],
            slots=[1],
            num_draft_tokens=[-1],
            num_accepted_tokens=[1],
        ),
        config,
    )
    with pytest.raises(ValueError, match="plan: has 1 layer groups, the executor has 2"):
        executor.prepare(one_group)
    two = compile_plan(random_batch(np.random.default_rng(0), 4, 3, groups=2), config)
    x = torch.randn(two.batch.num_tokens, CHANNELS)
    with pytest.raises(ValueError, match=r"x: must be torch\.float32"):
        executor.step(two, x.double(), x.clone())
    with pytest.raises(ValueError, match=r"residual: must be \[engine_tokens"):
        executor.step(two, x, x[:, :4].clone())
    with pytest.raises(RuntimeError, match="conv\\(\\) before prepare"):
        make_executor("reference", config).conv(0, x, x.clone())


def test_bad_geometry_is_refused():
    config = CONFIGS[0]
    weight = torch.zeros(CHANNELS, TAPS)
    state = torch.zeros(SLOTS, CHANNELS, 6)  # L + Q - 1 = 4 + 2
    kwargs = dict(dilation=DILATION, config=config, backend="reference")
    Executor(weights=[weight], layer_groups=[0], conv_states=[state], **kwargs)
    with pytest.raises(
        ValueError, match=r"conv_states\[0\]: must be a \[num_slots, C=12, W >= 6\]"
    ):
        Executor(weights=[weight], layer_groups=[0], conv_states=[state[:, :, :5]], **kwargs)
    with pytest.raises(ValueError, match=r"layer_groups: must number groups 0\.\.G-1"):
        Executor(weights=[weight] * 2, layer_groups=[0, 2], conv_states=[state] * 2, **kwargs)
    with pytest.raises(ValueError, match="conv_states: has 1 entries for 2 layers"):
        Executor(weights=[weight] * 2, layer_groups=[0, 0], conv_states=[state], **kwargs)
    with pytest.raises(ValueError, match="backend"):
        Executor(
            weights=[weight], layer_groups=[0], conv_states=[state], **{**kwargs, "backend": "x"}
        )
    for backend in BACKENDS:  # graphs need the triton backend on CUDA tensors; these are CPU
        with pytest.raises(ValueError, match="use_graphs"):
            Executor(
                weights=[weight],
                layer_groups=[0],
                conv_states=[state],
                use_graphs=True,
                **{**kwargs, "backend": backend},
            )


def test_each_backend_name_is_a_class_that_owns_its_conv():
    """The names Executor takes map to the backend classes; the reference one keeps no
    device plan buffer and refuses what only graphs need."""
    assert (TritonBackend.name, ReferenceBackend.name) == BACKENDS
    config = CONFIGS[0]
    plan = compile_plan(random_batch(np.random.default_rng(3), 4, 3, groups=2), config)
    triton, reference = make_executor("triton", config), make_executor("reference", config)
    assert all(w.stride(0) == 1 for w in triton.weights)  # channel-contiguous copies
    assert triton.graph_plan_buffer(plan).shape == (plan.layout.size,)
    with pytest.raises(RuntimeError, match="reference backend has no plan buffer"):
        reference.graph_plan_buffer(plan)
    with pytest.raises(RuntimeError, match="reference backend is never graphed"):
        reference.prepare_graphed(plan, torch.zeros(plan.layout.size, dtype=torch.int32))


def test_pinned_upload_round_trips_through_its_ring():
    upload = PinnedUpload(64, torch.device("cpu"), ring_size=2)
    for step in range(5):
        values = np.arange(step, step + 3 + step, dtype=np.int32)
        view = upload.upload_int32(values)
        assert view.data_ptr() == upload.device_buffer.data_ptr()
        assert view.tolist() == values.tolist()
    with pytest.raises(ValueError, match="exceed the 64 bytes"):
        upload.upload_int32(np.zeros(17, dtype=np.int32))
    with pytest.raises(RuntimeError, match="commit\\(\\) without host_bytes"):
        upload.commit(4)
    upload.host_bytes()
    with pytest.raises(RuntimeError, match="twice"):
        upload.host_bytes()
    with pytest.raises(ValueError, match=r"^ring_size: must be positive, got 0"):
        PinnedUpload(64, torch.device("cpu"), ring_size=0)
    with pytest.raises(ValueError, match=r"^capacity_bytes: must be positive, got 0"):
        PinnedUpload(0, torch.device("cpu"))


def test_staging_ring_entries_are_separate_memory():
    ring = StagingRing(40, torch.device("cpu"), ring_size=3)
    ring.write(0, np.zeros(3, dtype=np.int32))
    assert [ring.claim() for _ in range(3)] == [0, 0, 0]  # nothing waits: every entry free
    views = [ring.host_int32(index, 10) for index in range(3)]
    for index, (tensor, array) in enumerate(views):
        array[:] = index + 1  # the numpy view and the tensor are one memory
        assert tensor.tolist() == [index + 1] * 10
    assert [tensor[0].item() for tensor, _ in views] == [1, 2, 3]  # entries don't overlap
    with pytest.raises(ValueError, match="size: 11 int32 exceed the 40 bytes"):
        ring.host_int32(0, 11)
    with pytest.raises(ValueError, match="size: 11 int32 exceed the 40 bytes"):
        ring.write(0, np.zeros(11, dtype=np.int32))
    with pytest.raises(ValueError, match=r"^ring_size: must be positive, got 0"):
        StagingRing(40, torch.device("cpu"), ring_size=0)
    with pytest.raises(ValueError, match=r"^capacity_bytes: must be a multiple of 4, got 42"):
        StagingRing(42, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"^timeout_s: must be at least 0, got -1"):
        StagingRing(40, torch.device("cpu"), timeout_s=-1)
    with pytest.raises(ValueError, match="wait_for_tickets: a CUDA ring must wait"):
        StagingRing(40, torch.device("cuda"), wait_for_tickets=False)


def test_staging_ring_writes_the_plan_then_a_fresh_ticket():
    ring = StagingRing(40, torch.device("cpu"), ring_size=2)
    tickets = []
    for step in range(5):
        index = ring.claim()
        plan = np.arange(step, step + 3 + step, dtype=np.int32)
        tickets.append(ring.write(index, plan))
        source = ring.graph_source(index, plan.size)  # what the graph's first node copies
        assert source.tolist() == [*plan.tolist(), tickets[-1]]
        assert ring.host_int32(index, plan.size)[1].tolist() == plan.tolist()
        assert ring.tickets()[0][index] == tickets[-1]
    assert tickets == [1, 2, 3, 4, 5]  # fresh per write, never 0 (a never-used entry's word)
    ring._ticket = 2**31 - 2  # the counter near the int32 limit: it wraps to 1, never 0
    assert [ring.write(0, np.zeros(1, dtype=np.int32)) for _ in range(3)] == [2**31 - 1, 1, 2]
    assert ring.graph_source(0, 1).tolist() == [0, 2]  # the last ticket, after the plan


def test_staging_ring_hands_out_the_lowest_entry_whose_ticket_came_back():
    """A CPU ring that waits, with the test playing the graphs' ticket write into ``done``."""
    ring = StagingRing(40, "cpu", ring_size=3, timeout_s=0.0, wait_for_tickets=True)

    def copy_back(index: int, size: int) -> None:  # what a replay's upload kernel does last
        ring.done_word(index).copy_(ring.graph_source(index, size)[size:])

    assert [ring.claim(), ring.claim()] == [0, 0]  # a claim reserves nothing; a write does
    first = ring.write(0, np.arange(4, dtype=np.int32))
    assert ring.claim() == 1
    second = ring.write(1, np.arange(6, dtype=np.int32))
    copy_back(1, 6)
    assert ring.claim() == 1  # the lowest free entry, not the next in turn
    third = ring.write(1, np.arange(2, dtype=np.int32))
    assert ring.claim() == 2
    fourth = ring.write(2, np.arange(8, dtype=np.int32))
    assert len({first, second, third, fourth}) == 4
    # Every entry in use: the claim waits for the one written longest ago (entry 0).
    with pytest.raises(
        RuntimeError,
        match=rf"staging entry 0: ticket {first} did not come back \(done word "
        r"holds 0\) within 0.0 s",
    ):
        ring.claim()
    copy_back(2, 8)
    assert ring.claim() == 2  # the failed claim reserved nothing
    copy_back(0, 4)
    assert ring.claim() == 0
    fifth = ring.write(0, np.arange(10, dtype=np.int32))
    ring.write(2, np.arange(3, dtype=np.int32))
    ring.done_word(0).fill_(first)  # an older copy-back frees nothing
    with pytest.raises(RuntimeError, match=f"staging entry 1: ticket {third} .* holds {second}"):
        ring.claim()
    with pytest.raises(RuntimeError, match="staging entry 0"):
        ring.wait_all()
    copy_back(0, 10)
    copy_back(1, 2)
    copy_back(2, 3)
    ring.wait_all()
    assert ring.claim() == 0
    issued, done = ring.tickets()
    assert issued.tolist() == done.tolist()
    assert issued[0] == fifth


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 5),
    moves=st.lists(st.tuples(st.booleans(), st.integers(0, 4)), max_size=40),
)
def test_staging_ring_never_hands_out_an_entry_in_use(size, moves):
    """Writes and copy-backs in any order: a claim gives entry 0 or 1 when free, else some
    free entry; with every entry in use it waits for the one written longest ago."""
    ring = StagingRing(8, "cpu", ring_size=size, timeout_s=0.0, wait_for_tickets=True)
    in_use: list[int] = []  # oldest write first
    for write, pick in moves:
        if not write:  # a queued replay copies a ticket back
            if in_use:
                index = in_use.pop(pick % len(in_use))
                ring.done_word(index).copy_(ring.graph_source(index, 1)[1:])
            continue
        free = [index for index in range(size) if index not in in_use]
        if not free:
            with pytest.raises(RuntimeError, match=f"^staging entry {in_use[0]}: ticket"):
                ring.claim()
            continue
        index = ring.claim()
        assert index in free
        assert index == free[0] or free[0] > 1  # entry 0, then 1, when free
        ring.write(index, np.full(1, index, dtype=np.int32))
        in_use.append(index)


def test_staging_ring_polls_until_a_late_ticket_arrives():
    """The ticket lands while claim() polls: it hands the entry out without an error."""
    ring = StagingRing(8, "cpu", ring_size=1, timeout_s=30.0, wait_for_tickets=True)
    ticket = ring.write(ring.claim(), np.ones(2, dtype=np.int32))
    timer = threading.Timer(0.01, lambda: ring.done_word(0).fill_(ticket))
    timer.start()
    try:
        assert ring.claim() == 0
    finally:
        timer.cancel()
    assert ring.tickets()[1][0] == ticket


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_graph_plans_of_one_config_and_layout_launch_alike(seed):
    """StepGraphs checks a replay by config and layout only: the launch shape (baked into
    the graph) must follow from them, never from a plan's live counts."""
    config = CONFIGS[0]
    rng = np.random.default_rng(seed)
    shapes: dict = {}
    for _ in range(40):
        rows = int(rng.integers(1, 13))
        plan = compile_plan(random_batch(rng, rows, config.query_len_max, groups=2), config)
        if plan.graph is not None:
            shape = shapes.setdefault((plan.graph, plan.layout), launch_shape(plan))
            assert launch_shape(plan) == shape, plan.graph
    assert len(shapes) >= 3


class _EmulatedGraph:
    """A captured step replayed on the CPU: the graph's upload kernel (interpreted) reads
    the staging entry's plan and ticket at replay and writes the ticket back, then the
    forward runs with the launch shape of capture."""

    def __init__(self, graphs: StepGraphs, plan, index: int) -> None:
        self.executor, self.forward = graphs._executor, graphs._forward
        self.plan, size = plan, plan.packed.size
        self.source, self.done = (
            graphs._ring.graph_source(index, size),
            graphs._ring.done_word(index),
        )
        self.with_ticket = self.executor.graph_plan_buffer(plan, with_ticket=True)
        self.plan_buffer = self.with_ticket[:-1]
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        pull_plan(self.source, self.with_ticket, self.done)
        self.executor.prepare_graphed(self.plan, self.plan_buffer)
        self.forward(self.plan.graph.num_tokens)


class _EmulatedStepGraphs(StepGraphs):
    """StepGraphs with the capture emulated, so its replay path runs without CUDA. Its ring
    waits for tickets as a CUDA one does, without delay: a ticket not written by run() or
    not written back fails the step at once."""

    def __init__(self, executor: Executor) -> None:
        self._executor, self._forward, self._graphs = executor, executor._run_staged, {}
        self._ring = StagingRing(
            4 * executor.capacity.size, executor.device, timeout_s=0.0, wait_for_tickets=True
        )
        self.captures = 0

    def _capture(self, plan) -> _Captured:
        self.captures += 1
        graphs = tuple(_EmulatedGraph(self, plan, i) for i in range(self._ring.ring_size))
        return _Captured(self._executor.signature(plan), plan.config, plan.layout, graphs)


def emulated_graph_executor(config: PlannerConfig, kernel_variant: str | None = None) -> Executor:
    executor = make_executor("triton", config, kernel_variant=kernel_variant)
    shape = (executor.capacity.num_tokens, CHANNELS)
    executor._staging = (torch.zeros(shape), torch.zeros(shape))
    executor._step_graphs = _EmulatedStepGraphs(executor)
    return executor


def test_graph_step_path_equals_reference_over_buckets():
    """The replay path (staging ring, signature check, staged views or copies) on emulated
    graphs: large steps then small ones, twice over, so captured buckets replay again and
    from both ring entries."""
    config = CONFIGS[0]
    graphs, reference = emulated_graph_executor(config), make_executor("reference", config)
    rng = np.random.default_rng(5)
    ring = graphs._step_graphs._ring
    # Seven steps a pass. In the second, entry 0 is held as by a replay still queued, so
    # each bucket replays from entry 1, the lowest free one.
    for index, rows in enumerate((12, 2, 12, 1, 5, 9, 1) * 2):
        held = ring.stamp(0, 0) if index >= 7 else None
        batch = random_batch(rng, rows, config.query_len_max, groups=2)
        plan = compile_plan(batch, config)
        tokens = batch.num_tokens
        x = torch.randn(tokens + 2, CHANNELS)
        residual = torch.randn_like(x)
        want = residual.clone()
        reference.step(plan, x, want)
        if plan.graph is not None and index % 2:
            staged_x, staged_r = graphs.staging(graphs.capacity.num_tokens)
            staged_x.fill_(float("nan"))  # rows the plan does not name must stay unread
            staged_r.fill_(float("nan"))
            staged_x[:tokens] = x[:tokens]
            staged_r[:tokens] = residual[:tokens]
            graphs.step(plan, *graphs.staging(tokens))
            got = torch.cat([staged_r[:tokens], residual[tokens:]])
        else:
            got = residual.clone()
            graphs.step(plan, x, got)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"step {index}")
        assert_same_state(graphs, reference)
        if held is not None:
            ring.done_word(0).fill_(held)  # the queued replay is over
    step_graphs = graphs._step_graphs
    assert step_graphs.captures == len(graphs.captured_graphs) >= 3
    replays = [[graph.replays for graph in c.graphs] for c in step_graphs._graphs.values()]
    assert sum(map(sum, replays)) > step_graphs.captures  # captured keys replayed again
    assert any(all(count > 0 for count in counts) for counts in replays)  # both entries
    issued, done = step_graphs._ring.tickets()
    assert (issued > 0).all() and issued.tolist() == done.tolist()


@pytest.mark.parametrize("variant", VARIANTS)
def test_graph_steps_equal_eager_steps_of_the_unpadded_plans(variant):
    """Each kernel variant: a step replayed from its bucket's padded plan (emulated graphs)
    equals the same batch's eager plan, unpadded, bit for bit, and both the reference."""
    config = CONFIGS[0]
    unpadded = attrs.evolve(config, graph_mode="none")
    graphs = emulated_graph_executor(config, variant)
    eager = make_executor("triton", config, kernel_variant=variant)
    reference = make_executor("reference", config)
    rng = np.random.default_rng(11)
    for index, rows in enumerate((12, 3, 9, 1)):
        batch = random_batch(rng, rows, config.query_len_max, groups=2)
        plan, plain = compile_plan(batch, config), compile_plan(batch, unpadded)
        assert plan.graph is not None and plain.graph is None
        x = torch.randn(batch.num_tokens, CHANNELS)
        residual = torch.randn_like(x)
        outs = [residual.clone() for _ in range(3)]
        graphs.step(plan, x, outs[0])
        eager.step(plain, x, outs[1])
        reference.step(plain, x, outs[2])
        torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0, msg=f"step {index}")
        torch.testing.assert_close(outs[1], outs[2], atol=1e-5, rtol=1e-5, msg=f"step {index}")
        for a, b in zip(graphs.conv_states, eager.conv_states, strict=True):
            assert torch.equal(a, b), f"step {index}: state"
        assert_same_state(eager, reference)


def test_unknown_kernel_variants_are_refused():
    with pytest.raises(ValueError, match=r"^kernel_variant: must be one of \('program-per-tile'"):
        make_executor("triton", CONFIGS[0], kernel_variant="fast")


def test_graph_step_refuses_a_mismatched_plan_before_touching_anything():
    base, other, batch = _one_key_two_tile_sizes()
    graphs = emulated_graph_executor(base)
    x = torch.randn(batch.num_tokens, CHANNELS)
    graphs.step(compile_plan(batch, base), x, torch.zeros_like(x))
    same = attrs.evolve(base)  # an equal config, another object: replays
    graphs.step(compile_plan(batch, same), x, torch.zeros_like(x))
    states = [s.clone() for s in graphs.conv_states]
    ring = graphs._step_graphs._ring
    tickets = ring.tickets()
    residual = torch.zeros_like(x)
    with pytest.raises(ReplayMismatchError, match="tile_tokens: captured 8, plan has 16"):
        graphs.step(compile_plan(batch, other), x, residual)
    assert all(map(np.array_equal, ring.tickets(), tickets))  # the refused step wrote nothing
    assert not residual.any()
    for before, after in zip(states, graphs.conv_states, strict=True):
        assert torch.equal(before, after)


@pytest.mark.parametrize("size", [0, 5, 1000, 20000])
def test_pull_plan_copies_plan_and_ticket_then_returns_the_ticket(size):
    """The graph's upload kernel (interpreted here): every word, and one pass or several."""
    entry = torch.arange(size + 1, dtype=torch.int32) * 7 - 3
    plan = torch.full((size + 1,), -1, dtype=torch.int32)
    done = torch.zeros(1, dtype=torch.int32)
    pull_plan(entry, plan, done)
    assert torch.equal(plan, entry)
    assert int(done[0]) == int(entry[-1])
    with pytest.raises(ValueError, match=r"^plan, done: must hold"):
        pull_plan(entry, plan[:-1], done)
