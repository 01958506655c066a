"""Progress where a person waits: ``profile`` (shape runs done of all, time left),
``fidelity``'s live run, ``report`` on a large run; plain lines on stderr when it is not a
terminal, nothing with ``--quiet``; the printed wall time is the command's, with the
simulation loop's share beside it."""

from __future__ import annotations

import io
import re
import time

from synthetic_results import write_synthetic_results

from stepplan.executor.model import sample_positions
from stepplan.planner import Planner, PlannerConfig
from stepplan.sim import cli
from stepplan.sim.cli import report as report_cmd
from stepplan.sim.cli.report_reading import read_report_run
from stepplan.sim.progress import CountLines, count_progress
from stepplan.sim.timing.profiler import GridLimits, measure, profile_batches

CONFIG = PlannerConfig(num_spec_tokens=3, graph_mode="full", max_num_seqs=16)
LIMITS = GridLimits(max_num_batched_tokens=512, num_slots=17, max_len=2048)


class Ticking:
    """A clock that moves ``step_s`` each time it is read."""

    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def test_count_lines_say_done_of_total_and_the_time_left():
    stream = io.StringIO()
    lines = CountLines(10, stream, unit="shape run", label="profile", every_s=0.0,
                       clock=Ticking(2.0))  # fmt: skip
    for _ in range(10):
        lines.advance()
    printed = stream.getvalue().splitlines()
    assert printed[0] == "stepplan: profile: 1/10 shape runs done, 2 s, about 18 s left"
    assert printed[4] == "stepplan: profile: 5/10 shape runs done, 10 s, about 10 s left"
    assert printed[-1] == "stepplan: profile: 10/10 shape runs done, 20 s"
    assert len(printed) == 10


def test_count_progress_is_lines_off_a_terminal_and_nothing_when_quiet():
    stream = io.StringIO()  # not a terminal
    assert isinstance(count_progress(5, stream, unit="step"), CountLines)
    assert count_progress(5, stream, unit="step", quiet=True) is None
    assert count_progress(5, stream, unit="step", done=5) is None


def fake_run(plan, ids, samples):
    return 1e-4 + 1e-8 * plan.num_tokens, None, 1e-5


def test_the_profile_measurement_reports_every_shape_run():
    batches = profile_batches(CONFIG, LIMITS, seed=1)
    stream = io.StringIO()
    runs = len(batches) * 3  # 2 warm-ups and 1 timed run each
    progress = CountLines(runs, stream, unit="shape run", label="profile", every_s=0.0)
    points = measure(batches, Planner(CONFIG), fake_run, sample_positions, vocab_size=50,
                     repeats=1, idle_gap_s=0.0, progress=progress)  # fmt: skip
    assert len(points) == len(batches)
    printed = stream.getvalue().splitlines()
    assert len(printed) == runs
    assert printed[-1].startswith(f"stepplan: profile: {runs:,}/{runs:,} shape runs done, ")
    assert re.fullmatch(r"stepplan: profile: 1/[\d,]+ shape runs done, \d+ s, about \d+ s left",
                        printed[0])  # fmt: skip


def test_the_report_of_a_large_run_shows_its_reading(tmp_path, capsys, monkeypatch):
    folder = write_synthetic_results(tmp_path / "run", num_steps=3000)
    monkeypatch.setattr(report_cmd, "PROGRESS_STEPS", 1000)
    assert cli.main(["report", str(folder), "--out", str(tmp_path / "r.html")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"stepplan: report: read: 3,000/3,000 steps done, \d+ s", err[-1])
    assert cli.main(["report", str(folder), "--out", str(tmp_path / "q.html"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(report_cmd, "PROGRESS_STEPS", 5000)  # a small run: no lines
    read_report_run(folder, progress=report_cmd.reading_progress(False))
    assert capsys.readouterr().err == ""


def test_simulate_prints_the_commands_wall_time_and_the_loops_share(tmp_path, capsys):
    assert cli.main(["simulate", "--limit", "50", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    found = re.search(r"\(wall ([\d.]+) s, of which the simulation loop ([\d.]+) s\)", out)
    assert found and float(found[2]) <= float(found[1])


def test_the_live_run_of_fidelity_shows_progress_lines(tmp_path, capsys):
    """``fidelity``'s live run reports its steps as a simulation does, without the
    Ctrl-C hint (the command does not keep a stopped live run)."""
    from stepplan.sim.cli.options import run_progress

    class Args:
        quiet = False

    progress = run_progress(Args(), 7, "live run", stoppable=False)
    progress.update(1, 0, 0.0)
    assert capsys.readouterr().err == "stepplan: live run: simulating 7 requests\n"
    Args.quiet = True
    assert run_progress(Args(), 7, "live run") is None


def test_the_printed_wall_time_holds_reading_as_well_as_the_loop(tmp_path, capsys, monkeypatch):
    # Reading the trace takes 0.5 s more here: the printed wall time holds it, the
    # loop's share does not.
    from stepplan.sim.cli import options

    def slow_load(args, config):
        time.sleep(0.5)
        return load_requests(args, config)

    load_requests = options.load_requests
    monkeypatch.setattr(options, "load_requests", slow_load)
    assert cli.main(["simulate", "--limit", "50", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    found = re.search(r"\(wall ([\d.]+) s, of which the simulation loop ([\d.]+) s\)", out)
    assert found and float(found[1]) >= float(found[2]) + 0.4


PROFILE_SETUP = ["--set", "model.name=tiny", "--max-num-seqs", "2"]
PROFILE_SETUP += ["--max-num-batched-tokens", "32", "--num-spec-tokens", "1"]
PROFILE_SETUP += ["--max-model-len", "256", "--repeats", "1"]


def test_profile_shows_its_shape_runs_off_a_terminal_and_nothing_when_quiet(tmp_path, capsys):
    argv = ["profile", "--out", str(tmp_path / "p.json"), *PROFILE_SETUP]
    assert cli.main(argv) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if " shape runs done" in line]
    total = re.fullmatch(r"stepplan: profile: ([\d,]+)/([\d,]+) shape runs done, \d+ s", lines[-1])
    assert total and total[1] == total[2]
    assert re.fullmatch(r"stepplan: profile: 1/[\d,]+ shape runs done, \d+ s, about \d+ s left",
                        lines[0])  # fmt: skip
    quiet = ["profile", "--out", str(tmp_path / "q.json"), "--quiet", *PROFILE_SETUP]
    assert cli.main(quiet) == 0
    assert capsys.readouterr().err == ""
