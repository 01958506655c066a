"""Properties of compile_plan on random valid batches (SPEC §3)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from planner_strategies import step_batches

from stepplan.planner import (
    PADDING,
    SPEC,
    PlanLayout,
    Planner,
    PlannerConfig,
    StepBatch,
    compile_plan,
    largest_graph_layout,
)
from stepplan.planner.compile import _compile, _rows_in_group_order

settings.register_profile("planner", max_examples=150, deadline=None)


def engine_token_rows(batch, row):
    start = int(batch.query_lens[:row].sum())
    return list(range(start, start + int(batch.query_lens[row])))


@settings(settings.get_profile("planner"))
@given(step_batches())
def test_token_permutation_lists_groups_in_order(case):
    batch, config = case
    plan = compile_plan(batch, config)
    expected = []
    for kind in (0, 1, 2):  # spec, decode, prefill; engine order inside each group
        for row in np.flatnonzero(batch.kinds == kind):
            expected += engine_token_rows(batch, row)
    tokens = plan.token_map[: plan.num_tokens]
    assert tokens.tolist() == expected
    assert sorted(expected) == list(range(batch.num_tokens))
    assert (plan.token_map[plan.num_tokens :] == -1).all()


@settings(settings.get_profile("planner"))
@given(step_batches())
def test_groups_partition_live_rows(case):
    batch, config = case
    plan = compile_plan(batch, config)
    live = plan.num_rows
    requests = plan.row_request[:live]
    assert sorted(requests.tolist()) == np.flatnonzero(batch.kinds != PADDING).tolist()
    assert (np.diff(plan.row_kind[:live]) >= 0).all()
    assert (plan.row_kind[:live] == batch.kinds[requests]).all()
    for kind in (0, 1, 2):  # stable: engine order kept within a group
        assert (np.diff(requests[plan.row_kind[:live] == kind]) > 0).all()
    counts = [plan.num_spec_rows, plan.num_decode_rows, plan.num_prefill_rows]
    assert counts == [int((batch.kinds == k).sum()) for k in (0, 1, 2)]


@settings(settings.get_profile("planner"))
@given(step_batches())
def test_offsets_slots_and_flags_follow_each_row(case):
    batch, config = case
    plan = compile_plan(batch, config)
    live, requests = plan.num_rows, plan.row_request[: plan.num_rows]
    assert (np.diff(plan.row_query_start[: live + 1]) == batch.query_lens[requests]).all()
    assert plan.row_query_start[0] == 0
    starts = np.concatenate([[0], np.cumsum(batch.query_lens)])[requests]
    assert (plan.row_token_start[:live] == starts).all()
    assert (plan.row_slot[:, :live] == batch.slots[:, requests]).all()
    spec = plan.row_kind[:live] == SPEC
    has_state = batch.num_computed_tokens[requests] > 0
    assert (plan.row_reads_state[:live] == (spec | has_state)).all()
    accepted = batch.num_accepted_tokens[requests]
    assert (plan.row_num_accepted[:live] == np.where(spec, accepted, 1)).all()
    assert (plan.row_state_offset[:live] == np.where(spec, accepted - 1, 0)).all()
    prefill_lens = batch.query_lens[requests][plan.row_kind[:live] == 2]
    assert plan.max_prefill_query_len == (prefill_lens.max() if prefill_lens.size else 0)


@settings(settings.get_profile("planner"))
@given(step_batches())
def test_padded_rows_are_inert(case):
    batch, config = case
    plan = compile_plan(batch, config)
    live = plan.num_rows
    assert (plan.row_slot[:, live:] == 0).all()
    assert (plan.row_kind[live:] == PADDING).all()
    assert (plan.row_query_start[live:] == plan.num_tokens).all()
    assert (plan.row_num_accepted[live:] == 1).all()
    assert (plan.row_reads_state[live:] == 0).all()
    assert (plan.tile_row[plan.num_tiles :] == -1).all()


@settings(settings.get_profile("planner"))
@given(step_batches())
def test_tiles_cover_every_prefill_token_once(case):
    batch, config = case
    plan = compile_plan(batch, config)
    tile, covered = config.prefill_tile_tokens, {}
    tiles = zip(plan.tile_row[: plan.num_tiles], plan.tile_start[: plan.num_tiles], strict=True)
    for row, start in tiles:
        assert plan.row_kind[row] == 2 and start % tile == 0
        covered.setdefault(int(row), []).append(int(start))
    prefill_rows = np.flatnonzero(plan.row_kind[: plan.num_rows] == 2)
    assert sorted(covered) == prefill_rows.tolist()
    for row, starts in covered.items():
        length = plan.row_query_start[row + 1] - plan.row_query_start[row]
        assert starts == list(range(0, length, tile))


@settings(settings.get_profile("planner"))
@given(step_batches())
def test_graph_is_the_smallest_fitting_bucket(case):
    batch, config = case
    plan = compile_plan(batch, config)
    layout, graph = plan.layout, plan.graph
    assert layout.size == plan.packed.size
    need = max(plan.num_tokens, batch.num_padded_tokens or 0)
    if graph is None:
        assert (layout.num_tokens, layout.num_rows) == (plan.num_tokens, plan.num_rows)
        return
    assert config.graph_mode != "none"
    assert (layout.num_tokens, layout.num_rows) == (graph.num_tokens, graph.num_rows)
    assert graph.num_tokens >= need and graph.num_rows >= plan.num_rows
    assert graph.num_tiles >= plan.num_tiles
    assert graph.num_rows in config.sizes and graph.num_rows <= config.max_num_seqs
    smaller = [s for s in config.sizes if s < graph.num_rows and s >= plan.num_rows]
    if graph.kind in ("spec", "decode"):
        assert graph.num_tokens == graph.num_rows * (
            plan.query_len_max if graph.kind == "spec" else 1
        )
        per_row = plan.query_len_max if graph.kind == "spec" else 1
        assert not [s for s in smaller if s * per_row >= need]
    else:
        assert config.graph_mode == "mixed" and graph.num_tokens in config.sizes
        assert not smaller


@settings(settings.get_profile("planner"))
@given(step_batches())
def test_plans_are_values(case):
    batch, config = case
    plan = compile_plan(batch, config)
    again = compile_plan(
        type(batch)(
            query_lens=batch.query_lens.tolist(),
            num_computed_tokens=batch.num_computed_tokens.copy(),
            slots=batch.slots.copy(),
            num_draft_tokens=batch.num_draft_tokens.copy(),
            num_accepted_tokens=batch.num_accepted_tokens.copy(),
            num_padded_tokens=batch.num_padded_tokens,
        ),
        config,
    )
    assert plan == again and hash(plan) == hash(again)
    assert not plan.packed.flags.writeable
    for field in plan.layout.fields:
        view = plan.array(field.name)
        assert not view.flags.writeable
        if view.size:
            with pytest.raises(ValueError):
                view[0] = 7
    assert not batch.query_lens.flags.writeable and not batch.slots.flags.writeable


@settings(settings.get_profile("planner"))
@given(step_batches())
def test_largest_graph_layout_holds_every_graph_plan(case):
    batch, config = case
    plan = compile_plan(batch, config)
    bound = largest_graph_layout(config, batch.num_groups)
    if plan.graph is None:
        return
    layout = plan.layout
    assert layout.num_tokens <= bound.num_tokens and layout.num_rows <= bound.num_rows
    assert layout.num_tiles <= bound.num_tiles and layout.size <= bound.size


def rows_by_kind(batch):
    """The same batch with its rows sorted into group order (the engine-order fast path)."""
    order = np.argsort(batch.kinds, kind="stable")
    return StepBatch(
        query_lens=batch.query_lens[order],
        num_computed_tokens=batch.num_computed_tokens[order],
        slots=batch.slots[:, order],
        num_draft_tokens=batch.num_draft_tokens[order],
        num_accepted_tokens=batch.num_accepted_tokens[order],
        num_padded_tokens=batch.num_padded_tokens,
    )


@settings(settings.get_profile("planner"))
@given(step_batches())
def test_engine_order_fast_path_equals_the_general_path(case):
    batch, config = case
    for step in (batch, rows_by_kind(batch)):  # the second always takes the fast path
        fast = compile_plan(step, config)
        general = _compile(step, config, in_engine_order=False)
        assert fast == general
        assert fast.packed.tobytes() == general.packed.tobytes()
        assert (fast.graph, fast.layout) == (general.graph, general.layout)


# Few rows and short prefills in mixed mode: most steps get a graph, many with rows
# out of group order (the regrouped path).
_STREAM_STEPS = st.one_of(
    step_batches(max_rows=24), step_batches(max_rows=8, max_prefill=20, graph_modes=("mixed",))
)


def _regrouped_mixed_step():
    """A prefill before a decode row, in mixed mode: a graph plan with regrouped rows."""
    batch = StepBatch(
        query_lens=[5, 1],
        num_computed_tokens=[0, 4],
        slots=[3, 4],
        num_draft_tokens=[-1, -1],
        num_accepted_tokens=[1, 1],
    )
    return batch, PlannerConfig(graph_mode="mixed", graph_sizes=(2, 8))


@pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
def test_planner_compiles_exactly_what_compile_plan_does(native):
    reached = {"regrouped graph": 0, "engine-order graph": 0, "eager": 0}

    @settings(settings.get_profile("planner"), max_examples=40)
    @given(st.lists(_STREAM_STEPS, min_size=1, max_size=6))
    @example([_regrouped_mixed_step()])  # the regrouped graph path, whatever is drawn
    def check(cases):
        # One planner per config, fed a stream of steps; repeat steps hit its kept shapes.
        planners, plans = {}, []
        for batch, config in cases + cases[:2]:
            planner = planners.setdefault(config, Planner(config, native=native))
            assert planner.native is native
            for step in (batch, rows_by_kind(batch)):
                kept = planner.compile(step)
                fresh = compile_plan(step, config)
                assert kept == fresh
                assert kept.packed.tobytes() == fresh.packed.tobytes()
                assert (kept.graph, kept.layout, kept.batch) == (fresh.graph, fresh.layout, step)
                assert not kept.packed.flags.writeable
                plans.append(kept)
                path = "eager" if kept.graph is None else "engine-order graph"
                if kept.graph is not None and not _rows_in_group_order(step):
                    path = "regrouped graph"
                reached[path] += 1
        for i, plan in enumerate(plans):  # every plan has a buffer of its own
            assert not any(np.shares_memory(plan.packed, other.packed) for other in plans[:i])

    check()
    assert all(reached.values()), reached


def test_a_repeated_shape_asks_the_bucket_rule_once(monkeypatch):
    # The native planner keeps its graph choices, eager ones too.
    import stepplan.planner.planner as planner_module

    config = PlannerConfig(num_spec_tokens=1, graph_mode="full", graph_sizes=(4, 8))
    spec = StepBatch(
        query_lens=[2, 2],
        num_computed_tokens=[1, 1],
        slots=[1, 2],
        num_draft_tokens=[1, 1],
        num_accepted_tokens=[1, 2],
    )
    mixed = StepBatch(  # eager in full mode, without asking the rule for sizes
        query_lens=[2, 1, 7],
        num_computed_tokens=[1, 1, 0],
        slots=[1, 2, 3],
        num_draft_tokens=[1, -1, -1],
        num_accepted_tokens=[1, 1, 1],
    )
    decode = StepBatch(  # eager: no row size holds 9 rows
        query_lens=[1] * 9,
        num_computed_tokens=[1] * 9,
        slots=list(range(1, 10)),
        num_draft_tokens=[-1] * 9,
        num_accepted_tokens=[1] * 9,
    )
    planner = Planner(config, native=True)
    choices = []
    rule = planner_module.choose_graph
    monkeypatch.setattr(planner_module, "choose_graph", lambda *a: choices.append(a) or rule(*a))
    for _ in range(3):
        for step in (spec, mixed, decode):
            assert planner.compile(step) == compile_plan(step, config)
    assert len(choices) == 2  # spec and decode once each; mixed never
    assert planner.compile(spec).graph is not None and planner.compile(decode).graph is None


def test_inert_buffer_is_every_fields_padding():
    layout = PlanLayout(num_tokens=5, num_rows=3, num_tiles=2, num_groups=2)
    inert = layout.inert_buffer()
    assert inert.shape == (layout.size,) and inert.dtype == np.int32
    for field in layout.fields:
        assert (inert[field.offset : field.offset + field.size] == field.pad_value).all()


#: What a plan's counts decide, written once (``PlanCounts``) for a plan and its shape.
DERIVED = (
    "num_rows",
    "num_tokens",
    "query_len_max",
    "tile_tokens",
    "num_groups",
    "padded_tokens",
    "padded_rows",
    "launch_grids",
)


@settings(settings.get_profile("planner"))
@given(step_batches())
def test_a_plan_and_its_shape_derive_the_same_counts(case):
    batch, config = case
    plan = compile_plan(batch, config)
    shape = plan.shape
    for name in DERIVED:
        assert getattr(shape, name) == getattr(plan, name), name
    assert shape.num_rows == int((batch.kinds != PADDING).sum())
    assert shape.num_tokens == int(batch.query_lens[batch.kinds != PADDING].sum())
    assert not hasattr(shape, "__dict__")  # still a bare tuple, as cheap as before
