"""A sweep's trade-off over its points, and a capacity search's curve.

Both read a table of ``sim/results/schema.py``'s sweep or capacity columns (a :class:`Table`,
as ``sweep.csv`` or ``capacity.csv`` reads back); what to mark on them (the Pareto
front, the best point per SLO, the answer) is given, as the command line computed it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from stepplan.sim.results.schema import SWEEP
from stepplan.sim.results.table import ResultsError, Table

from .canvas import COLORS, new_figure

#: Most traces side by side (a sweep of more draws them on more rows).
_COLUMNS = 3
#: Points numbered on the figure when there are at most this many per trace.
_NUMBERED = 40
_MARKERS = "*^sDPX"


def axis_label(name: str) -> str:
    """A metric column as an axis label: its name and unit (``tpot_p99_ms (ms)``)."""
    column = SWEEP.get(name)
    unit = column.unit if column is not None else ""
    return f"{name} ({unit})" if unit else name


def plot_tradeoff(
    table: Table,
    *,
    x: str,
    y: str,
    front: np.ndarray,
    best: Sequence[tuple[str, str, int]],
) -> Figure:
    """``y`` (higher is better) against ``x`` (lower is better) over a sweep's points,
    one panel per trace: every point numbered, the Pareto front (``front``, ``[points],
    bool``) joined, and each ``(trace, SLO name, row)`` of ``best`` marked and named."""
    table.require_rows("the trade-off figure")
    traces = np.asarray(table.column("trace"))
    names = list(dict.fromkeys(traces.tolist()))
    if len(front) != table.num_rows:
        raise ResultsError(f"{table.name}: {len(front)} front flags for {table.num_rows} points")
    columns = min(len(names), _COLUMNS)
    rows = -(-len(names) // columns)
    figure = new_figure(4.6 * columns + 1.0, 4.0 * rows)
    grid = np.atleast_1d(figure.subplots(rows, columns, squeeze=False)).ravel()
    for axes, name in zip(grid, names, strict=False):
        mine = np.flatnonzero(traces == name)
        marks = [(slo, row) for trace, slo, row in best if trace == name]
        _tradeoff_panel(axes, table, mine, x, y, front, marks)
        axes.set_title(name if len(names) > 1 else f"{name}: {len(mine)} points", fontsize=10)
    for axes in grid[len(names) :]:
        axes.set_visible(False)
    figure.suptitle(f"Sweep: {y} (higher is better) against {x} (lower is better)", fontsize=10)
    return figure


def _tradeoff_panel(
    axes: Axes,
    table: Table,
    rows: np.ndarray,
    x: str,
    y: str,
    front: np.ndarray,
    marks: Sequence[tuple[str, int]],
) -> None:
    xs, ys = table.column(x)[rows], table.column(y)[rows]
    points = table.column("point")[rows]
    on_front = front[rows]
    axes.scatter(xs[~on_front], ys[~on_front], s=22, color=COLORS["eager"], label="point")
    order = np.argsort(xs[on_front], kind="stable")
    axes.plot(
        xs[on_front][order],
        ys[on_front][order],
        "o-",
        color=COLORS["spec"],
        markersize=5,
        linewidth=1.2,
        label="Pareto front",
    )
    if rows.size <= _NUMBERED:
        for px, py, number in zip(xs, ys, points, strict=True):
            if np.isfinite(px) and np.isfinite(py):
                axes.annotate(
                    str(number), (px, py), xytext=(3, 3), textcoords="offset points", fontsize=7
                )
    by_row: dict[int, list[str]] = {}
    for slo, row in marks:  # one marker per point, naming every SLO it is best for
        by_row.setdefault(row, []).append(slo)
    for index, (row, slos) in enumerate(by_row.items()):
        px, py = table.column(x)[row], table.column(y)[row]
        label = f"best for {', '.join(slos)}: point {table.column('point')[row]}"
        marker = _MARKERS[index % len(_MARKERS)]
        axes.scatter([px], [py], s=160, marker=marker, color=COLORS["seed"], zorder=3, label=label)
    axes.set_xlabel(axis_label(x))
    axes.set_ylabel(axis_label(y))
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="lower right")


def plot_capacity(
    table: Table, *, limits: Sequence[tuple[str, float]], answer: float | None, title: str
) -> Figure:
    """A capacity search's curve: each SLO metric against the request-rate scale (log
    scale), its limit dashed, the scales that met every SLO green and the others red,
    and the answer (``None``: none met) as a vertical line."""
    table.require_rows("the capacity figure")
    if not limits:
        raise ResultsError("the capacity figure needs at least one SLO limit")
    scale = table.column("scale")
    met = table.column("met").astype(bool)
    order = np.argsort(scale, kind="stable")
    figure = new_figure(4.4 * len(limits) + 0.6, 3.8)
    grid = np.atleast_1d(figure.subplots(1, len(limits), squeeze=False)).ravel()
    for axes, (metric, limit) in zip(grid, limits, strict=True):
        values = table.column(metric)
        axes.plot(scale[order], values[order], "-", color=COLORS["eager"], linewidth=1.0)
        axes.scatter(scale[met], values[met], color=COLORS["graph"], zorder=3, label="met")
        axes.scatter(scale[~met], values[~met], color=COLORS["seed"], zorder=3, label="failed")
        axes.axhline(limit, linestyle="--", color="black", linewidth=0.9, label=f"limit {limit:g}")
        if answer is not None:
            axes.axvline(answer, color=COLORS["spec"], linewidth=1.2, label=f"answer {answer:g}")
        axes.set_xscale("log")
        axes.set_yscale("log" if _spans_decades(values) else "linear")
        axes.set_xlabel("request-rate scale")
        axes.set_ylabel(axis_label(metric))
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7, loc="upper left")
    figure.suptitle(title)
    return figure


def _spans_decades(values: np.ndarray) -> bool:
    finite = values[np.isfinite(values) & (values > 0)]
    return bool(finite.size) and float(finite.max() / finite.min()) > 20.0


def plot_cost_front(table: Table, *, title: str) -> Figure:
    """The cheapest-deployment search's pairs that met the SLOs: $/hour against goodput,
    each labelled ``GPU xreplicas tpN`` (``split``: disaggregated), the Pareto front joined
    and the cheapest ringed.
    ``table`` has the columns ``gpu``, ``tensor``, ``replicas``, ``usd_per_hour``,
    ``goodput_req_s``, ``met``, ``pareto`` and ``cheapest``."""
    met = table.column("met").astype(bool)
    if not met.any():
        raise ResultsError("the cost figure needs a deployment that met the SLOs")
    cost, goodput = table.column("usd_per_hour")[met], table.column("goodput_req_s")[met]
    front, best = table.column("pareto")[met] == 1, table.column("cheapest")[met] == 1
    names = [
        f"{g} x{r} tp{t}"
        for g, r, t in zip(
            table.column("gpu")[met],
            table.column("replicas")[met],
            table.column("tensor")[met],
            strict=True,
        )
    ]
    if "disaggregated" in table:  # a prefill pool and a decode pool of r each
        split = table.column("disaggregated")[met] == 1
        names = [f"{name} split" if s else name for name, s in zip(names, split, strict=True)]
    figure = new_figure(5.6, 4.0)
    axes = figure.subplots()
    order = np.argsort(cost[front], kind="stable")
    axes.plot(cost[front][order], goodput[front][order], "-", color=COLORS["graph"], label="front")
    axes.scatter(cost, goodput, color=COLORS["eager"], zorder=3, label="meets the SLOs")
    axes.scatter(cost[best], goodput[best], s=140, facecolors="none", edgecolors=COLORS["spec"])
    for x, y, name in zip(cost, goodput, names, strict=True):
        axes.annotate(name, (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    axes.set_xlabel("deployment $ per hour")
    axes.set_ylabel(axis_label("goodput_req_s"))
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="lower right")
    axes.set_title(title, fontsize=9)
    return figure
