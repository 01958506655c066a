"""``stepplan results list`` and ``stepplan results clean``: every folder stepplan wrote
is listed; clean removes only what stepplan wrote (its manifests' entries, its reports),
never a user's file, a link's target or a folder without a manifest, and nothing at all
without ``--yes``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stepplan.sim import cli
from stepplan.sim.results.outdir import MANIFEST, FolderTaken, ResultsFolder
from stepplan.sim.results.outdir_clean import clean_folder

SPEC = "synthetic:n=20,rate=10,prompt=uniform:16:64,output=uniform:2:8"


def simulate(out: Path, *extra: str) -> Path:
    assert cli.main(["simulate", SPEC, "--quiet", "--out", str(out), *extra]) == 0
    return out


def tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture
def results(tmp_path: Path) -> Path:
    parent = tmp_path / "results"
    simulate(parent / "plain")
    simulate(parent / "with-report", "--report")
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(f'traces = ["{SPEC}"]\n[grid]\nseed = [0, 1]\n')
    assert cli.main(["sweep", str(sweep), "--out", str(parent / "sweep"), "--quiet"]) == 0
    assert cli.main(["compare", SPEC, "--quiet", "--out", str(parent / "pair"),
                     "--b-host-cost", "seed"]) == 0  # fmt: skip
    mine = parent / "mine"  # the user's folder beside them: no manifest
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    return parent


def test_list_names_every_stepplan_folder_and_the_files_that_are_not_its(results, capsys):
    (results / "plain" / "notes.txt").write_text("mine")
    assert cli.main(["results", "list", str(results)]) == 0
    out = capsys.readouterr().out
    for name, kind in [("plain", "simulate"), ("with-report", "simulate"),
                       ("sweep", "sweep"), ("pair", "compare")]:  # fmt: skip
        assert any(str(results / name) in line and kind in line for line in out.splitlines())
    assert "notes.txt" in out and "report.html" in out
    assert "mine" not in out.replace("results clean", "")  # not stepplan's: not listed
    assert "4 folder(s)" in out


def test_clean_without_yes_removes_nothing(results, capsys):
    before = tree(results)
    assert cli.main(["results", "clean", str(results)]) == 0
    assert tree(results) == before
    out = capsys.readouterr().out
    assert "would remove 4 of 4 folder(s) whole" in out and "--yes removes them" in out


def test_clean_removes_what_stepplan_wrote_and_keeps_the_users_files(results, tmp_path, capsys):
    outside = tmp_path / "precious.csv"
    outside.write_text("keep me")
    (results / "plain" / "notes.txt").write_text("mine")
    (results / "plain" / "link.csv").symlink_to(outside)
    (results / "sweep" / "points" / "mine.txt").write_text("mine")
    assert cli.main(["results", "clean", str(results), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "removed 2 of 4 folder(s) whole" in out
    assert tree(results) == {
        "plain", "plain/notes.txt", "plain/link.csv",
        "sweep", "sweep/points", "sweep/points/mine.txt",
        "mine", "mine/notes.txt",
    }  # fmt: skip
    assert outside.read_text() == "keep me"
    assert not (results / "plain" / MANIFEST).exists()
    # What is left is the user's: nothing more to clean, nothing listed.
    assert cli.main(["results", "list", str(results)]) == 0
    assert "no results folders stepplan wrote" in capsys.readouterr().out


def test_a_folder_without_a_manifest_is_refused_and_one_in_use_skipped(results, capsys):
    with pytest.raises(FolderTaken):
        clean_folder(results / "mine", apply=True)
    assert (results / "mine" / "notes.txt").exists()
    with ResultsFolder.claim(results / "plain", overwrite=True, names=("summary.json",)):
        assert cli.main(["results", "clean", str(results / "plain"), "--yes"]) == 0
    assert "in use by another stepplan run" in capsys.readouterr().err
    assert (results / "plain" / "summary.json").exists()


def test_clean_older_than_picks_folders_by_their_manifests_date(results, capsys):
    manifest = results / "plain" / MANIFEST
    document = json.loads(manifest.read_text())
    document["written_at"] = "2026-01-01T00:00:00+00:00"
    manifest.write_text(json.dumps(document))
    assert cli.main(["results", "clean", str(results), "--older-than", "30", "--yes"]) == 0
    assert not (results / "plain").exists() and (results / "with-report").exists()
    assert cli.main(["results", "clean", str(results), "--older-than", "-1"]) == 2
    assert "--older-than: must be at least 0 days" in capsys.readouterr().err


def test_the_default_folder_is_results_in_the_working_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    simulate(Path("results") / "one")
    assert cli.main(["results", "clean", "--yes"]) == 0
    assert os.listdir(tmp_path / "results") == []


def test_the_readme_says_how_results_folders_are_reused_and_cleaned():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = readme.index("- **Cleaning up `results/`.**")
    section = readme[start : readme.index("\n- **", start + 1)]
    for phrase in ("--name NAME", "--overwrite", "stepplan results list",
                   "stepplan results clean", "--yes", "--older-than DAYS"):  # fmt: skip
        assert phrase in section, phrase
    # What it names is what the commands take.
    parser = cli.build_parser()
    parser.parse_args(["simulate", "--name", "mine", "--overwrite"])
    parser.parse_args(["results", "list"])
    parser.parse_args(["results", "clean", "--yes", "--older-than", "3"])
