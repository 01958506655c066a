"""Every figure draws a non-empty PNG and SVG from a small simulation, and refuses empty
or mismatched input with an error that says what is wrong."""

from __future__ import annotations

import csv

import networkx as nx
import numpy as np
import pytest
from synthetic_results import synthetic_requests, synthetic_steps, write_synthetic_results

from stepplan.planner import PlannerConfig, StepBatch, compile_plan
from stepplan.plots.bucketing import Bucketing, plot_bucketing, run_bucketing
from stepplan.plots.canvas import figure_bytes, is_figure
from stepplan.plots.host import plot_host_time, seed_host_us
from stepplan.plots.latency import plot_latency_cdfs
from stepplan.plots.opgraph import plot_op_graph
from stepplan.plots.timeline import plot_timeline
from stepplan.sim.results.sim_result import SimResult, read_results, write_results
from stepplan.sim.results.table import ResultsError, Table
from stepplan.sim.run import simulate
from stepplan.sim.settings.config import SimConfig, with_settings
from stepplan.sim.timing.cost import SEED_MIXED_US, SEED_UNIFORM_US
from stepplan.sim.workloads import parse_synthetic


@pytest.fixture(scope="module")
def simulation():
    """A small real simulation (60 requests, Q = 4), as the simulator returns it."""
    config = with_settings(SimConfig(), {"scheduler.num_spec_tokens": 3, "scheduler.num_groups": 2})
    table = parse_synthetic("synthetic:n=60,rate=20,prompt=uniform:16:600,output=uniform:2:60")
    return simulate(table, config)


@pytest.fixture(scope="module")
def simulated(simulation, tmp_path_factory):
    """That simulation written and read back."""
    folder = tmp_path_factory.mktemp("sim") / "run"
    write_results(simulation, folder)
    return read_results(folder)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return read_results(write_synthetic_results(tmp_path_factory.mktemp("syn") / "run"))


def example_plan():
    batch = StepBatch(
        query_lens=[4, 2, 1, 300],
        num_computed_tokens=[9, 9, 3, 0],
        slots=[[1, 2, 3, 4], [5, 6, 7, 8]],
        num_draft_tokens=[3, 1, -1, -1],
        num_accepted_tokens=[2, 1, 1, 1],
    )
    return compile_plan(batch, PlannerConfig(num_spec_tokens=3, graph_mode="mixed"))


FIGURES = {
    "bucketing": plot_bucketing,
    "timeline": plot_timeline,
    "latency": lambda results: plot_latency_cdfs([results]),
    "host": plot_host_time,
}


def save_figure(figure, path):
    path.write_bytes(figure_bytes(figure, path.suffix[1:]))
    return path


def assert_images(figure, tmp_path, name):
    png = save_figure(figure, tmp_path / f"{name}.png")
    svg = save_figure(figure, tmp_path / f"{name}.svg")
    assert is_figure(png.read_bytes()) and is_figure(svg.read_bytes())
    assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 5000
    assert b"<svg" in svg.read_bytes()[:2000] and svg.stat().st_size > 5000
    axes = [a for a in figure.axes if a.has_data()]
    assert axes, f"{name}: no axes hold data"


@pytest.mark.parametrize("name", FIGURES)
def test_every_figure_draws_from_a_small_simulation(simulated, tmp_path, name):
    assert simulated.steps.num_rows > 20
    assert_images(FIGURES[name](simulated), tmp_path, name)


def test_op_graph_figure(tmp_path):
    assert_images(plot_op_graph(example_plan()), tmp_path, "opgraph")


def test_figures_render_the_same_bytes_twice(synthetic):
    first = figure_bytes(plot_timeline(synthetic), "svg")
    assert first == figure_bytes(plot_timeline(synthetic), "svg")


def test_bucketing_compares_several_lists(synthetic, tmp_path):
    own = run_bucketing(synthetic)
    steps = synthetic.steps.num_rows
    eager = Bucketing("all eager", np.zeros(steps), np.zeros(steps), (), ())
    assert own.token_edges and set(own.token_edges) <= set(own.graph_tokens.tolist())
    assert_images(plot_bucketing(synthetic, [own, eager]), tmp_path, "two")
    figure = plot_bucketing(synthetic, [eager])  # nothing replays a graph: said, not failed
    assert "no step replays a graph" in [t.get_text() for t in figure.axes[2].texts]


def test_host_time_uses_the_seed_figures_per_group(synthetic):
    seed = seed_host_us(synthetic, num_groups=3)
    rows = synthetic.steps.column("num_rows")
    uniform = (synthetic.steps.column("num_spec_rows") == rows) | (
        synthetic.steps.column("num_decode_rows") == rows
    )
    assert np.all(seed[uniform] == 3 * SEED_UNIFORM_US)
    assert np.all(seed[~uniform] == 3 * SEED_MIXED_US)


@pytest.mark.parametrize("spec_tokens", [0, 3])  # 0: pure decode steps, where they differed
def test_the_figure_draws_what_the_seed_host_cost_charges(spec_tokens):
    config = with_settings(
        SimConfig(),
        {
            "cost.host_cost": "seed",
            "scheduler.num_groups": 2,
            "scheduler.num_spec_tokens": spec_tokens,
        },
    )
    table = parse_synthetic("synthetic:n=60,rate=20,prompt=uniform:8:600,output=uniform:1:90")
    result = simulate(table, config)
    kinds = result.steps.column("num_decode_rows") == result.steps.column("num_rows")
    assert kinds.any() == (spec_tokens == 0)
    np.testing.assert_array_equal(seed_host_us(result, 2) * 1e-6, result.steps.column("host_s"))


def in_memory(steps, requests, summary):
    """A result held in memory, as a simulation just run gives it."""
    return SimResult(steps, requests, np.zeros(0), summary)


def empty_results(synthetic):
    steps = {key: column[:0] for key, column in synthetic.steps.items()}
    requests = {key: column[:0] for key, column in synthetic.requests.items()}
    return in_memory(steps, requests, synthetic.summary)


@pytest.mark.parametrize("name", FIGURES)
def test_figures_refuse_an_empty_run(synthetic, name):
    with pytest.raises(ResultsError, match="no rows"):
        FIGURES[name](empty_results(synthetic))


def test_mismatched_input_is_refused_with_a_clear_error(synthetic):
    with pytest.raises(ResultsError, match="different lengths"):
        Table.from_columns("steps.csv", {"step": [0, 1], "num_rows": [1]})
    wrong = Bucketing("short", np.zeros(3), np.zeros(3), (), ())
    with pytest.raises(ResultsError, match="has 3 steps"):
        plot_bucketing(synthetic, [wrong])
    with pytest.raises(ResultsError, match="graph_rows"):
        Bucketing("bad", np.zeros(3), np.zeros(4), (), ())
    with pytest.raises(ResultsError, match="2 labels for 1 runs"):
        plot_latency_cdfs([synthetic], ["a", "b"])
    with pytest.raises(ResultsError, match="at least one run"):
        plot_latency_cdfs([])
    short_itl = in_memory(synthetic.steps, synthetic.requests, {"itl_ms_quantiles": [1.0, 2.0]})
    with pytest.raises(ResultsError, match="101 ascending"):
        plot_latency_cdfs([short_itl])
    with pytest.raises(ResultsError, match="outside"):
        plot_timeline(synthetic, first_step=10**6)
    with pytest.raises(ResultsError, match="num_groups"):
        plot_host_time(synthetic, num_groups=0)
    no_steps = in_memory({"step": [0]}, synthetic.requests, {})
    with pytest.raises(ResultsError, match="missing column 'graph_hit'"):
        plot_bucketing(no_steps)


def test_op_graph_refuses_graphs_that_are_not_op_graphs():
    with pytest.raises(ResultsError, match="empty"):
        plot_op_graph(nx.DiGraph())
    graph = nx.DiGraph()
    graph.add_edge("a", "b")
    with pytest.raises(ResultsError, match="node 'a': kind"):
        plot_op_graph(graph)
    nx.set_node_attributes(graph, "buffer", "kind")
    with pytest.raises(ResultsError, match="must join an op and a buffer"):
        plot_op_graph(graph)
    with pytest.raises(ResultsError, match="DiGraph"):
        plot_op_graph([1, 2])


def test_loading_names_the_file_line_and_column(synthetic, tmp_path):
    folder = write_synthetic_results(tmp_path / "bad", num_steps=5, num_requests=4)
    rows = list(csv.reader((folder / "steps.csv").open()))
    rows[3][rows[0].index("num_tokens")] = "many"
    with (folder / "steps.csv").open("w", newline="") as file:
        csv.writer(file).writerows(rows)
    with pytest.raises(ResultsError, match=r"steps.csv:4: column 'num_tokens' has 'many'"):
        read_results(folder)
    (folder / "steps.csv").write_text("step,num_rows\n0,1\n1\n")
    with pytest.raises(ResultsError, match=r"steps.csv:3: 1 fields, the header has 2"):
        read_results(folder)
    (folder / "summary.json").unlink()
    with pytest.raises(ResultsError, match=r"summary\.json: missing"):
        read_results(folder)
    with pytest.raises(ResultsError, match="not a results folder"):
        read_results(tmp_path / "nowhere")


def assert_same_columns(table, written):
    """``table`` (read back by the plots) holds every written column, in order, with the
    simulator's type and values: what keeps the reader's column types on the schema."""
    assert list(table.columns) == list(written), table.name
    for name, column in written.items():
        loaded = table.column(name)
        assert not loaded.flags.writeable
        if column.dtype.kind in "OU":  # graph_kind
            assert loaded.dtype.kind == "U" and loaded.tolist() == column.tolist(), name
        else:
            assert loaded.dtype == column.dtype, name
            assert np.array_equal(loaded, column, equal_nan=column.dtype.kind == "f"), name


def test_loaded_columns_match_what_was_written(simulation, simulated, synthetic):
    assert_same_columns(simulated.steps, simulation.steps)
    assert_same_columns(simulated.requests, simulation.requests)
    # The synthetic folder has what a short run may lack: a one-token output (TPOT empty).
    assert np.isnan(synthetic.requests.column("tpot_s")).any()
    assert_same_columns(synthetic.steps, synthetic_steps(300, 0))
    assert_same_columns(synthetic.requests, synthetic_requests(40, 0))
