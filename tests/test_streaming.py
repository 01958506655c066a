"""Results stream: the loop hands its steps on in chunks, the command line writes them as
the run goes and reads them back a chunk at a time, and nothing of it changes a result.
The chunks are made small here (``records.CHUNK_STEPS``) so that every run has many."""

from __future__ import annotations

import json
import os
import signal
import threading

import numpy as np
import pytest
from golden_sim import GOLDEN, RUNS, digests
from test_stepper import COMPILED, golden_config

from stepplan.sim import cli
from stepplan.sim.buckets.demand import compare_to_defaults, step_demand
from stepplan.sim.cli.report_reading import read_report_run
from stepplan.sim.results import records
from stepplan.sim.results.schema import REQUESTS, STEPS
from stepplan.sim.results.sim_result import SHAPE_COLUMNS, StepShapes, read_results, write_results
from stepplan.sim.results.table import ResultsError, iter_csv, read_csv
from stepplan.sim.run import simulate
from stepplan.sim.settings.config import SimConfig, with_settings
from stepplan.sim.workloads import parse_synthetic

EXPECTED = json.loads(GOLDEN.read_text())
WORKLOAD = "synthetic:n=300,rate=30,cv2=2,prompt=uniform:16:900,output=uniform:1:120"


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(records, "CHUNK_STEPS", 97)  # prime: chunks end anywhere


@pytest.mark.parametrize("native", [True, False] if COMPILED else [False])
@pytest.mark.parametrize(("name", "trace", "run_settings"), RUNS[:4], ids=[r[0] for r in RUNS[:4]])
def test_small_chunks_give_the_golden_tables(small_chunks, name, trace, run_settings, native):
    table, config = golden_config(trace, run_settings)
    result = simulate(table, config, native=native)
    assert result.steps.num_rows > 3 * records.CHUNK_STEPS
    for part in ("steps", "requests"):
        got, want = digests(getattr(result, part)), EXPECTED[name][part]
        assert {k: got[k] for k in want} == want, part


def test_the_summary_is_the_same_for_any_store(small_chunks, tmp_path):
    """The command line streams into its folder; the library keeps every step in memory
    and writes them after: the same files, byte for byte (the provenance aside)."""
    out = tmp_path / "streamed"
    assert cli.main(["simulate", WORKLOAD, "--quiet", "--out", str(out)]) == 0
    args = cli.build_parser().parse_args(["simulate", WORKLOAD])
    config = cli.build_config(args)
    kept = simulate(cli.load_requests(args, config), config)
    written = write_results(kept, tmp_path / "kept")
    for name in ("steps.csv", "requests.csv"):
        assert (out / name).read_bytes() == (written / name).read_bytes(), name
    streamed = json.loads((out / "summary.json").read_text())
    streamed.pop("provenance")
    assert streamed == json.loads((written / "summary.json").read_text())


def test_the_summary_does_not_depend_on_the_chunks(monkeypatch):
    """Floats are summed per block of ``summary.SUM_STEPS`` steps, whatever the chunks."""
    from stepplan.sim.results import summary

    monkeypatch.setattr(summary, "SUM_STEPS", 300)
    config, table = SimConfig(), parse_synthetic(WORKLOAD, seed=5)
    whole = simulate(table, config).summary
    monkeypatch.setattr(records, "CHUNK_STEPS", 97)
    chunked = simulate(table, config).summary
    assert whole["steps"]["count"] > 4 * 300
    for document in (whole, chunked):
        document.pop("measured")
    assert chunked == whole


def test_a_stopped_run_streams_the_rows_it_has(small_chunks, tmp_path):
    config = with_settings(SimConfig(), {"scheduler.num_spec_tokens": 2})
    table = parse_synthetic(WORKLOAD)
    stop = threading.Event()

    class StopAt:
        def update(self, steps, finished, clock_s):
            if steps == 5 * records.CHUNK_STEPS + 3:
                stop.set()

        def close(self):
            pass

    result = simulate(table, config, progress=StopAt(), stop=stop)
    assert result.summary["complete"] is False
    back = read_results(write_results(result, tmp_path / "run"))
    assert back.steps.num_rows == 5 * records.CHUNK_STEPS + 3
    for name, column in result.requests.items():
        np.testing.assert_array_equal(back.requests[name], column, err_msg=name)


def test_a_stop_before_the_first_step_writes_nothing(tmp_path, monkeypatch, capsys):
    """A signal while the trace's rows are spooled, before any step: one line, exit 130,
    and the folder the run made is gone again."""
    from stepplan.sim.results import writer

    spool = writer.RequestLines.__init__

    def signalled(self, stage, rows, stop):
        os.kill(os.getpid(), signal.SIGINT)  # the command's handler sets the stop event
        spool(self, stage, rows, stop)

    monkeypatch.setattr(writer.RequestLines, "__init__", signalled)
    assert cli.main(["simulate", WORKLOAD, "--quiet", "--out", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err.strip()
    assert err == "stepplan: interrupted by SIGINT; stopped before the first step, nothing written"
    assert list(tmp_path.iterdir()) == []


def test_step_shapes_score_as_every_step_does():
    config = with_settings(SimConfig(), {"planner.graph_mode": "mixed"})
    result = simulate(parse_synthetic(WORKLOAD, seed=4), config)
    shapes = StepShapes()
    for start in range(0, result.steps.num_rows, 50):
        shapes.add({name: result.steps[name][start : start + 50] for name in result.steps})
    table = shapes.table()
    assert table.num_rows < result.steps.num_rows and table["step_count"].sum() == (
        result.steps.num_rows
    )
    limits = {"num_spec_tokens": 3, "graph_mode": "mixed", "max_num_seqs": 256}
    every = compare_to_defaults(step_demand(result.steps, **limits), max_graphs=6)
    few = compare_to_defaults(step_demand(table, **limits), max_graphs=6)
    assert few == every  # the same lists, hits and padding, to the token


def test_chunked_reading_equals_whole_and_names_lines_across_chunks(tmp_path):
    result = simulate(parse_synthetic(WORKLOAD), SimConfig())
    folder = write_results(result, tmp_path / "run")
    whole = read_csv(folder / "steps.csv", STEPS)
    chunks = list(iter_csv(folder / "steps.csv", STEPS, rows=37))
    assert len(chunks) == -(-whole.num_rows // 37)
    for name in whole:
        np.testing.assert_array_equal(np.concatenate([c[name] for c in chunks]), whole[name])
    picked = next(iter_csv(folder / "steps.csv", STEPS, columns=SHAPE_COLUMNS))
    assert tuple(picked) == tuple(c for c in whole if c in SHAPE_COLUMNS)
    lines = (folder / "requests.csv").read_text().splitlines()
    for cell, value, message in (
        (1, "x", "column 'arrival_s' has 'x', expected a number"),
        (9, "99999999999999999999", "column 'num_steps' has '99999999999999999999', beyond int64"),
    ):
        cells = lines[200].split(",")
        cells[cell] = value
        changed = [*lines[:200], ",".join(cells), *lines[201:]]
        (folder / "requests.csv").write_text("\n".join(changed) + "\n")
        with pytest.raises(ResultsError, match=f"requests.csv:201: {message}"):
            list(iter_csv(folder / "requests.csv", REQUESTS, rows=37))


def test_a_report_of_a_long_run_draws_a_sample_and_says_so(small_chunks, tmp_path, monkeypatch):
    from stepplan.sim.cli import report_reading

    monkeypatch.setattr(report_reading, "FIGURE_STEPS", 100)
    out = tmp_path / "run"
    argv = ["simulate", WORKLOAD, "--quiet", "--out", str(out), "--report"]
    assert cli.main(argv) == 0
    page = (out / "report.html").read_text()
    run = read_report_run(out)
    steps = run.latency.summary["steps"]["count"]
    assert run.every == -(-steps // 100) > 1
    assert f"draw every {run.every:,}th step" in page and page.count("<img") >= 5
    assert run.head.steps.num_rows == min(steps, report_reading.HEAD_STEPS)
    assert int(run.shapes.steps["step_count"].sum()) == steps
    whole = read_results(out)
    kv = whole.steps["kv_usage"]
    assert run.sample.steps["kv_usage"].max() == kv.max()  # the peaks are kept
    assert set(run.sample.steps["step"]) >= set(range(0, steps, run.every))
    # The composition over the run counts every step, not the drawn sample.
    from stepplan.plots.timeline import composition_sums

    edges = np.append(run.composition["start_s"], run.composition["end_s"][-1])
    for name, values in composition_sums(whole.steps, edges).items():
        np.testing.assert_allclose(run.composition[name], values, err_msg=name)
    assert run.composition["steps"].sum() == steps
