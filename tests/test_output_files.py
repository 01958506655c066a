"""The one rule for every single file stepplan writes (``sim/results/outfile.py``): what it writes,
what it replaces (with ``--overwrite``, only its own), and what a write that fails or is
overtaken leaves: nothing but what was there."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from synthetic_results import write_synthetic_results

from stepplan.plots.canvas import FORMATS, figure_bytes, is_figure, new_figure
from stepplan.plots.report import is_report
from stepplan.sim import cli
from stepplan.sim.results.outfile import FileKind, OutputError, OutputFile
from stepplan.sim.timing.engine_profile import PROFILE_FILE

ANY = FileKind("a test file", lambda sample: sample.startswith(b"ours"))


def leftovers(folder):
    return [p.name for p in folder.iterdir() if "partial" in p.name]


def test_each_command_writes_then_replaces_only_its_own_with_overwrite(tmp_path, capsys):
    run = write_synthetic_results(tmp_path / "run")
    commands = {
        "r.html": ["report", str(run), "--out", str(tmp_path / "r.html")],
        "s.toml": ["buckets", str(run), "--write", str(tmp_path / "s.toml")],
        "f.svg": ["buckets", str(run), "--figure", str(tmp_path / "f.svg")],
        "f.pdf": ["buckets", str(run), "--figure", str(tmp_path / "f.pdf")],
    }
    for name, argv in commands.items():
        assert cli.main(argv) == 0, name
        first = (tmp_path / name).read_bytes()
        assert cli.main(argv) == 2, name  # a second time: needs --overwrite
        assert "--overwrite replaces it" in capsys.readouterr().err
        (tmp_path / name).write_bytes(first + b"\n")  # still stepplan's (its mark)
        assert cli.main([*argv, "--overwrite"]) == 0, name
        assert (tmp_path / name).read_bytes() == first
    assert is_report((tmp_path / "r.html").read_bytes())
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("fmt", sorted(FORMATS.values()))
def test_figures_carry_a_mark_a_users_figure_lacks(fmt):
    figure = new_figure(2, 2)
    figure.subplots().plot([1, 2], [3, 4])
    ours = figure_bytes(figure, fmt)
    assert is_figure(ours[:65536] + ours[-65536:])
    theirs = ours.replace(b"stepplan", b"someone!")
    assert not is_figure(theirs)


def test_simulate_report_is_checked_before_the_run_and_replaced_with_overwrite(tmp_path):
    out, page = tmp_path / "run", tmp_path / "page.html"
    argv = ["simulate", "--limit", "20", "--quiet", "--out", str(out), "--report", str(page)]
    assert cli.main(argv) == 0 and is_report(page.read_bytes())
    assert cli.main(argv) == 2  # the folder and the page: both need --overwrite
    assert cli.main([*argv, "--overwrite"]) == 0
    page.write_text("<!DOCTYPE html><p>mine now</p>")
    assert cli.main([*argv, "--overwrite"]) == 2
    assert page.read_text() == "<!DOCTYPE html><p>mine now</p>"


def test_a_file_that_appears_or_changes_while_stepplan_works_is_left_alone(tmp_path):
    path = tmp_path / "out.txt"
    claimed = OutputFile.claim(path, ANY)
    path.write_bytes(b"theirs, written meanwhile")
    with pytest.raises(OutputError, match=r"out.txt: .* while stepplan worked; left as it is"):
        claimed.write(b"ours")
    assert path.read_bytes() == b"theirs, written meanwhile"
    path.write_bytes(b"ours, earlier")
    claimed = OutputFile.claim(path, ANY, overwrite=True)
    path.write_bytes(b"theirs now, the same length")
    with pytest.raises(OutputError, match="changed while stepplan worked"):
        claimed.write(b"ours again")
    assert path.read_bytes() == b"theirs now, the same length"
    assert leftovers(tmp_path) == []


def test_missing_folders_are_made_and_the_mode_is_the_users(tmp_path):
    path = tmp_path / "a" / "b" / "x.txt"
    script = (
        "from pathlib import Path; from tests_kind import KIND; "
        "from stepplan.sim.results.outfile import OutputFile; "
        f"OutputFile.claim({str(path)!r}, KIND).write(b'ours')"
    )
    (tmp_path / "tests_kind.py").write_text(
        "from stepplan.sim.results.outfile import FileKind\nKIND = FileKind('a file', bool)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.umask(0o027),
    )
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.read_bytes() == b"ours"


def test_an_engine_profile_is_recognised_by_its_first_key(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": "stepplan-engine-profile", "points": []}, indent=1))
    assert PROFILE_FILE.recognise(path.read_bytes())
    path.write_text(json.dumps({"points": [], "format": "stepplan-engine-profile"}, indent=1))
    assert not PROFILE_FILE.recognise(path.read_bytes())
