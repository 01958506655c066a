"""The graph-size optimizer with step time as the objective and graph memory as the budget:
the DP against brute force, its reduction to the padding optimum, the memory budget, the
engine profile's memory figures, and the lists against vLLM's and SGLang's defaults."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.sim.buckets.bucket_search import (
    Objective,
    fastest_list,
    time_memory_front,
    within_memory,
)
from stepplan.sim.buckets.bucket_table import compare_times
from stepplan.sim.buckets.bucket_time import SizeCosts, predict
from stepplan.sim.buckets.demand import BucketError, assign, step_demand
from stepplan.sim.buckets.size_dp import (
    TimeProblem,
    fastest_sizes,
    optimal_sizes,
    padded_cost,
    percentile_sizes,
)
from stepplan.sim.cli import main
from stepplan.sim.results.schema import KIND_ROWS, KIND_TOKENS
from stepplan.sim.timing.engine_profile import EngineProfileError, read_engine_profile

BUNDLED_PROFILE = "sim/data/engine_profile_hybrid-8b_h200.json"


@st.composite
def time_problems(draw):
    """A small problem: a few candidates, kinds and steps, times drawn at random
    (monotone in the size or not), some sizes uncapturable, some forced or excluded."""
    m = draw(st.integers(1, 6))
    kinds = draw(st.integers(1, 3))
    n = draw(st.integers(0, 8))
    ints = st.integers
    kind = np.array(draw(st.lists(ints(-1, kinds - 1), min_size=n, max_size=n)), dtype=np.int64)
    demand = np.array(draw(st.lists(ints(1, m + 1), min_size=n, max_size=n)), dtype=np.int64)
    count = np.array(draw(st.lists(ints(1, 4), min_size=n, max_size=n)), dtype=np.float64)
    times = st.floats(0.0, 100.0, allow_nan=False)
    eager = np.array(draw(st.lists(times, min_size=n, max_size=n)))
    graph = np.array(draw(st.lists(times, min_size=kinds * m, max_size=kinds * m)))
    graph = graph.reshape(kinds, m)
    if draw(st.booleans()):
        graph = np.sort(graph, axis=1)  # monotone in the size
    if draw(st.booleans()):
        graph[draw(ints(0, kinds - 1)), draw(ints(0, m - 1))] = np.inf
    memory = np.array(draw(st.lists(st.floats(0.0, 10.0), min_size=m, max_size=m)))
    allowed = np.array(draw(st.lists(st.booleans(), min_size=m, max_size=m))) | (m == 1)
    forced = np.zeros(m, dtype=bool)
    if draw(st.booleans()):
        forced[draw(ints(0, m - 1))] = True
    allowed |= forced
    unit = np.where(kind == 0, 4.0, 1.0)
    return TimeProblem(
        np.arange(1, m + 1, dtype=np.int64),
        kind,
        demand,
        count,
        unit,
        eager,
        graph,
        memory,
        allowed,
        forced,
    )


def _lists(problem: TimeProblem, max_graphs: int):
    """Every list of 1..max_graphs allowed candidates holding the forced ones."""
    allowed = problem.candidates[problem.allowed]
    forced = set(problem.candidates[problem.forced].tolist())
    for k in range(1, max_graphs + 1):
        for sizes in itertools.combinations(allowed.tolist(), k):
            if forced <= set(sizes):
                yield sizes


def _total(problem: TimeProblem, sizes, memory_weight: float = 0.0) -> float:
    times, _ = problem.step_times(sizes)
    return float((times * problem.count).sum()) + memory_weight * problem.memory_of(sizes)


@settings(max_examples=300, deadline=None)
@given(time_problems(), st.integers(1, 4), st.sampled_from([0.0, 0.7]))
def test_fastest_sizes_equals_brute_force(problem, max_graphs, memory_weight):
    brute = min(
        (_total(problem, s, memory_weight) for s in _lists(problem, max_graphs)), default=None
    )
    if brute is None or not np.isfinite(brute):
        with pytest.raises(BucketError):
            fastest_sizes(problem, max_graphs=max_graphs, memory_weight=memory_weight)
        return
    chosen = fastest_sizes(problem, max_graphs=max_graphs, memory_weight=memory_weight)
    assert len(chosen) <= max_graphs and set(problem.candidates[problem.forced]) <= set(chosen)
    assert _total(problem, chosen, memory_weight) == pytest.approx(brute, rel=1e-9, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(time_problems(), st.integers(1, 3), st.sampled_from([50.0, 90.0, 99.0, 100.0]))
def test_percentile_sizes_equals_brute_force(problem, max_graphs, percentile):
    assume_finite = [s for s in _lists(problem, max_graphs)]
    if not assume_finite or problem.count.size == 0:
        return
    objective = Objective(percentile)

    def value(sizes):
        times, _ = problem.step_times(sizes)
        order = np.argsort(times, kind="stable")
        reached = np.cumsum(problem.count[order])
        at = np.searchsorted(reached, reached[-1] * percentile / 100.0 - 1e-9)
        return times[order][at]

    brute = min(value(s) for s in assume_finite)
    if not np.isfinite(brute):
        return
    chosen = percentile_sizes(problem, max_graphs=max_graphs, percentile=percentile)
    assert value(chosen) == pytest.approx(brute)
    assert objective.name == f"p{percentile:g} step time"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(1, 5)), min_size=1, max_size=25),
    st.integers(2, 6),
    st.floats(1.0, 50.0),
)
def test_equal_graph_and_eager_times_give_the_padding_optimum(steps, max_graphs, step_us):
    """When no list changes a step's time, the tie-break on padded tokens leaves today's
    optimum (same largest size forced)."""
    values = np.array([v for v, _ in steps], dtype=np.int64)
    weights = np.array([w for _, w in steps], dtype=np.float64)
    largest = int(values.max())
    problem = TimeProblem(
        candidates=np.arange(1, largest + 1, dtype=np.int64),
        kind=np.zeros(values.size, dtype=np.int64),
        demand=values,
        count=np.ones(values.size),
        unit=weights,
        eager_us=np.full(values.size, step_us),
        graph_us=np.full((1, largest), step_us),
        memory_mib=np.zeros(largest),
        allowed=np.ones(largest, dtype=bool),
        forced=np.arange(1, largest + 1) == largest,
    )
    chosen = fastest_sizes(problem, max_graphs=max_graphs)
    today = optimal_sizes(values, weights, max_graphs=max_graphs, forced=[largest])
    assert padded_cost(values, weights, chosen) == padded_cost(values, weights, today)
    assert len(chosen) <= len(today)


# --- the workload level: a step table, its costs, the planner's rule ---------------------


def _demand(seed: int, mode: str, num_steps: int = 60, max_num_seqs: int = 6):
    rng = np.random.default_rng(seed)
    spec = rng.integers(0, max_num_seqs + 1, num_steps)
    decode = np.where(rng.random(num_steps) < 0.3, rng.integers(0, 3, num_steps), 0)
    prefill = np.where(rng.random(num_steps) < 0.3, 1, 0)
    chunk = rng.integers(2, 9, num_steps) * prefill
    columns = dict(zip(KIND_ROWS.values(), (spec, decode, prefill), strict=True))
    columns |= dict(zip(KIND_TOKENS.values(), (spec * 2, decode, chunk), strict=True))
    return step_demand(columns, num_spec_tokens=1, graph_mode=mode, max_num_seqs=max_num_seqs)


def _costs(demand, largest: int, seed: int, memory: bool = True) -> SizeCosts:
    rng = np.random.default_rng(seed)
    graph = rng.uniform(1.0, 10.0, (3, largest))
    graph[:2, demand.max_num_seqs :] = np.inf  # uniform graphs only at row sizes
    graph[2, 0] = np.inf  # no mixed graph of one token
    mib = rng.uniform(0.5, 4.0, (3, largest)) if memory else None
    return SizeCosts(
        graph, mib, rng.uniform(5.0, 20.0, demand.rows.size), 0, "" if memory else "none"
    )


@pytest.mark.parametrize("mode", ["full", "mixed"])
@pytest.mark.parametrize("seed", range(4))
def test_fastest_list_equals_brute_force_over_whole_lists(mode, seed):
    """The search over largest row sizes and the DP against every list of the sizes."""
    demand = _demand(seed, mode)
    largest = 9 if mode == "mixed" else demand.max_num_seqs
    costs = _costs(demand, largest, seed)
    max_graphs = 3
    chosen = fastest_list(demand, costs, max_graphs=max_graphs)
    lists = [
        s
        for k in range(1, max_graphs + 1)
        for s in itertools.combinations(range(1, largest + 1), k)
        if s[0] <= demand.max_num_seqs
    ]
    brute = min(predict(demand, costs, s).total_s for s in lists)
    assert predict(demand, costs, chosen).total_s == pytest.approx(brute, rel=1e-12)


@pytest.mark.parametrize("mode", ["full", "mixed"])
def test_predicted_graphs_are_the_planners(mode):
    """A step is timed as a graph exactly where the planner's rule gives it one."""
    demand = _demand(7, mode)
    costs = _costs(demand, 9, 7)
    costs = attrs.evolve(costs, eager_us=np.full(demand.rows.size, -1.0))
    for sizes in ([1, 2, 4, 6], [3, 5], [2, 6, 8, 9], [6]):
        graph_steps = assign(demand, sizes).graph_tokens > 0
        assert np.array_equal(predict(demand, costs, sizes).step_us >= 0, graph_steps)


@pytest.mark.parametrize("seed", range(3))
def test_the_memory_budget_is_never_exceeded(seed):
    demand = _demand(seed, "mixed")
    costs = _costs(demand, 9, seed)
    unlimited = predict(demand, costs, fastest_list(demand, costs, max_graphs=4))
    smallest = min(costs.graph_mib[:, :6].sum(axis=0))
    for budget in np.linspace(smallest * 1.5, unlimited.memory_mib * 1.2, 6):
        chosen = within_memory(demand, costs, max_graphs=4, memory_mib=float(budget))
        held = predict(demand, costs, chosen)
        assert held.memory_mib <= budget + 1e-9
        assert held.total_s >= unlimited.total_s - 1e-12
    with pytest.raises(BucketError, match="fits"):
        within_memory(demand, costs, max_graphs=4, memory_mib=1e-6)
    front = time_memory_front(demand, costs, max_graphs=4)
    memory = [p.memory_mib for p in front]
    assert memory == sorted(memory)
    assert all(a.total_s > b.total_s for a, b in itertools.pairwise(front))


def test_a_budget_without_memory_figures_is_one_clear_error():
    demand = _demand(0, "full")
    costs = _costs(demand, 6, 0, memory=False)
    with pytest.raises(BucketError, match="--graph-memory needs graph memory figures"):
        compare_times(demand, costs, max_graphs=3, memory_mib=512.0)


def test_graph_memory_in_the_engine_profile_round_trips(tmp_path):
    document = json.loads(Path(BUNDLED_PROFILE).read_text())
    document["graph_memory"] = [{"kind": "spec", "size": 8, "mib": 12.5}]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(document))
    profile = read_engine_profile(path)
    assert dict(profile.graph_mib) == {("spec", 8): 12.5}
    assert profile.to_json()["graph_memory"] == document["graph_memory"]
    assert "graph_memory" not in read_engine_profile(BUNDLED_PROFILE).to_json()
    document["graph_memory"] = [{"kind": "eager", "size": 8, "mib": 1.0}]
    path.write_text(json.dumps(document))
    with pytest.raises(EngineProfileError, match="graph_memory entry"):
        read_engine_profile(path)


# --- the bundled trace: the lists against the defaults ----------------------------------


@pytest.fixture(scope="module")
def bundled_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bucket_time") / "azure"
    assert main(["simulate", "sim/data/azure_llm_2023_code.csv", "--out", str(folder)]) == 0
    return folder


@pytest.fixture(scope="module")
def profile_with_memory(tmp_path_factory):
    document = json.loads(Path(BUNDLED_PROFILE).read_text())
    # memory growing with the size, as captured graphs' buffers do
    document["graph_memory"] = [
        {"kind": "spec", "size": s, "mib": 6.0 + 0.25 * s} for s in (1, 8, 32, 128)
    ]
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    path.write_text(json.dumps(document))
    return str(path)


def _rows(output: str) -> dict[str, list[str]]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    return {line[:40].strip(): line[40:].split() for line in lines[start:end]}


@pytest.mark.parametrize("graphs", [None, 8, 4])
@pytest.mark.parametrize("profile", [None, "bundled", "memory"])
def test_never_slower_than_the_defaults_on_the_bundled_trace(
    bundled_run, profile_with_memory, capsys, graphs, profile
):
    args = ["buckets", str(bundled_run)]
    args += [] if graphs is None else ["--max-graphs", str(graphs)]
    args += {None: [], "bundled": ["--profile", BUNDLED_PROFILE]}.get(
        profile, ["--profile", profile_with_memory]
    )
    assert main(args) == 0
    rows = _rows(capsys.readouterr().out)
    totals = {label: float(values[2].replace(",", "")) for label, values in rows.items()}
    defaults = [label for label in rows if "default" in label]
    fastest = [label for label in rows if label.startswith("fastest")]
    assert len(defaults) == 2 and fastest
    for default in defaults:
        label = f"fastest, <= {rows[default][0]} graphs"
        if profile == "memory":  # at no more graph memory than the default's
            label += f", <= {rows[default][-1]} MiB"
            assert (
                float(rows[label][-1].replace(",", ""))
                <= float(rows[default][-1].replace(",", "")) + 0.5
            )
        assert label in fastest and totals[label] <= totals[default]


def test_the_command_writes_the_prediction_and_refuses_a_budget_without_figures(
    bundled_run, profile_with_memory, tmp_path, capsys
):
    toml_path = tmp_path / "sizes.toml"
    args = ["buckets", str(bundled_run), "--profile", profile_with_memory, "--max-graphs", "6"]
    assert main([*args, "--graph-memory", "0.1", "--write", str(toml_path)]) == 0
    text = toml_path.read_text()
    assert "# predicted total step time:" in text and "# graph memory:" in text
    assert "against vLLM default" in text
    capsys.readouterr()
    assert (
        main(["buckets", str(bundled_run), "--profile", BUNDLED_PROFILE, "--graph-memory", "1"])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no graph memory figures for spec graphs" in err[0]
    assert main(["buckets", str(bundled_run), "--graph-memory", "1"]) == 2
    assert "--profile FILE" in capsys.readouterr().err


def test_the_live_check_says_in_one_line_that_there_is_no_cuda_device(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import graph_sizes_live

    monkeypatch.setattr(sys, "argv", ["graph_sizes_live.py", "--live-device", "cuda"])
    assert graph_sizes_live.main() == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "no CUDA device" in out[0]


@pytest.mark.parametrize("mode", ["full", "mixed"])
def test_graph_memory_is_taken_per_graph_in_ascending_sizes(mode):
    """The profile's memory figures: each graph's capture, the free memory before less
    after, keyed by kind and size (a fake device whose captures take size-proportional
    memory)."""
    from stepplan.planner import Planner, PlannerConfig
    from stepplan.sim.timing.profiler import graph_batches, graph_memory

    config = PlannerConfig(
        num_spec_tokens=3, graph_mode=mode, graph_sizes=[1, 2, 4, 8, 32], max_num_seqs=8
    )
    batches = graph_batches(config, num_groups=1)
    free = [10_000 * 2**20]
    captured = []

    def capture(plan):
        captured.append(plan.graph)
        free[0] -= plan.graph.num_tokens * 2**20

    memory = graph_memory(batches, Planner(config), capture, lambda: free[0])
    spec = {("spec", s): 4.0 * s for s in (1, 2, 4, 8)}
    mixed = {("mixed", s): float(s) for s in (2, 4, 8, 32)} if mode == "mixed" else {}
    assert memory == spec | mixed
    assert [g.kind for g in captured] == ["spec"] * 4 + ["mixed"] * len(mixed)


def _profiled_costs(row_context: int):
    """Costs of a small spec workload (one row, two rows, nine rows; a prefill step of 256
    tokens) from the bundled engine profile, and the profile's fit."""
    from stepplan.sim.buckets.bucket_time import size_costs
    from stepplan.sim.settings.config import SimConfig, with_settings
    from stepplan.sim.timing.cost import CostModel

    config = with_settings(
        SimConfig(),
        {
            "model.name": "hybrid-8b",
            "cost.profile": BUNDLED_PROFILE,
            "scheduler.num_spec_tokens": 3,
        },
    )
    cost = CostModel.create(config.model, config.gpu, config.cost, 1)
    spec, prefill = np.array([1, 2, 9, 0]), np.array([0, 0, 0, 1])
    columns = dict(zip(KIND_ROWS.values(), (spec, spec * 0, prefill), strict=True))
    columns |= dict(zip(KIND_TOKENS.values(), (spec * 4, spec * 0, prefill * 256), strict=True))
    demand = step_demand(
        columns, num_spec_tokens=3, graph_mode="full", max_num_seqs=16, row_context=row_context
    )
    return size_costs(demand, cost, 16, 64), cost.engine.fit


def test_times_the_profile_covers_come_from_the_profile():
    """Graph times at the profile's buckets and eager times of the steps it covers are
    its fit's, and a size between two measured buckets lies between their times (not at
    the cost model's level, which is far from a measured engine's)."""
    from stepplan.sim.timing.engine_fit import StepShape

    costs, fit = _profiled_costs(row_context=0)
    for size in (1, 2, 8, 16):
        shape = StepShape(("spec", 4 * size, size, 0), (size, 0, 0), (4 * size, 0, 0), 0, 0, 0.0)
        assert costs.graph_us[0, size - 1] == pytest.approx(fit.predict_us(shape))
    low, high = sorted(costs.graph_us[0, [7, 15]])
    assert low <= costs.graph_us[0, 8] <= high
    eager = StepShape(None, (0, 0, 1), (0, 0, 256), 4, 0, 256 * 257 / 2, 0, 256)
    assert costs.eager_us[3] == pytest.approx(fit.predict_us(eager))
    assert costs.profile_steps >= 4 + 1


def test_graph_times_carry_the_runs_context_on_its_live_rows():
    """With a context per row, a spec graph is priced with that context on the live rows
    its steps hold (one row for size 1), the padding reading none."""
    from stepplan.sim.timing.engine_fit import StepShape

    costs, fit = _profiled_costs(row_context=3000)
    shape = StepShape(("spec", 4, 1, 0), (1, 0, 0), (4, 0, 0), 0, 3000, 0.0, 3000)
    assert costs.graph_us[0, 0] == pytest.approx(fit.predict_us(shape))
    # size 2 holds the steps of one and two rows: 1.5 rounds to 2 live rows
    shape = StepShape(("spec", 8, 2, 0), (2, 0, 0), (8, 0, 0), 0, 6000, 0.0, 3000)
    assert costs.graph_us[0, 1] == pytest.approx(fit.predict_us(shape))
    at_zero, _ = _profiled_costs(row_context=0)
    assert (costs.graph_us[0] > at_zero.graph_us[0]).all()


def test_row_context_is_the_step_weighted_mean_of_each_requests_midpoint():
    from stepplan.sim.buckets.demand import row_context_of

    assert row_context_of(np.array([100, 300]), np.array([10, 20]), np.array([1, 3])) == 259
    assert row_context_of(np.zeros(0), np.zeros(0), np.zeros(0)) == 0
    with pytest.raises(BucketError, match="row_context"):
        step_demand(
            dict.fromkeys([*KIND_ROWS.values(), *KIND_TOKENS.values()], np.zeros(1, np.int64)),
            num_spec_tokens=1,
            graph_mode="full",
            max_num_seqs=4,
            row_context=-1,
        )


def test_the_live_check_records_the_commit_given_and_splits_steps_by_kind():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import graph_sizes_live

    given = graph_sizes_live.given_commit("0123abc")
    assert given["commit"] == "0123abc" and given["commit_source"] == "--commit"
    assert graph_sizes_live.given_commit(None) == {}
    spec, decode = np.array([2, 0, 2, 0, 1, 0]), np.array([0, 3, 0, 0, 0, 0])
    prefill = np.array([0, 0, 0, 1, 1, 0])
    graph = np.array([True, False, False, False, False, False])
    kinds = graph_sizes_live._step_kinds(spec, decode, prefill, graph)
    names = [graph_sizes_live.STEP_KINDS[k] for k in kinds]
    assert names == ["uniform_graph", "uniform_eager", "uniform_eager", "prefill", "mixed", "empty"]


def test_the_report_draws_the_time_memory_front_where_the_profile_has_memory(
    profile_with_memory, tmp_path
):
    runs = {}
    for name, profile in (("memory", profile_with_memory), ("none", BUNDLED_PROFILE)):
        folder = tmp_path / name
        trace = "sim/data/azure_llm_2023_code.csv"
        argv = ["simulate", trace, "--limit", "300", "--profile", profile, "--out", str(folder)]
        assert main([*argv, "--quiet"]) == 0
        assert main(["report", str(folder), "--quiet"]) == 0
        runs[name] = (folder / "report.html").read_text()
    title = "CUDA graphs: predicted step time against graph memory"
    assert title in runs["memory"]
    assert title not in runs["none"]  # the bundled profile measured no graph memory
