"""``stepplan report`` of a sweep folder: the headline names what differs across the
points (the swept settings) and how many meet each SLO; every point has its row."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from stepplan.sim import cli

SWEEP_FILE = """
traces = ["synthetic:n=40,rate=10,prompt=uniform:64:512,output=uniform:4:48"]
[grid]
scheduler.num_spec_tokens = [1, 3]
workload.rate_scale = [1, 3]
[slos]
tight = { ttft_p99_ms = 60, tpot_p99_ms = 3 }
loose = { ttft_p99_ms = 1000, tpot_p99_ms = 50 }
"""


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sweep")
    (folder / "sweep.toml").write_text(SWEEP_FILE)
    argv = ["sweep", str(folder / "sweep.toml"), "--out", str(folder / "out"), "--quiet"]
    assert cli.main([*argv, "--workers", "1"]) == 0
    assert cli.main(["report", str(folder / "out")]) == 0
    return folder / "out"


def verdict_text(page: str) -> str:
    block = page[page.index("<section id='verdict'") : page.index("</section>")]
    return html.unescape(re.sub(r"<[^>]+>", " ", block))


def test_the_headline_names_the_swept_settings_and_the_points_meeting_each_slo(swept):
    page = (swept / "report.html").read_text()
    headline = re.search(r"<p class='headline'>([^<]*)</p>", page).group(1)
    assert headline.startswith(
        "Sweep over scheduler.num_spec_tokens, workload.rate_scale (4 points): "
    )
    table = (swept / "sweep.csv").read_text().splitlines()
    header = table[0].split(",")
    rows = [dict(zip(header, line.split(","), strict=True)) for line in table[1:]]
    for name, ttft, tpot in (("tight", 60, 3), ("loose", 1000, 50)):
        met = [
            row["point"]
            for row in rows
            if float(row["ttft_p99_ms"]) <= ttft and float(row["tpot_p99_ms"]) <= tpot
        ]
        assert f"{len(met)} of 4 meet {name}" in headline
        text = verdict_text(page)
        assert f"{name}: ttft_p99_ms <= {ttft}, tpot_p99_ms <= {tpot}" in text
        if met:
            assert f"met by points {', '.join(met)}" in text
    assert "scheduler.num_spec_tokens: 1, 3; workload.rate_scale: 1, 3" in verdict_text(page)


def test_the_best_points_and_every_row_are_on_the_page(swept):
    page = (swept / "report.html").read_text()
    document = json.loads((swept / "sweep.json").read_text())
    text = verdict_text(page)
    for entry in document["best"]:
        expected = "no point meets it" if entry["point"] is None else f"point {entry['point']} ("
        assert f"best for {entry['slo']}" in text and expected in text
    assert "<h2>The 4 points</h2>" in page and page.count("<img") == 1


def test_a_sweep_folder_without_its_document_is_one_line(swept, tmp_path, capsys):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "sweep.csv").write_bytes((swept / "sweep.csv").read_bytes())
    (folder / "sweep.json").write_text('{"settings": []}')
    assert cli.main(["report", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"stepplan: error: {folder / 'sweep.json'}: expected") and "\n" not in err
    assert not (folder / "report.html").exists()


def test_sweep_with_report_writes_its_page_into_its_folder(swept, tmp_path, capsys):
    (tmp_path / "sweep.toml").write_text(SWEEP_FILE)
    argv = ["sweep", str(tmp_path / "sweep.toml"), "--out", str(tmp_path / "out")]
    argv += ["--workers", "1", "--report"]
    assert cli.main(argv) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    printed = capsys.readouterr()
    assert f"report: {tmp_path / 'out' / 'report.html'}" in printed.out
    # Off a terminal the points' progress is plain lines on stderr.
    assert "stepplan: sweep: 4 points, 4 to run on this process" in printed.err
    assert re.search(r"^stepplan: sweep: 4/4 points done, \d+ s$", printed.err, re.MULTILINE)
    headline = re.search(r"<p class='headline'>([^<]*)</p>", page).group(1)
    assert headline == re.search(r"<p class='headline'>([^<]*)</p>", (swept / "report.html")
                                 .read_text()).group(1)  # fmt: skip
    assert "scheduler.num_spec_tokens: 1, 3; workload.rate_scale: 1, 3" in verdict_text(page)
    # The same command again (every point done) replaces the folder's own report.
    (tmp_path / "out" / "report.html").write_text(page.replace("<h2>", "<h2>old "))
    assert cli.main([*argv, "--quiet"]) == 0
    assert (tmp_path / "out" / "report.html").read_text() == page
    assert capsys.readouterr().err == ""  # --quiet: no progress


def test_sweep_refuses_to_write_its_report_over_a_users_file(tmp_path, capsys):
    (tmp_path / "sweep.toml").write_text(SWEEP_FILE)
    mine = tmp_path / "mine.html"
    mine.write_text("<p>my notes</p>")
    argv = ["sweep", str(tmp_path / "sweep.toml"), "--out", str(tmp_path / "out")]
    assert cli.main([*argv, "--workers", "1", "--quiet", "--report", str(mine)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("stepplan: error: ") and str(mine) in err and "\n" not in err
    assert mine.read_text() == "<p>my notes</p>"
    assert not (tmp_path / "out" / "sweep.csv").exists()  # refused before any point ran
