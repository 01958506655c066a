"""What ``--out`` may touch: manifests, refusals, ``--overwrite``, default names, checks
before work, locks, interrupts, umask, byte-identical results, progress."""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import signal
import stat
import subprocess
import sys
import threading

import numpy as np
import pytest

from stepplan.sim import cli
from stepplan.sim.progress import ProgressLines, estimate_steps, live_warning
from stepplan.sim.results import outdir
from stepplan.sim.results.outdir import MANIFEST, STAGING_PREFIX, FolderTaken, ResultsFolder
from stepplan.sim.results.sim_result import read_results, write_results
from stepplan.sim.run import simulate
from stepplan.sim.settings.config import SimConfig, with_settings
from stepplan.sim.workloads import parse_synthetic

RUN = [sys.executable, "-c", "import sys; from stepplan.sim.cli import main; sys.exit(main())"]
FAST = ["--limit", "20", "--quiet"]
#: A run long enough to signal while it simulates (the whole embedded trace, ~7 s).
LONG = ["simulate", "--limit", "8819"]
RESULT_NAMES = {"steps.csv", "requests.csv", "summary.json", "measured.json"}


def stepplan(*argv, cwd=None, **options):
    return subprocess.run(
        [*RUN, *argv], cwd=cwd, capture_output=True, text=True, timeout=120, **options
    )


def one_error_line(err, *parts):
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line, err
    assert line.startswith("stepplan: error:"), err
    for part in parts:
        assert part in line, (part, line)
    return line


def manifest(folder):
    return json.loads((folder / MANIFEST).read_text())


def hidden(folder):
    return [p.name for p in folder.rglob(".*")]


# ---------------------------------------------------------------- refusals


def test_a_user_folder_is_refused_and_left_alone(tmp_path, capsys):
    notes = tmp_path / "mydocs" / "user_notes.txt"
    notes.parent.mkdir()
    notes.write_text("mine")
    assert cli.main(["simulate", *FAST, "--out", str(notes.parent)]) == 2
    one_error_line(capsys.readouterr().err, str(notes.parent), "stepplan did not write")
    assert [p.name for p in notes.parent.iterdir()] == ["user_notes.txt"]
    assert notes.read_text() == "mine"
    assert cli.main(["simulate", *FAST, "--out", str(notes.parent), "--overwrite"]) == 2
    assert notes.read_text() == "mine" and len(list(notes.parent.iterdir())) == 1


def test_an_empty_folder_is_used(tmp_path):
    assert cli.main(["simulate", *FAST, "--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} >= RESULT_NAMES
    document = manifest(tmp_path)
    assert document["kind"] == "simulate" and document["complete"] is True
    assert set(document["entries"]) >= RESULT_NAMES and MANIFEST not in document["entries"]
    assert {"program", "version", "user", "host", "pid"} <= set(document["written_by"])
    assert document["written_at"]


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("afile", "afile: is a file"),
        ("afile/sub", "afile/sub: afile is a file, not a folder"),
        ("afile/sub/deeper", "afile/sub/deeper: afile is a file, not a folder"),
    ],
)
def test_bad_out_fails_before_the_trace_is_read(tmp_path, capsys, monkeypatch, out, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("data")
    # the trace does not exist: the --out error coming first shows the check runs first
    assert cli.main(["simulate", "missing.csv", *FAST, "--out", out]) == 2
    line = one_error_line(capsys.readouterr().err, message)
    assert "missing.csv" not in line and "partial" not in line
    assert (tmp_path / "afile").read_text() == "data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_unwritable_parent_fails_naming_the_users_path(tmp_path, capsys, monkeypatch):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    if os.access(parent, os.W_OK):  # root: permissions do not bind, so say it as they would
        real = os.access
        monkeypatch.setattr(
            outdir.os, "access", lambda p, mode: False if str(p) == str(parent) else real(p, mode)
        )
    out = parent / "sub" / "run"
    assert cli.main(["simulate", "missing.csv", *FAST, "--out", str(out)]) == 2
    one_error_line(capsys.readouterr().err, f"{out}: cannot create it, {parent} is not writable")
    assert list(parent.iterdir()) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_a_folder_that_cannot_be_made_is_one_line(capsys):
    assert cli.main(["simulate", "missing.csv", *FAST, "--out", "/proc/stepplan/run"]) == 2
    one_error_line(capsys.readouterr().err, "/proc/stepplan/run: cannot create /proc/stepplan")


def test_the_working_folder_as_out_is_never_moved(tmp_path, monkeypatch, capsys):
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "keep.txt").write_text("k")
    monkeypatch.chdir(inner)
    assert cli.main(["simulate", *FAST, "--out", "../inner"]) == 2
    one_error_line(capsys.readouterr().err, "../inner")
    assert (inner / "keep.txt").read_text() == "k"
    # a stepplan folder that is the working folder: --overwrite replaces its files in place
    (inner / "keep.txt").unlink()
    assert cli.main(["simulate", *FAST, "--out", "."]) == 0
    before = os.stat(inner).st_ino
    (inner / "keep.txt").write_text("k")
    assert cli.main(["simulate", *FAST, "--out", "../inner", "--overwrite"]) == 0
    assert os.stat(inner).st_ino == before and os.getcwd() == str(inner)
    assert (inner / "keep.txt").read_text() == "k"


# ---------------------------------------------------------------- overwrite


def test_rerun_needs_overwrite_and_keeps_the_users_files(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["simulate", *FAST, "--out", str(out)]) == 0
    first = (out / "steps.csv").read_bytes()
    assert cli.main(["simulate", *FAST, "--out", str(out)]) == 2
    one_error_line(capsys.readouterr().err, str(out), "--overwrite")
    user = {"report.html": "<p>old</p>", "bucketing.png": "png", "graph_sizes.toml": "x = 1"}
    for name, text in user.items():
        (out / name).write_text(text)
    assert cli.main(["simulate", "--limit", "30", "--quiet", "--out", str(out), "--overwrite"]) == 0
    assert (out / "steps.csv").read_bytes() != first  # 30 requests now
    assert json.loads((out / "summary.json").read_text())["requests"] == 30
    for name, text in user.items():
        assert (out / name).read_text() == text
    assert not set(user) & set(manifest(out)["entries"])
    assert hidden(out) == []


def test_overwrite_removes_only_listed_files(tmp_path):
    out = tmp_path / "run"
    assert cli.main(["simulate", *FAST, "--out", str(out)]) == 0
    document = manifest(out)
    (out / "steps.parquet").write_text("an older run's table")  # listed: stepplan's
    (out / "notes.txt").write_text("not listed: the user's")
    document["entries"].append("steps.parquet")
    (out / MANIFEST).write_text(json.dumps(document))
    assert cli.main(["simulate", *FAST, "--out", str(out), "--overwrite"]) == 0
    assert not (out / "steps.parquet").exists()
    assert (out / "notes.txt").read_text() == "not listed: the user's"


def test_overwrite_refuses_a_file_stepplan_would_write_but_did_not(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["simulate", *FAST, "--out", str(out)]) == 0
    document = manifest(out)
    document["entries"].remove("measured.json")  # as if the user had made it
    (out / MANIFEST).write_text(json.dumps(document))
    mine = (out / "measured.json").read_text()
    assert cli.main(["simulate", *FAST, "--out", str(out), "--overwrite"]) == 2
    one_error_line(capsys.readouterr().err, "measured.json was not written by stepplan")
    assert (out / "measured.json").read_text() == mine


@pytest.mark.parametrize(
    "document",
    [
        "not json",
        json.dumps({"kind": "simulate", "entries": ["../elsewhere"]}),
        json.dumps({"kind": "simulate", "entries": ["/etc/passwd"]}),
        json.dumps({"kind": "other", "entries": []}),
    ],
)
def test_a_bad_manifest_is_not_trusted(tmp_path, capsys, document):
    (tmp_path / "elsewhere").write_text("keep")
    out = tmp_path / "run"
    out.mkdir()
    (out / MANIFEST).write_text(document)
    assert cli.main(["simulate", *FAST, "--out", str(out), "--overwrite"]) == 2
    one_error_line(capsys.readouterr().err, MANIFEST)
    assert (tmp_path / "elsewhere").read_text() == "keep"


def test_a_stale_staging_folder_is_cleaned(tmp_path):
    stale = tmp_path / "run" / f"{STAGING_PREFIX}killed"
    stale.mkdir(parents=True)
    (stale / "steps.csv").write_text("half")
    assert cli.main(["simulate", *FAST, "--out", str(tmp_path / "run")]) == 0
    assert hidden(tmp_path / "run") == []


def test_compare_folder_is_stepplans(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", *FAST, "--out", str(out), "--b-host-cost", "seed"]
    assert cli.main(argv) == 0
    entries = ["a", "b", "compare.csv", "compare.json"]
    assert manifest(out)["kind"] == "compare" and manifest(out)["entries"] == entries
    assert manifest(out / "a")["kind"] == "simulate"
    assert cli.main(argv) == 2
    one_error_line(capsys.readouterr().err, str(out), "--overwrite")
    (out / "report.html").write_text("mine")
    assert cli.main([*argv, "--overwrite"]) == 0
    assert (out / "report.html").read_text() == "mine"
    # a compare folder is not a simulate folder, and the other way round
    assert cli.main(["simulate", *FAST, "--out", str(out), "--overwrite"]) == 2
    one_error_line(capsys.readouterr().err, "compare run")


# ---------------------------------------------------------------- default names


def test_default_names_never_collide(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    runs = [
        ["simulate", "--limit", "10"],  # the quick start, twice
        ["simulate", "--limit", "10"],
        ["simulate", "--limit", "12"],  # other settings
        ["simulate", "synthetic:n=10,rate=5", "--limit", "10"],
        ["simulate", "synthetic:n=12,rate=5", "--limit", "10"],
        ["simulate", "--limit", "10", "--name", "tiny"],
        ["simulate", "--limit", "10", "--name", "tiny"],
        ["compare", "--limit", "10"],
        ["compare", "--limit", "10"],
    ]
    printed = []
    for argv in runs:
        assert cli.main([*argv, "--quiet"]) == 0
        out = capsys.readouterr().out.strip()
        assert out.startswith("results: results/"), out
        printed.append(out.split()[1].split("/")[1])
    folders = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert len(set(printed)) == len(runs) and sorted(printed) == folders
    quick, again, other = printed[:3]
    assert quick.startswith("azure_llm_2023_code-") and again == f"{quick}-2"
    assert other != quick and printed[3].startswith("synthetic-")
    assert printed[5:7] == ["tiny", "tiny-2"] and printed[7].startswith("compare-")


def test_default_name_with_overwrite_reuses_the_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert cli.main(["simulate", "--limit", "10", "--quiet", "--overwrite"]) == 0
    assert len(list((tmp_path / "results").iterdir())) == 1


# ---------------------------------------------------------------- locks


def test_a_folder_held_by_another_run_is_in_use(tmp_path, capsys):
    out = tmp_path / "run"
    with ResultsFolder.claim(out):
        assert cli.main(["simulate", *FAST, "--out", str(out)]) == 2
        one_error_line(capsys.readouterr().err, str(out), "in use by another stepplan run")
    assert list(out.iterdir()) == []  # the claim wrote nothing; the empty folder is fine
    assert cli.main(["simulate", *FAST, "--out", str(out)]) == 0


def test_concurrent_runs_on_one_folder_one_wins(tmp_path):
    out = tmp_path / "run"
    first = subprocess.Popen(
        [*RUN, "simulate", "--limit", "2000", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "simulating" in first.stderr.readline()  # it holds the folder now
        first.send_signal(signal.SIGSTOP)  # and keeps holding it while the second tries
        second = stepplan("simulate", *FAST, "--out", str(out))
        first.send_signal(signal.SIGCONT)
        assert second.returncode == 2
        one_error_line(second.stderr, str(out), "in use by another stepplan run")
        assert first.wait(timeout=120) == 0
    finally:
        first.kill()
        first.communicate()
    assert json.loads((out / "summary.json").read_text())["requests"] == 2000
    assert hidden(out) == []


def test_the_lock_is_on_the_folder_and_released(tmp_path):
    out = tmp_path / "run"
    folder = ResultsFolder.claim(out)
    fd = os.open(out, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        folder.release()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- interrupts


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_keeps_a_partial_result(tmp_path, signum, code):
    out = tmp_path / "run"
    run = subprocess.Popen(
        [*RUN, *LONG, "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert "simulating" in run.stderr.readline()
        threading.Event().wait(0.1)  # some steps in: the whole run takes about 0.6 s here
        run.send_signal(signum)
        _, err = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == code
    lines = [line for line in err.splitlines() if "simulating" not in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    name = signal.Signals(signum).name
    assert lines[0].startswith(f"stepplan: interrupted by {name}") and str(out) in lines[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and manifest(out)["complete"] is False
    assert summary["finished_requests"] < summary["requests"] == 8819
    with (out / "requests.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 8819 and rows[-1]["finish_s"] == "" and rows[-1]["ttft_s"] == ""
    finished = sum(row["finish_s"] != "" for row in rows)
    assert finished == summary["finished_requests"]
    assert hidden(out) == [] and not list(tmp_path.glob(".*"))


def test_a_stopped_run_summarises_what_finished(tmp_path):
    config = with_settings(SimConfig(), {"scheduler.num_spec_tokens": 2})
    table = parse_synthetic("synthetic:n=80,rate=40,prompt=uniform:16:200,output=uniform:2:40")
    stop = threading.Event()

    class StopAt:
        def update(self, steps, finished, clock_s):
            if steps == 40:
                stop.set()

        def close(self):
            pass

    result = simulate(table, config, progress=StopAt(), stop=stop)
    whole = simulate(table, config)
    assert whole.summary["complete"] is True and result.summary["complete"] is False
    assert result.steps["step"].size == 40
    done = ~np.isnan(result.requests["finish_s"])
    assert result.summary["finished_requests"] == int(done.sum()) < 80
    output = result.requests["output_tokens"][done].sum()
    duration = result.summary["duration_s"]
    assert result.summary["throughput"]["output_tokens_per_s"] == pytest.approx(output / duration)
    # the steps so far are the whole run's first steps
    np.testing.assert_array_equal(result.steps["num_tokens"], whole.steps["num_tokens"][:40])
    back = read_results(write_results(result, tmp_path / "run"))
    assert back.summary["complete"] is False and np.isnan(back.requests["finish_s"]).any()


def test_interrupted_before_any_step_writes_nothing(tmp_path, capsys, monkeypatch):
    from stepplan.sim.cli import options

    def interrupted_load(args, config):
        os.kill(os.getpid(), signal.SIGTERM)  # while the trace loads: stop at once
        raise AssertionError("the signal should have stopped the command")

    monkeypatch.setattr(options, "load_requests", interrupted_load)
    assert cli.main(["simulate", *FAST, "--out", str(tmp_path / "run")]) == 143
    err = capsys.readouterr().err.strip()
    assert err.startswith("stepplan: interrupted by SIGTERM") and "\n" not in err
    assert not (tmp_path / "run").exists()  # the folder it had made is gone again


# ---------------------------------------------------------------- files


def test_results_take_the_users_umask(tmp_path):
    out = tmp_path / "run"
    result = stepplan("simulate", *FAST, "--out", str(out), preexec_fn=lambda: os.umask(0o027))
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o750
    for path in out.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o640, path.name


def test_equal_commands_give_byte_identical_results(tmp_path):
    argv = ["simulate", "--limit", "40", "--out", "run", "--quiet"]
    folders = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        result = stepplan(*argv, cwd=tmp_path / name)
        assert result.returncode == 0, result.stderr
        folders.append(tmp_path / name / "run")
    for name in ("steps.csv", "requests.csv", "summary.json"):
        assert (folders[0] / name).read_bytes() == (folders[1] / name).read_bytes(), name
    assert "plan_us" not in (folders[0] / "steps.csv").read_text().splitlines()[0]
    summary = json.loads((folders[0] / "summary.json").read_text())
    assert "host" not in summary and "run" not in summary
    measured = json.loads((folders[0] / "measured.json").read_text())
    assert set(measured) == {"host", "run"} and measured["run"]["wall_s"] > 0


def test_readers_join_the_measured_files(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["simulate", "--limit", "20", "--out", str(out)]) == 0
    assert "plan us p50 (measured)" in capsys.readouterr().out
    back = read_results(out)
    assert (back.steps.column("plan_us") > 0).all()
    assert back.summary["measured"]["host"]["plan_us_p50"] > 0
    from stepplan.sim.results.summary import summary_rows

    rows = dict(summary_rows(back.summary))
    assert rows["plan us p50 (measured)"] != "-"


# ---------------------------------------------------------------- progress


def test_progress_lines_come_every_few_seconds():
    now = [100.0]
    stream = io.StringIO()
    lines = ProgressLines(1000, stream, every_s=5.0, clock=lambda: now[0])
    for step in range(30):
        lines.update(step * 10, step, step * 0.5)
        now[0] += 1.0
    lines.close()
    printed = stream.getvalue().splitlines()
    assert printed[0].startswith("stepplan: simulating 1,000 requests")
    assert len(printed) == 1 + 5  # at 5, 10, 15, 20, 25 s
    assert printed[1] == (
        "stepplan: 50 steps, 5/1,000 requests finished, simulated 2.5 s, elapsed 5 s"
    )


def test_progress_goes_to_stderr_off_a_terminal_and_quiet_silences_it(tmp_path, capsys):
    assert cli.main(["simulate", "--limit", "20", "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "stepplan: simulating 20 requests" in err
    assert cli.main(["simulate", *FAST, "--out", str(tmp_path / "b")]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_a_long_live_run_is_announced_with_an_estimate(tmp_path, capsys, monkeypatch):
    config = with_settings(SimConfig(), {"live.enabled": True})
    big = parse_synthetic("synthetic:n=20000,rate=10,prompt=fixed:500,output=fixed:200")
    small = parse_synthetic("synthetic:n=5,rate=10,prompt=fixed:16,output=fixed:4")
    steps = estimate_steps(big, config)
    assert steps >= 200 and steps > estimate_steps(small, config)
    warning = live_warning(big, config)
    assert warning is not None and "an estimate" in warning and f"{steps:,} steps" in warning
    assert live_warning(small, config) is None
    assert live_warning(big, SimConfig()) is None  # not live
    from stepplan.sim import progress

    monkeypatch.setattr(progress, "LIVE_WARN_S", 0.0)
    argv = ["simulate", "synthetic:n=4,rate=10,prompt=fixed:8,output=fixed:3", "--live"]
    argv += ["--set", "model.name=tiny"]  # the default preset is 8B parameters
    assert cli.main([*argv, "--out", str(tmp_path / "live")]) == 0
    assert "(an estimate)" in capsys.readouterr().err


def test_folder_errors_are_user_errors():
    assert issubclass(FolderTaken, outdir.OutDirError)
    assert outdir.OutDirError in cli.USER_ERRORS
