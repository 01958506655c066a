"""The HTML report: self-contained, every figure embedded, every number of summary.json."""

from __future__ import annotations

import base64
import html
import json
import re

import pytest
from synthetic_results import write_synthetic_results

from stepplan.plots.report import ReportTable, build_report, format_value
from stepplan.sim.cli import main
from stepplan.sim.results.sim_result import read_results
from stepplan.sim.results.table import ResultsError

FIGURE_IDS = (
    "fig-latency-cdfs",
    "fig-step-composition-over-the-run",
    "fig-kv-cache-and-queue",
    "fig-host-time-per-step",
    "fig-step-sizes-and-cuda-graph-buckets",
    "fig-step-composition-first-steps-detail",
    "fig-op-graph-of-one-plan",
)
WORKLOAD = "synthetic:n=50,rate=20,prompt=uniform:16:600,output=uniform:2:60"


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """``stepplan simulate --report`` on a small workload: the folder it wrote."""
    out = tmp_path_factory.mktemp("sim") / "run"
    args = ["simulate", WORKLOAD, "--out", str(out), "--quiet", "--num-groups", "2"]
    assert main([*args, "--report"]) == 0
    return out


def numbers(value, path=""):
    """Every number in a JSON document, with its dotted path."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from numbers(inner, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from numbers(inner, f"{path}[{index}]")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield path, value


def embedded_pngs(page):
    return {
        figure_id: base64.b64decode(data)
        for figure_id, data in re.findall(
            r"<figure id='([^']+)'><img alt='[^']*' src='data:image/png;base64,([^']+)'>", page
        )
    }


def test_simulate_report_embeds_every_figure(simulated):
    page = (simulated / "report.html").read_text()
    images = embedded_pngs(page)
    assert set(images) == set(FIGURE_IDS)
    for figure_id, png in images.items():
        assert png.startswith(b"\x89PNG") and len(png) > 5000, figure_id
    assert "http://" not in page and "https://" not in page  # nothing fetched from outside


def test_report_holds_every_number_of_the_summary(simulated):
    page = html.unescape((simulated / "report.html").read_text())
    cells = set(re.findall(r"<td>([^<]*)</td>", page))
    summary = json.loads((simulated / "summary.json").read_text())
    missing = [path for path, value in numbers(summary) if format_value(value) not in cells]
    assert not missing
    assert f"<td>{summary['requests']}</td>" in page


def test_report_has_the_bucket_comparison(simulated):
    page = (simulated / "report.html").read_text()
    assert "CUDA-graph sizes: default lists vs optimal" in page
    assert "vLLM default (" in page and "SGLang default (" in page


def test_report_command_with_a_second_run(simulated, tmp_path, capsys):
    other = write_synthetic_results(tmp_path / "other")
    out = tmp_path / "page.html"
    args = ["report", str(simulated), "--out", str(out), "--compare", str(other)]
    assert main([*args, "--max-graphs", "6"]) == 0
    assert f"report: {out}" in capsys.readouterr().out
    page = out.read_text()
    assert set(embedded_pngs(page)) == set(FIGURE_IDS)
    assert "vLLM default (6)" in page
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "not a results folder" in capsys.readouterr().err


def test_extra_tables_and_their_errors(tmp_path):
    results = read_results(write_synthetic_results(tmp_path / "run", num_steps=30))
    table = ReportTable("Extra", ("name", "value"), [("alpha", 1.5)])
    page = build_report(results, figures={}, tables=[table])
    assert "<h2>Extra</h2>" in page and "<td>alpha</td><td>1.5</td>" in page
    with pytest.raises(ResultsError, match="row 0: 1 cells, header has 2"):
        ReportTable("Bad", ("a", "b"), [("only",)])
