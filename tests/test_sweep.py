"""``stepplan sweep``: sweep files (good and bad), the runners giving one table, resuming,
kept runs, the folder rules, the trade-off (Pareto front, best point per SLO) and its
figure."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.sim import cli
from stepplan.sim.results.schema import SWEEP
from stepplan.sim.results.sim_result import read_results
from stepplan.sim.results.table import read_csv
from stepplan.sim.sweep import runner as runner_module
from stepplan.sim.sweep.spec import SweepError, read_sweep
from stepplan.sim.sweep.tradeoff import Slo, best_points, pareto_front

SYNTHETIC = "synthetic:n=40,rate=10,prompt=uniform:64:512,output=uniform:4:48"
SWEEP_FILE = f"""
traces = ["{SYNTHETIC}"]
[grid]
scheduler.num_spec_tokens = [1, 3]
workload.rate_scale = [1, 3]
[slos]
tight = {{ ttft_p99_ms = 60, tpot_p99_ms = 3 }}
loose = {{ ttft_p99_ms = 1000, tpot_p99_ms = 50 }}
"""


def write(folder: Path, text: str, name: str = "sweep.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def sweep(path: Path, out: Path, *extra: str) -> int:
    return cli.main(["sweep", str(path), "--out", str(out), "--quiet", *extra])


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """The sweep file's four points run one after the other in this process."""
    folder = tmp_path_factory.mktemp("serial")
    assert sweep(write(folder, SWEEP_FILE), folder / "out", "--workers", "1") == 0
    return folder / "out"


# ------------------------------------------------------------------ sweep files


def test_points_are_each_listed_point_crossed_with_the_grid(tmp_path):
    text = """
traces = ["synthetic:n=5", "synthetic:n=6"]
[settings]
scheduler.max_num_seqs = 32
[grid]
workload.rate_scale = [1, 2, 4]
[[points]]
scheduler.num_spec_tokens = 1
[[points]]
scheduler.num_spec_tokens = 2
planner.graph_mode = "mixed"
"""
    spec = read_sweep(write(tmp_path, text))
    assert [t.label for t in spec.traces] == ["synthetic", "synthetic-2"]
    assert spec.keys == ("scheduler.num_spec_tokens", "workload.rate_scale", "planner.graph_mode")
    assert len(spec.points) == 6
    assert [dict(p) for p in spec.points[3:4]] == [
        {"scheduler.num_spec_tokens": 2, "planner.graph_mode": "mixed", "workload.rate_scale": 1}
    ]
    assert {c.scheduler.max_num_seqs for c in spec.configs} == {32}
    assert [c.workload.rate_scale for c in spec.configs] == [1.0, 2.0, 4.0] * 2


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(1, 64), min_size=1, max_size=3, unique=True), min_size=1, max_size=3
    )
)
def test_a_grid_is_its_cartesian_product(tmp_path_factory, sizes):
    keys = ["scheduler.max_num_seqs", "scheduler.num_groups", "seed"][: len(sizes)]
    text = "[grid]\n" + "".join(f"{k} = {v}\n" for k, v in zip(keys, sizes, strict=False))
    spec = read_sweep(write(tmp_path_factory.mktemp("grid"), text))
    combos = [tuple(point[k] for k in keys) for point in spec.points]
    assert len(combos) == len(set(combos)) == int(np.prod([len(v) for v in sizes]))
    assert all(combo[i] in sizes[i] for combo in combos for i in range(len(keys)))


#: (sweep file, what the one line says after "stepplan: error: FILE: ").
BAD_FILES = [
    ("[grid]\nscheduler.max_num_seq = [1, 2]\n", "[grid]: scheduler.max_num_seq: unknown setting"),
    ("[grid]\nschedule.max_num_seqs = [1]\n", "[grid]: schedule.max_num_seqs: unknown setting"),
    ("[grid]\nscheduler.max_num_seqs = []\n", "[grid] scheduler.max_num_seqs: empty list"),
    ("[grid]\nscheduler.max_num_seqs = 64\n", "[grid] scheduler.max_num_seqs: must be a list"),
    ("[grid]\n", "nothing to sweep"),
    ("", "nothing to sweep"),
    ('[grid]\nscheduler.max_num_seqs = ["a"]\n', "scheduler.max_num_seqs: must be an integer"),
    ("[grid]\nscheduler.max_num_seqs = [64.5]\n", "scheduler.max_num_seqs: must be an integer"),
    ('[settings]\nplanner.graph_mode = "fast"\n[grid]\nseed = [1]\n', "graph_mode: must be one of"),
    ("[grid]\nscheduler.max_num_seqs = [9000]\n", "point 0 (scheduler.max_num_seqs=9000)"),
    ('traces = ["nope.csv"]\n[grid]\nseed = [1]\n', "traces[0]: nope.csv: no such trace file"),
    ("traces = []\n[grid]\nseed = [1]\n", "traces: must be a non-empty list"),
    ('traces = [{path = "x", fmt = "azure"}]\n[grid]\nseed = [1]\n', "traces[0]: fmt: unknown"),
    ("grids = 1\n", "grids: unknown key"),
    ("[grid]\nseed = [1\n", "Unclosed array"),
    ("points = [1]\n", "points[0]: must be a table"),
    ("[[points]]\nseed = 1\n[grid]\nseed = [2]\n", "points[0]: seed: also in [grid]"),
    (
        "[grid]\nseed = [1]\n[slos]\nx = { ttft_p98_ms = 1 }\n",
        "[slos] x.ttft_p98_ms: 'ttft_p98_ms'",
    ),
    (
        '[grid]\nseed = [1]\n[slos]\nx = { ttft_p99_ms = "a" }\n',
        "the limit must be a finite number",
    ),
    ('[grid]\nseed = [1]\n[tradeoff]\nx = "speed"\n', "[tradeoff] x: 'speed' is not a metric"),
    ('config = "missing.toml"\n[grid]\nseed = [1]\n', "config: "),
]


@pytest.mark.parametrize(("text", "said"), BAD_FILES)
def test_a_bad_sweep_file_is_one_line_and_writes_nothing(tmp_path, capsys, text, said):
    path = write(tmp_path, text)
    out = tmp_path / "out"
    assert sweep(path, out) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    assert err.startswith(f"stepplan: error: {path}: ") and said in err, err
    assert not out.exists()


def test_a_trace_that_does_not_parse_is_named_before_any_point_runs(tmp_path, capsys):
    trace = write(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens\n0,12,x\n", "t.csv")
    path = write(tmp_path, f'traces = ["{trace.name}"]\n[grid]\nseed = [1, 2]\n')
    assert sweep(path, tmp_path / "out") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"stepplan: error: {path}: traces[0]: {trace}:2") and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_a_point_that_cannot_fit_its_trace_is_refused_first(tmp_path, capsys):
    text = f'traces = ["{SYNTHETIC}"]\n[grid]\nmodel.max_model_len = [4096, 50]\n'
    assert sweep(write(tmp_path, text), tmp_path / "out") == 2
    err = capsys.readouterr().err.strip()
    assert "all 40 requests exceed model.max_model_len = 50" in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_a_trace_without_arrival_times_is_drawn_at_each_points_rate(tmp_path):
    rows = "".join(f"{64 + i},{8 + i % 5}\n" for i in range(30))
    write(tmp_path, "input_tokens,output_tokens\n" + rows, "lengths.csv")
    text = 'traces = ["lengths.csv"]\n[grid]\nworkload.rate = [2.0, 50.0]\n'
    assert sweep(write(tmp_path, text), tmp_path / "out", "--workers", "1") == 0
    table = read_csv(tmp_path / "out" / "sweep.csv", SWEEP)
    slow, fast = table["duration_s"]
    assert table["requests"].tolist() == [30, 30] and fast < slow / 5


def test_ray_missing_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert sweep(write(tmp_path, SWEEP_FILE), tmp_path / "out", "--ray") == 2
    err = capsys.readouterr().err.strip()
    assert err == "stepplan: error: --ray needs Ray, which is not installed: " + (
        "pip install 'stepplan[ray]'"
    )
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ runners and the table


def test_the_table_has_a_row_per_point_with_settings_and_metrics(serial):
    table = read_csv(serial / "sweep.csv", SWEEP)
    assert table.num_rows == 4
    assert list(table)[:5] == [
        "point",
        "trace",
        "digest",
        "scheduler.num_spec_tokens",
        "workload.rate_scale",
    ]
    assert list(table)[5:] == list(SWEEP.names[3:])
    assert table["scheduler.num_spec_tokens"].tolist() == [1, 1, 3, 3]
    assert table["workload.rate_scale"].tolist() == [1.0, 3.0, 1.0, 3.0]
    records = {p.stem: json.loads(p.read_text()) for p in (serial / "points").glob("*.json")}
    assert sorted(records) == sorted(table["digest"].tolist())
    for row, digest in enumerate(table["digest"]):
        summary = records[digest]["summary"]
        assert table["ttft_p99_ms"][row] == summary["latency_ms"]["ttft"]["p99"]
        assert table["steps"][row] == summary["steps"]["count"]
    measured = read_csv(serial / "sweep_measured.csv")
    assert (measured["wall_s"] > 0).all() and "wall_s" not in table


def test_the_table_is_in_parquet_too_when_pyarrow_is_installed(serial):
    pq = pytest.importorskip("pyarrow.parquet")
    table = read_csv(serial / "sweep.csv", SWEEP)
    parquet = pq.read_table(serial / "sweep.parquet")
    assert parquet.column_names == list(table)
    for name in table:
        assert parquet.column(name).to_pylist() == table[name].tolist(), name


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_two_workers_give_the_serial_table(serial, tmp_path, monkeypatch, start):
    monkeypatch.setattr(runner_module, "start_method", lambda: start)
    assert sweep(write(tmp_path, SWEEP_FILE), tmp_path / "out", "--workers", "2") == 0
    for name in ("sweep.csv", "sweep.json"):
        assert (tmp_path / "out" / name).read_bytes() == (serial / name).read_bytes(), name


def test_a_ray_sweep_gives_the_local_table(serial, tmp_path, local_ray):
    assert sweep(write(tmp_path, SWEEP_FILE), tmp_path / "out", "--ray") == 0
    assert local_ray.is_initialized()  # a Ray it did not start is left running
    for name in ("sweep.csv", "sweep.json"):
        assert (tmp_path / "out" / name).read_bytes() == (serial / name).read_bytes(), name


def test_workers_are_forked_only_from_a_process_of_one_thread():
    import subprocess
    import threading

    ask = "from stepplan.sim.sweep.runner import start_method; print(start_method())"
    alone = subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True)
    assert alone.stdout.strip() == ("fork" if sys.platform.startswith("linux") else "spawn")
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert runner_module.start_method() == "spawn"
    finally:
        release.set()
        other.join()


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_stopped_pool_ends_its_workers_at_once(start):
    """Stopping run_local drops the points still running: their workers are terminated
    (exit code -SIGTERM), not waited for, even where a forked worker inherited a
    SIGTERM handler that only asks to stop."""
    import multiprocessing
    import threading

    from stepplan.sim.run import prepare_requests
    from stepplan.sim.settings.config import SimConfig
    from stepplan.sim.workloads import parse_synthetic

    config = SimConfig()
    quick = prepare_requests(parse_synthetic("synthetic:n=5,output=fixed:4"), config)
    slow = prepare_requests(parse_synthetic("synthetic:n=100000,rate=50"), config)  # minutes
    tasks = [runner_module.PointTask("quick", quick, config)]
    tasks += [runner_module.PointTask(f"slow{i}", slow, config) for i in range(3)]
    stop, done, workers = threading.Event(), [], []

    def finished(outcome):
        done.append(outcome.digest)
        workers.extend(multiprocessing.active_children())
        stop.set()

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        runner_module.run_local(tasks, finished, stop, workers=2, start=start)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert done == ["quick"] and len(workers) == 2
    assert [worker.exitcode for worker in workers] == [-signal.SIGTERM] * 2
    assert not multiprocessing.active_children()


# ------------------------------------------------------------------ resuming


class CountingRuns:
    """Counts (and optionally interrupts) the points run in this process."""

    def __init__(self, monkeypatch, interrupt_after: int | None = None) -> None:
        self.digests: list[str] = []
        self.interrupt_after = interrupt_after
        real = runner_module.run_point

        def counted(task, stop=None):
            outcome = real(task, stop)
            self.digests.append(task.digest)
            if len(self.digests) == self.interrupt_after:
                os.kill(os.getpid(), signal.SIGINT)  # a first Ctrl-C: stop after this point
            return outcome

        monkeypatch.setattr(runner_module, "run_point", counted)


def test_a_rerun_runs_only_the_points_not_done(serial, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    half = SWEEP_FILE.replace(
        "scheduler.num_spec_tokens = [1, 3]", "scheduler.num_spec_tokens = [3]"
    )
    runs = CountingRuns(monkeypatch)
    assert sweep(write(tmp_path, half, "half.toml"), out, "--workers", "1") == 0
    first = {p.name: p.stat().st_mtime_ns for p in (out / "points").iterdir()}
    assert len(runs.digests) == len(first) == 2
    assert sweep(write(tmp_path, SWEEP_FILE), out, "--workers", "1") == 0
    assert len(runs.digests) == 4  # the two new points, and nothing else
    assert not set(runs.digests[2:]) & {name.removesuffix(".json") for name in first}
    for name, stamp in first.items():
        assert (out / "points" / name).stat().st_mtime_ns == stamp  # not written again
    assert (out / "sweep.csv").read_bytes() == (serial / "sweep.csv").read_bytes()
    assert sweep(write(tmp_path, SWEEP_FILE), out, "--workers", "1") == 0
    assert len(runs.digests) == 4  # all done: nothing runs
    assert sweep(write(tmp_path, SWEEP_FILE), out, "--workers", "1", "--overwrite") == 0
    assert len(runs.digests) == 8  # --overwrite runs every point again


def test_an_interrupted_sweep_keeps_its_points_and_a_rerun_finishes(
    serial, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "out"
    path = write(tmp_path, SWEEP_FILE)
    runs = CountingRuns(monkeypatch, interrupt_after=1)
    assert sweep(path, out, "--workers", "1") == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("stepplan: interrupted by SIGINT; 1 of 4 points done")
    manifest = json.loads((out / "stepplan-manifest.json").read_text())
    assert manifest["complete"] is False and "points" in manifest["entries"]
    assert read_csv(out / "sweep.csv", SWEEP)["point"].tolist() == [0]
    runs.interrupt_after = None
    assert sweep(path, out, "--workers", "1") == 0
    assert len(runs.digests) == 4 and len(set(runs.digests)) == 4
    assert (out / "sweep.csv").read_bytes() == (serial / "sweep.csv").read_bytes()
    assert json.loads((out / "stepplan-manifest.json").read_text())["complete"] is True


def test_a_sweep_stopped_in_its_first_point_writes_nothing(tmp_path, monkeypatch, capsys):
    real = runner_module.run_point

    def interrupted(task, stop=None):
        os.kill(os.getpid(), signal.SIGTERM)  # while the point runs: it stops, unrecorded
        return real(task, stop)

    monkeypatch.setattr(runner_module, "run_point", interrupted)
    out = tmp_path / "out"
    assert sweep(write(tmp_path, SWEEP_FILE), out, "--workers", "1") == 143
    err = capsys.readouterr().err.strip()
    assert err == "stepplan: interrupted by SIGTERM; no point had finished, nothing written"
    assert not out.exists()


def test_kept_runs_are_results_folders_of_their_points(tmp_path):
    text = SWEEP_FILE.replace("workload.rate_scale = [1, 3]", "workload.rate_scale = [2]")
    out = tmp_path / "out"
    assert sweep(write(tmp_path, text), out, "--workers", "1", "--keep-runs") == 0
    table = read_csv(out / "sweep.csv", SWEEP)
    for row, digest in enumerate(table["digest"]):
        run = read_results(out / "runs" / digest)
        assert run.summary["config"]["workload"]["rate_scale"] == 2.0
        assert run.summary["steps"]["count"] == table["steps"][row]
        assert run.summary["provenance"]["trace"] == {"source": "synthetic", "spec": SYNTHETIC}
    assert "runs" in json.loads((out / "stepplan-manifest.json").read_text())["entries"]


def test_the_folder_rules_hold(tmp_path, capsys):
    path = write(tmp_path, SWEEP_FILE)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert sweep(path, foreign) == 2
    assert "holds files stepplan did not write" in capsys.readouterr().err
    run = tmp_path / "run"
    assert cli.main(["simulate", SYNTHETIC, "--quiet", "--out", str(run)]) == 0
    assert sweep(path, run) == 2
    assert "holds a stepplan simulate run, not a sweep run" in capsys.readouterr().err


# ------------------------------------------------------------------ the trade-off


def test_the_best_point_per_slo_and_the_front_are_saved_and_drawn(serial):
    document = json.loads((serial / "sweep.json").read_text())
    table = read_csv(serial / "sweep.csv", SWEEP)
    assert document["tradeoff"] == {
        "x": "tpot_p99_ms",
        "x_better": "lower",
        "y": "output_tok_s",
        "y_better": "higher",
    }
    loose = next(b for b in document["best"] if b["slo"] == "loose")
    met = (table["ttft_p99_ms"] <= 1000) & (table["tpot_p99_ms"] <= 50)
    assert loose["point"] == int(np.argmax(np.where(met, table["output_tok_s"], -1)))
    assert loose["settings"] == {
        "scheduler.num_spec_tokens": int(table["scheduler.num_spec_tokens"][loose["point"]]),
        "workload.rate_scale": float(table["workload.rate_scale"][loose["point"]]),
    }
    front = pareto_front(table["tpot_p99_ms"], table["output_tok_s"])
    assert document["pareto_front"] == {"synthetic": np.flatnonzero(front).tolist()}
    assert (serial / "sweep.png").stat().st_size > 10_000


_VALUES = st.lists(st.sampled_from([1.0, 2.0, 3.0, np.nan]) | st.floats(0, 10), max_size=30)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_pareto_front_is_the_points_nobody_beats(data):
    x = np.array(data.draw(_VALUES))
    y = np.array(
        data.draw(st.lists(st.floats(0, 10) | st.just(2.0), min_size=x.size, max_size=x.size))
    )
    front = pareto_front(x, y)
    valid = np.isfinite(x) & np.isfinite(y)
    for i in range(x.size):
        beaten = valid & (x <= x[i]) & (y >= y[i]) & ((x < x[i]) | (y > y[i]))
        assert front[i] == (valid[i] and not beaten.any()), (i, x, y)


def test_best_points_take_the_highest_y_that_meets_the_slo():
    columns = {
        "trace": np.array(["a", "a", "a", "b"]),
        "ttft_p99_ms": np.array([10.0, 50.0, np.nan, 10.0]),
        "output_tok_s": np.array([1.0, 5.0, 9.0, 2.0]),
    }
    slo = Slo("s", (("ttft_p99_ms", 20.0),))
    assert best_points(columns, [slo], "output_tok_s") == [("a", slo, 0), ("b", slo, 3)]
    never = Slo("never", (("ttft_p99_ms", 1.0),))
    assert best_points(columns, [never], "output_tok_s")[0] == ("a", never, None)


def test_the_example_sweep_file_reads(tmp_path):
    example = Path(__file__).resolve().parents[1] / "docs" / "sweep_example.toml"
    spec = read_sweep(example)
    assert len(spec.points) == 16 and spec.slos is not None
    with pytest.raises(SweepError, match="unknown key"):
        read_sweep(write(tmp_path, example.read_text() + "\nextra = 1\n"))
