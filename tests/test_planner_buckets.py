"""The bucket rule (planner/buckets.py): its scalar and vectorized forms agree, compile_plan
replays what it chooses, and the layout's offsets are the fields' own."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_strategies import step_batches

from stepplan.planner import PlanLayout, PlannerConfig, choose_graph, choose_graphs, compile_plan
from stepplan.planner.buckets import GRAPH_KINDS, may_replay, tile_capacity
from stepplan.planner.layout import (
    BATCH_FIELDS,
    FIELD_INDEX,
    FIELDS,
    batch_buffer_arrays,
    batch_buffer_size,
)

RULE = settings(max_examples=300, deadline=None)


@st.composite
def configs(draw: st.DrawFn) -> PlannerConfig:
    return PlannerConfig(
        num_spec_tokens=draw(st.integers(0, 7)),
        graph_mode=draw(st.sampled_from(("none", "full", "mixed"))),
        graph_sizes=draw(st.one_of(st.none(), st.lists(st.integers(1, 600), min_size=1))),
        max_num_seqs=draw(st.integers(1, 300)),
        prefill_tile_tokens=draw(st.sampled_from([8, 16, 64])),
    )


@st.composite
def steps(draw: st.DrawFn) -> tuple[int, int, int, int]:
    """Live rows per kind and the tokens the graph must hold (at least one per live row,
    more for prefills and padded inputs): uniform steps often, empty ones sometimes."""
    shape = draw(st.sampled_from(("spec", "decode", "mixed", "empty")))
    count = st.integers(0, 400)
    spec = draw(count) if shape in ("spec", "mixed") else 0
    decode = draw(count) if shape in ("decode", "mixed") else 0
    prefill = draw(st.integers(0, 6)) if shape == "mixed" else 0
    tokens = spec + decode + 2 * prefill + draw(st.integers(0, 3000))
    return spec, decode, prefill, tokens


@RULE
@given(configs(), st.lists(steps(), max_size=40))
def test_the_vectorized_rule_is_the_scalar_rule_step_by_step(config, cases):
    columns = np.array(cases, dtype=np.int64).reshape(-1, 4).T
    choices = choose_graphs(config, *columns)
    assert choices.kind.shape == (len(cases),)
    for step, (spec, decode, prefill, tokens) in enumerate(cases):
        graph = choose_graph(config, spec, decode, prefill, tokens)
        assert choices.key(step) == graph
        if graph is None:
            assert choices.num_tokens[step] == choices.num_rows[step] == 0
        else:
            assert GRAPH_KINDS[choices.kind[step] - 1] == graph.kind
            assert may_replay(config.graph_mode, spec, decode, prefill)
            assert graph.num_tokens >= tokens and graph.num_rows >= spec + decode + prefill
            assert type(graph.num_tiles) is int and type(graph.num_tokens) is int
    for array in (choices.kind, choices.num_tokens, choices.num_rows, choices.num_tiles):
        assert not array.flags.writeable


@settings(max_examples=300, deadline=None)
@given(step_batches())
def test_compile_plan_replays_the_graph_the_rule_chooses(case):
    batch, config = case
    plan = compile_plan(batch, config)
    spec, decode, prefill, _ = batch.kind_counts
    tokens = max(batch.num_tokens, batch.num_padded_tokens or 0)
    assert plan.graph == choose_graph(config, spec, decode, prefill, tokens)
    one = choose_graphs(config, [spec], [decode], [prefill], [tokens])
    assert one.key(0) == plan.graph
    if plan.graph is not None:
        assert plan.layout == plan.graph.layout(batch.num_groups)
        assert plan.num_tiles <= plan.graph.num_tiles


def test_a_hand_example_of_each_kind():
    config = PlannerConfig(num_spec_tokens=3, graph_mode="mixed", graph_sizes=(4, 8, 64))
    assert str(choose_graph(config, 3, 0, 0, 12)) == "spec(tokens=16, rows=4, tiles=0)"
    assert str(choose_graph(config, 3, 0, 0, 20)) == "spec(tokens=32, rows=8, tiles=0)"
    assert str(choose_graph(config, 0, 5, 0, 5)) == "decode(tokens=8, rows=8, tiles=0)"
    # min(4 rows, 64 // 2) + 64 // 64: the tiles a step of 64 tokens and 4 rows can need
    assert str(choose_graph(config, 1, 1, 1, 40)) == "mixed(tokens=64, rows=4, tiles=5)"
    assert choose_graph(config, 1, 1, 1, 65) is None  # no size holds the tokens
    assert choose_graph(config, 0, 0, 0, 0) is None
    full = PlannerConfig(graph_mode="full", graph_sizes=(4, 8, 64), max_num_seqs=8)
    assert choose_graph(full, 1, 1, 1, 40) is None  # full mode: uniform steps only
    assert choose_graph(full, 0, 9, 0, 9) is None  # the row sizes are 4 and 8 only
    assert str(choose_graph(full, 0, 2, 0, 7)) == "decode(tokens=8, rows=8, tiles=0)"
    assert tile_capacity(64, 8, 64) == 9 and tile_capacity(10, 2, 8) == 3


def test_offsets_come_from_the_layouts_field_sizes():
    layout = PlanLayout(num_tokens=7, num_rows=3, num_tiles=2, num_groups=2)
    starts = layout.starts()
    assert starts[-1] == layout.size and len(starts) == len(FIELDS) + 1
    for field in layout.fields:
        index = FIELD_INDEX[field.name]
        assert (starts[index], starts[index + 1] - starts[index]) == layout.span(field.name)
        assert layout.field(field.name) == field


def test_stepbatchs_buffer_holds_its_fields_in_order():
    rows, groups = 3, 2
    data = np.arange(batch_buffer_size(rows, groups), dtype=np.int32)
    arrays = batch_buffer_arrays(data, rows, groups)
    assert [name for name, _ in BATCH_FIELDS][4] == "slots" and arrays[4].shape == (2, 3)
    sizes = {"R": rows, "G*R": groups * rows, "R+1": rows + 1}
    assert [a.size for a in arrays] == [sizes[size] for _, size in BATCH_FIELDS]
    assert np.concatenate([a.ravel() for a in arrays]).tolist() == data.tolist()
    assert all(np.shares_memory(a, data) for a in arrays)
