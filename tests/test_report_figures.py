"""What the report's figures say about themselves: the latency CDFs carry the run's SLOs
as lines at their values, with the runs' legend off the panels; the op-graph figure
names the step it shows, and that step is the run's richest."""

from __future__ import annotations

import csv
import html
import re

import numpy as np
from matplotlib.lines import Line2D

from stepplan.plots.latency import plot_latency_cdfs
from stepplan.sim.cli import main
from stepplan.sim.results.schema import KIND_ROWS
from stepplan.sim.results.sim_result import read_results

WORKLOAD = "synthetic:n=60,rate=30,prompt=uniform:16:900,output=uniform:2:60"


def simulate(folder, *flags):
    argv = ["simulate", WORKLOAD, "--out", str(folder), "--quiet", *flags]
    assert main(argv) == 0
    return folder


def vertical_lines_at(axes) -> list[float]:
    return [
        float(line.get_xdata()[0])
        for line in axes.get_lines()
        if isinstance(line, Line2D) and len(set(line.get_xdata())) == 1
        and line.get_linestyle() == "--"
    ]  # fmt: skip


def test_the_latency_cdfs_draw_each_slo_at_its_value(tmp_path):
    run = read_results(simulate(tmp_path / "run"))
    figure = plot_latency_cdfs([run], slo_ms={"TTFT": 250.0, "TPOT": 12.5})
    ttft, tpot, itl = figure.axes[:3]
    assert vertical_lines_at(ttft) == [250.0]
    assert vertical_lines_at(tpot) == [12.5]
    assert vertical_lines_at(itl) == []  # no SLO on ITL
    assert "SLOs" in figure.get_suptitle()
    # The runs' legend belongs to the figure, below the panels, not inside one of them.
    assert all(axes.get_legend() is None for axes in figure.axes)
    assert len(figure.legends) == 1
    plain = plot_latency_cdfs([run])
    assert all(vertical_lines_at(axes) == [] for axes in plain.axes[:3])


def test_the_op_graph_names_the_runs_richest_step(tmp_path):
    folder = simulate(tmp_path / "run", "--report")
    page = html.unescape((folder / "report.html").read_text())
    named = re.search(r"<h2>Op graph of one plan: step ([\d,]+), the run's richest", page)
    assert named, "the op graph's heading names no step"
    with (folder / "steps.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    kinds = np.array([sum(int(row[c]) > 0 for c in KIND_ROWS.values()) for row in rows])
    num_rows = np.array([int(row["num_rows"]) for row in rows])
    # Most kinds of rows, then most rows; the earliest such step.
    best = max(range(len(rows)), key=lambda i: (kinds[i], num_rows[i], -i))
    assert int(named[1].replace(",", "")) == int(rows[best]["step"])
