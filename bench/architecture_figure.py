"""The figure of ``docs/architecture.md``: stepplan's modules, their imports and the data flow.

Drawn from the import graph ``tests/test_architecture.py`` checks (``import_graph.py``,
an AST walk of the source), so the figure shows the code as it is. One column per
package, each sub-package one box (``cli/``, ``timing/``, ``kernels/``, ...); within a column an
importing module sits above what it imports on import (topological generations). Grey
arrows are imports within a package, black ones across packages, dashed ones imports
inside a function (they run only when it does); orange arrows are the data flow of one
step, numbered as the doc lists it.

    python bench/architecture_figure.py [--out docs/figures/architecture.png]

A few seconds on a 2-core machine; run it from the repository root after moving modules.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import networkx as nx
from import_graph import PACKAGES, all_imports, modules, package_of
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from stepplan.plots.canvas import new_figure
from stepplan.sim.cli.outputs import claim_figure
from stepplan.sim.cli.outputs import save_figure as save_claimed

FIGURE = Path("docs/figures/architecture.png")
#: Left to right; the simulator between what it reads (plans) and what reads it (plots).
COLUMNS = ("plots", "sim", "planner", "executor")
WIDTH = 3  # boxes per row of a column
BOX_W, BOX_H = 0.9, 0.42  # a box, in units of the grid (one box a unit apart)
COLOURS = {"planner": "#DDE8F5", "executor": "#F5DDDD", "sim": "#E0F0E0", "plots": "#F5ECD8"}
RULES = {
    "planner": "imports nothing of stepplan",
    "executor": "imports the planner",
    "sim": "the planner; the executor in live mode; plots from cli/",
    "plots": "sim's result types only",
}
FLOW_COLOUR = "#E07B00"
#: The data flow of one step: ``(from, to)`` boxes, and each stage's number on its box.
FLOW = (
    ("sim.traces", "sim.scheduler"),
    ("sim.scheduler", "planner.batch"),
    ("planner.batch", "planner.planner"),
    ("planner.planner", "planner.plan"),
    ("planner.plan", "executor.runtime"),
    ("planner.plan", "sim.timing"),
    ("executor.runtime", "sim.results"),
    ("sim.timing", "sim.results"),
    ("sim.results", "plots.report"),
)
STAGES = {
    "sim.traces": 1,
    "sim.scheduler": 2,
    "planner.batch": 3,
    "planner.planner": 4,
    "planner.plan": 5,
    "executor.runtime": 6,
    "sim.timing": 6,
    "sim.results": 7,
    "plots.report": 8,
}


def room(module: str) -> str:
    """The box a module is drawn in: ``sim.cli`` for ``stepplan.sim.cli.options``."""
    return ".".join(module.split(".")[1:3])


def room_graph(found: dict[str, Path]) -> nx.DiGraph:
    """Box -> box import edges (``local``: only inside functions), typing-only left out;
    a box's own package ``__init__`` (``sim``) is a box too."""
    graph = nx.DiGraph()
    graph.add_nodes_from(room(name) for name in found)
    for item in all_imports(found):
        if item.target not in found or item.typing_only:
            continue
        source, target = room(item.source), room(item.target)
        if source == target or source.startswith(f"{target}."):
            continue
        local = item.local and graph.get_edge_data(source, target, {"local": True})["local"]
        graph.add_edge(source, target, local=local)
    missing = ({box for edge in FLOW for box in edge} | set(STAGES)) - set(graph)
    if missing:
        raise SystemExit(f"the data flow names boxes the code no longer has: {sorted(missing)}")
    return graph


def positions(graph: nx.DiGraph) -> dict[str, tuple[float, float]]:
    """Columns by package; rows by topological generation (of the boxes' strongly
    connected components), ``WIDTH`` boxes a row."""
    place = {}
    for column, package in enumerate(COLUMNS):
        boxes = graph.subgraph(n for n in graph if n.split(".")[0] == package)
        # Imports that run on import only. Modules have no cycle (the test's rule), but
        # sub-packages may import each other both ways: such boxes share a generation.
        eager = nx.DiGraph([(u, v) for u, v, local in boxes.edges(data="local") if not local])
        eager.add_nodes_from(boxes)
        joined = nx.condensation(eager)
        generations = [
            [box for part in generation for box in joined.nodes[part]["members"]]
            for generation in nx.topological_generations(joined)
        ]
        row = 0
        for generation in generations:
            ordered = sorted(generation)
            for start in range(0, len(ordered), WIDTH):
                chunk = ordered[start : start + WIDTH]
                for index, box in enumerate(chunk):
                    offset = (WIDTH - len(chunk)) / 2  # a short row is centred
                    place[box] = (column * (WIDTH + 0.6) + index + offset, -row)
                row += 1
    return place


def _label(box: str) -> str:
    name = box.partition(".")[2] or "__init__"
    if f"stepplan.{box}" in SUBPACKAGES:
        name += "/"
    stage = STAGES.get(box)
    return f"{name}  {chr(0x245F + stage)}" if stage else name


def _columns(axes: Axes, place: dict[str, tuple[float, float]]) -> None:
    """Each package's background, its name and its import rule."""
    for column, package in enumerate(COLUMNS):
        ys = [y for box, (_, y) in place.items() if box.split(".")[0] == package]
        left, bottom, top = column * (WIDTH + 0.6) - 0.55, min(ys) - 0.5, max(ys) + 1.1
        frame = FancyBboxPatch(
            (left, bottom),
            WIDTH + 0.1,
            top - bottom,
            boxstyle="round,pad=0.02,rounding_size=0.15",
            facecolor=COLOURS[package],
            edgecolor="none",
            alpha=0.45,
            zorder=0,
        )
        axes.add_patch(frame)
        axes.text(left + 0.1, top - 0.35, f"stepplan.{package}", fontsize=10, weight="bold")
        axes.text(left + 0.1, top - 0.62, RULES[package], fontsize=7, color="#444444")


def draw(graph: nx.DiGraph) -> Figure:
    """The figure, on an Agg canvas."""
    place = positions(graph)
    rows = 1 + max(-y for _, y in place.values())
    figure = new_figure(14.0, 1.4 + 0.6 * rows)
    axes = figure.subplots()
    _columns(axes, place)
    boxes = {box: _box(axes, box, xy) for box, xy in place.items()}
    for source, target, local in graph.edges(data="local"):
        if source.split(".")[0] == target.split(".")[0]:
            style = {"color": "#BBBBBB", "linewidth": 0.6, "connectionstyle": "arc3,rad=0.0"}
        else:
            style = {"color": "#333333", "linewidth": 0.9, "connectionstyle": "arc3,rad=0.06"}
        style["linestyle"] = "dashed" if local else "solid"
        _arrow(axes, boxes[source], boxes[target], zorder=2, **style)
    for source, target in FLOW:
        _arrow(
            axes,
            boxes[source],
            boxes[target],
            color=FLOW_COLOUR,
            linewidth=2.6,
            alpha=0.85,
            mutation_scale=16,
            connectionstyle="arc3,rad=-0.15",
            zorder=3,
        )
    _legend(axes)
    axes.set_xlim(-0.7, len(COLUMNS) * (WIDTH + 0.6) - 0.5)
    axes.set_ylim(-rows + 0.2, 1.4)
    axes.set_axis_off()
    return figure


def _box(axes: Axes, box: str, xy: tuple[float, float]) -> FancyBboxPatch:
    """One module's box with its name (and its data-flow stage), returned for arrows."""
    x, y = xy
    patch = FancyBboxPatch(
        (x - BOX_W / 2, y - BOX_H / 2),
        BOX_W,
        BOX_H,
        boxstyle="round,pad=0,rounding_size=0.08",
        facecolor="white",
        edgecolor=FLOW_COLOUR if box in STAGES else "#777777",
        linewidth=1.4 if box in STAGES else 0.8,
        zorder=4,
    )
    axes.add_patch(patch)
    axes.text(x, y, _label(box), ha="center", va="center", fontsize=7.5, zorder=5)
    return patch


def _arrow(axes: Axes, source: FancyBboxPatch, target: FancyBboxPatch, **style: object) -> None:
    """An arrow from box to box, clipped at both outlines."""
    start, end = (_centre(source), _centre(target))
    scale = style.pop("mutation_scale", 8)
    arrow = FancyArrowPatch(
        start, end, patchA=source, patchB=target, arrowstyle="-|>", mutation_scale=scale, **style
    )
    axes.add_patch(arrow)


def _centre(patch: FancyBboxPatch) -> tuple[float, float]:
    return patch.get_x() + patch.get_width() / 2, patch.get_y() + patch.get_height() / 2


def _legend(axes: Axes) -> None:
    axes.plot([], [], color="#B8B8B8", label="imports, within a package")
    axes.plot([], [], color="#333333", label="imports, across packages")
    axes.plot([], [], color="#333333", linestyle="dashed", label="dashed: inside a function only")
    axes.plot([], [], color=FLOW_COLOUR, linewidth=3, label="one step's data (① to ⑧)")
    axes.legend(loc="lower right", fontsize=7.5, frameon=False, ncols=2)


FOUND = modules()
SUBPACKAGES = {name for name, path in FOUND.items() if path.name == "__init__.py"} - {
    f"stepplan.{package}" for package in PACKAGES
}


def save_figure(figure: Figure, path: Path) -> Path:
    """Write the figure to ``path``, replacing only a figure stepplan drew there."""
    return save_claimed(figure, claim_figure(path, overwrite=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIGURE, help="where the figure goes")
    args = parser.parse_args()
    graph = room_graph(FOUND)
    save_figure(draw(graph), args.out)
    across = sum(package_of(f"stepplan.{u}") != package_of(f"stepplan.{v}") for u, v in graph.edges)
    print(f"{args.out}: {len(graph)} boxes, {graph.number_of_edges()} imports ({across} across)")


if __name__ == "__main__":
    main()
