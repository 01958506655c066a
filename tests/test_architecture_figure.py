"""``bench/architecture_figure.py`` (the figure of docs/architecture.md) still runs, and
every box of its data flow is a module of the code."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import architecture_figure


def test_the_figure_draws_the_data_flow_over_real_modules(tmp_path):
    graph = architecture_figure.room_graph(architecture_figure.FOUND)
    assert {box for edge in architecture_figure.FLOW for box in edge} <= set(graph)
    assert set(architecture_figure.STAGES) <= set(graph)
    path = architecture_figure.save_figure(architecture_figure.draw(graph), tmp_path / "a.png")
    assert path.stat().st_size > 10_000
