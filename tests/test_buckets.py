"""The bucket optimizer: exact (against brute force), never worse than the default lists,
and bucketing steps exactly as the planner does."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tomllib
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_results import write_synthetic_results

from stepplan.planner import PlannerConfig, StepBatch, compile_plan, default_graph_sizes
from stepplan.sim.buckets.demand import (
    BucketError,
    assign,
    best_sizes,
    compare_to_defaults,
    coverage,
    optimal_sizes,
    padded_cost,
    score,
    sglang_default_graph_sizes,
    sizes_snippet,
    step_demand,
)
from stepplan.sim.cli import main
from stepplan.sim.results.schema import KIND_ROWS, KIND_TOKENS
from stepplan.sim.settings.config import load_config

#: The step columns the demand reads: live rows and tokens per kind.
STEP_COUNTS = (*KIND_ROWS.values(), *KIND_TOKENS.values())

FAST = settings(max_examples=60, deadline=None)


def brute_force(values, weights, max_graphs, forced, forbidden):
    """The least padded cost over *every* integer size list (not only observed sizes)."""
    top = max(forced)
    allowed = [
        s
        for s in range(1, top)
        if s not in forced and not (forbidden and forbidden[0] < s <= forbidden[1])
    ]
    best = np.inf
    for extra in range(max_graphs - len(set(forced)) + 1):
        for subset in itertools.combinations(allowed, extra):
            best = min(best, padded_cost(values, weights, [*subset, *forced]))
    return best


@st.composite
def problems(draw):
    top = draw(st.integers(1, 11))
    values = draw(st.lists(st.integers(1, top), max_size=12))
    weights = draw(st.lists(st.integers(0, 6), min_size=len(values), max_size=len(values)))
    forced, forbidden = [top], None
    if top >= 3 and draw(st.booleans()):
        row_top = draw(st.integers(1, top - 1))
        forced = [row_top, top]
        high = draw(st.integers(row_top, top - 1))
        forbidden = (row_top, high) if high > row_top else None
    max_graphs = draw(st.integers(len(forced), 5))
    return np.array(values, np.int64), np.array(weights, np.int64), max_graphs, forced, forbidden


@FAST
@given(problems())
def test_optimizer_matches_brute_force_over_all_integer_lists(problem):
    values, weights, max_graphs, forced, forbidden = problem
    chosen = optimal_sizes(
        values, weights, max_graphs=max_graphs, forced=forced, forbidden=forbidden
    )
    assert len(chosen) <= max_graphs
    assert set(forced) <= set(chosen)
    assert list(chosen) == sorted(set(chosen))
    if forbidden:
        assert not any(forbidden[0] < s <= forbidden[1] for s in chosen)
    expected = brute_force(values, weights, max_graphs, forced, forbidden)
    assert padded_cost(values, weights, chosen) == expected


def test_optimizer_hand_example():
    # Steps of 1, 3 and 4 rows (weight 4 tokens per row), budget 2, largest 4:
    # {3, 4} pads (3-1)*4 = 8, {1, 4} pads (4-3)*4 = 4, {2, 4} pads 4 + 4 = 8.
    values, weights = np.array([1, 3, 4]), np.array([4, 4, 4])
    assert optimal_sizes(values, weights, max_graphs=2, forced=[4]) == (1, 4)
    assert optimal_sizes(values, weights, max_graphs=3, forced=[4]) == (1, 3, 4)


@st.composite
def step_tables(draw):
    """Step columns of a random simulation: spec, decode, mixed and prefill steps."""
    num_spec_tokens = draw(st.integers(0, 3))
    q = num_spec_tokens + 1
    count = draw(st.integers(1, 40))
    columns = {name: [] for name in STEP_COUNTS}
    for _ in range(count):
        spec = draw(st.integers(0, 40)) if q > 1 else 0
        decode = draw(st.integers(0, 40)) if q == 1 or draw(st.booleans()) else 0
        prefill = draw(st.integers(0, 2))
        for kind, rows, per_row in (("spec", spec, q), ("decode", decode, 1)):
            columns[KIND_ROWS[kind]].append(rows)
            columns[KIND_TOKENS[kind]].append(rows * per_row)
        columns["num_prefill_rows"].append(prefill)
        columns["num_prefill_tokens"].append(prefill * draw(st.integers(2, 700)))
    mode = draw(st.sampled_from(("full", "mixed")))
    max_num_seqs = draw(st.sampled_from((40, 64, 100, 256)))
    arrays = {key: np.array(value, np.int64) for key, value in columns.items()}
    return arrays, num_spec_tokens, mode, max_num_seqs


@FAST
@given(step_tables(), st.one_of(st.none(), st.integers(1, 12)))
def test_optimal_lists_never_worse_than_the_defaults_they_are_compared_with(table, budget):
    columns, num_spec_tokens, mode, max_num_seqs = table
    demand = step_demand(
        columns, num_spec_tokens=num_spec_tokens, graph_mode=mode, max_num_seqs=max_num_seqs
    )
    if mode == "mixed" and budget == 1:
        budget = 2  # a mixed-mode list must keep its largest size and its largest row size
    comparison = compare_to_defaults(demand, max_graphs=budget)
    scores = {s.label: s for s in comparison.scores}
    defaults = [s for s in comparison.scores if "default" in s.label]
    assert len(defaults) == 2
    for default in defaults:
        kept = len(default.sizes)
        optimal = scores[f"optimal, <= {kept} up to {default.sizes[-1]}"]
        assert len(optimal.sizes) <= kept
        assert optimal.sizes[-1] == default.sizes[-1]
        assert optimal.padded_tokens <= default.padded_tokens
        hits = assign(demand, optimal.sizes).graph_tokens > 0
        assert np.array_equal(hits, assign(demand, default.sizes).graph_tokens > 0)


@FAST
@given(step_tables(), st.integers(2, 10))
def test_dp_objective_is_the_planners_padding(table, budget):
    columns, num_spec_tokens, mode, max_num_seqs = table
    demand = step_demand(
        columns, num_spec_tokens=num_spec_tokens, graph_mode=mode, max_num_seqs=max_num_seqs
    )
    reference = default_graph_sizes(max_num_seqs, num_spec_tokens)
    problem = coverage(demand, reference)
    chosen = best_sizes(demand, reference, budget)
    # The spec rows of these tables carry Q tokens each, so no padding is outside the DP.
    dp_cost = padded_cost(problem.values, problem.weights, chosen)
    assert score(demand, chosen, "optimal").padded_tokens == dp_cost


@st.composite
def planner_cases(draw):
    num_spec_tokens = draw(st.integers(0, 3))
    q = num_spec_tokens + 1
    rows = draw(st.integers(0, 12))
    kinds = draw(st.lists(st.sampled_from((0, 1, 2, 3)), min_size=rows, max_size=rows))
    if kinds and draw(st.booleans()):
        kinds = [kinds[0]] * rows  # uniform batches are where graphs are chosen by rows
    lengths = [
        draw(st.integers(1, q)) if kind == 0 else (1, draw(st.integers(2, 90)), 0)[kind - 1]
        for kind in kinds
    ]
    sizes = draw(st.lists(st.integers(1, 60), min_size=1, max_size=6))
    mode = draw(st.sampled_from(("none", "full", "mixed")))
    max_num_seqs = draw(st.integers(max(1, rows), 20))
    return kinds, lengths, num_spec_tokens, sizes, mode, max_num_seqs


@FAST
@given(planner_cases())
def test_assign_buckets_every_step_as_compile_plan_does(case):
    kinds, lengths, num_spec_tokens, sizes, mode, max_num_seqs = case
    rows = len(kinds)
    batch = StepBatch(
        query_lens=np.array(lengths, np.int64),
        num_computed_tokens=np.ones(rows, np.int64),
        slots=np.arange(1, rows + 1),
        num_draft_tokens=np.array(
            [q - 1 if k == 0 else -1 for k, q in zip(kinds, lengths, strict=True)]
        ),
        num_accepted_tokens=np.ones(rows, np.int64),
    )
    config = PlannerConfig(
        num_spec_tokens=num_spec_tokens,
        graph_mode=mode,
        graph_sizes=sizes,
        max_num_seqs=max_num_seqs,
    )
    plan = compile_plan(batch, config)
    columns = {name: np.array([getattr(plan, name)]) for name in STEP_COUNTS}  # same names
    demand = step_demand(
        columns, num_spec_tokens=num_spec_tokens, graph_mode=mode, max_num_seqs=max_num_seqs
    )
    graphs = assign(demand, sizes)
    expected = (plan.graph.num_tokens, plan.graph.num_rows) if plan.graph else (0, 0)
    assert (int(graphs.graph_tokens[0]), int(graphs.graph_rows[0])) == expected


def test_sglang_default_lists():
    speculative = sglang_default_graph_sizes(256, speculative=True)
    assert speculative[:10] == (1, 2, 3, 4, 5, 6, 7, 8, 10, 12)
    assert speculative[-3:] == (240, 248, 256) and len(speculative) == 51
    plain = sglang_default_graph_sizes(512, speculative=False)
    assert plain[:6] == (1, 2, 4, 8, 12, 16)
    assert (plain[36], plain[37], plain[-2], plain[-1]) == (272, 288, 496, 512)
    assert sglang_default_graph_sizes(100, speculative=True)[-1] == 96


def test_bad_input_is_refused_with_a_clear_error():
    columns = {name: np.ones(3, np.int64) for name in STEP_COUNTS}
    with pytest.raises(BucketError, match="num_spec_rows"):
        step_demand({}, num_spec_tokens=3, graph_mode="full", max_num_seqs=8)
    with pytest.raises(BucketError, match="different lengths"):
        bad = {**columns, "num_decode_rows": np.ones(2, np.int64)}
        step_demand(bad, num_spec_tokens=3, graph_mode="full", max_num_seqs=8)
    with pytest.raises(BucketError, match="row 1: negative"):
        bad = {**columns, "num_prefill_tokens": np.array([1, -4, 1])}
        step_demand(bad, num_spec_tokens=3, graph_mode="full", max_num_seqs=8)
    with pytest.raises(BucketError, match="graph_mode"):
        step_demand(columns, num_spec_tokens=3, graph_mode="always", max_num_seqs=8)
    demand = step_demand(columns, num_spec_tokens=3, graph_mode="none", max_num_seqs=8)
    with pytest.raises(BucketError, match="none"):
        coverage(demand, [1, 2, 4])
    with pytest.raises(BucketError, match="cannot hold the forced sizes"):
        optimal_sizes(np.array([1]), np.array([1]), max_graphs=1, forced=[2, 8])
    with pytest.raises(BucketError, match=r"demands must lie in 1\.\.8"):
        optimal_sizes(np.array([9]), np.array([1]), max_graphs=3, forced=[8])
    with pytest.raises(BucketError, match="toml or json"):
        sizes_snippet([1, 2], "yaml")


def test_buckets_command_prints_the_table_and_writes_a_usable_config(tmp_path, capsys):
    folder = write_synthetic_results(tmp_path / "run")
    toml_path, figure = tmp_path / "sizes.toml", tmp_path / "buckets.png"
    args = ["buckets", str(folder), "--max-graphs", "8", "--write", str(toml_path)]
    assert main([*args, "--figure", str(figure)]) == 0
    out = capsys.readouterr().out
    assert "vLLM default (8)" in out and "SGLang default (8)" in out
    assert "fastest, <= 8 graphs" in out and "least padding, <= 8 up to 256" in out
    written = tomllib.loads(toml_path.read_text())["planner"]["graph_sizes"]
    assert 1 <= len(written) <= 8 and written[-1] <= 256
    assert load_config(toml_path).planner.graph_sizes == tuple(written)
    assert figure.read_bytes().startswith(b"\x89PNG")
    assert main(["buckets", str(tmp_path / "missing")]) == 2
    assert "not a results folder" in capsys.readouterr().err
