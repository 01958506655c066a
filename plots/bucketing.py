"""How a run's steps fall into CUDA-graph buckets: step-size histograms with the bucket
edges over them, and the padded share of every bucket."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from stepplan.sim.results.schema import STEP_COUNT
from stepplan.sim.results.sim_result import SimResult
from stepplan.sim.results.table import ResultsError

from .canvas import COLORS, new_figure, plain_log_labels

#: Line colours of the bucketings drawn over one histogram, in order.
EDGE_COLORS = ("#C44E52", "#4C72B0", "#8172B3", "#937860")


def _frozen_ints(value: object) -> np.ndarray:
    array = np.array(value, dtype=np.int64)
    array.flags.writeable = False
    return array


def _sorted_ints(value: object) -> tuple[int, ...]:
    return tuple(sorted({int(v) for v in value}))  # type: ignore[union-attr]


@attrs.frozen(eq=False)
class Bucketing:
    """The graph every step of a run replays under one list of graph sizes.

    Attributes:
        label: legend text (``vLLM default (35)``, ``optimal``, ...).
        graph_tokens: ``[S], int64`` token capacity of each step's graph; 0 = eager.
        graph_rows: ``[S], int64`` row capacity of each step's graph; 0 = eager.
        token_edges: the graphs' token capacities, drawn over the token histogram.
        row_edges: the graphs' row capacities, drawn over the row histogram.
    """

    label: str
    graph_tokens: np.ndarray = attrs.field(converter=_frozen_ints)
    graph_rows: np.ndarray = attrs.field(converter=_frozen_ints)
    token_edges: tuple[int, ...] = attrs.field(converter=_sorted_ints)
    row_edges: tuple[int, ...] = attrs.field(converter=_sorted_ints)

    def __attrs_post_init__(self) -> None:
        if self.graph_tokens.shape != self.graph_rows.shape or self.graph_tokens.ndim != 1:
            raise ResultsError(
                f"bucketing {self.label!r}: graph_tokens {self.graph_tokens.shape} and "
                f"graph_rows {self.graph_rows.shape} must be 1-D of one length"
            )


def run_bucketing(results: SimResult, label: str | None = None) -> Bucketing:
    """The bucketing the run itself used (``steps.csv``); its edges are the buckets
    that at least one step replayed."""
    steps = results.steps
    hit = steps.column("graph_hit") > 0
    tokens = np.where(hit, steps.column("graph_tokens"), 0)
    rows = np.where(hit, steps.column("graph_rows"), 0)
    config = results.config.get("planner", {})
    mode = config.get("graph_mode", "?") if isinstance(config, dict) else "?"
    name = label or f"{results.label} ({mode} graphs)"
    return Bucketing(name, tokens, rows, np.unique(tokens[hit]), np.unique(rows[hit]))


def plot_bucketing(
    results: SimResult, bucketings: Sequence[Bucketing] = (), title: str | None = None
) -> Figure:
    """Step sizes (tokens and rows) with the bucket edges of each bucketing drawn over
    them, and the padded share of every bucket.

    ``bucketings`` default to the run's own; each must have one entry per step (per row
    of the steps: a table of distinct step shapes counts each as its ``STEP_COUNT``).
    The histograms split steps into graph replays and eager runs under the first;
    their counts are on a log scale, so the rare large steps stay visible.
    """
    results.steps.require_rows("the bucketing figure")
    bucketings = tuple(bucketings) or (run_bucketing(results),)
    tokens = results.steps.column("num_tokens")
    rows = results.steps.column("num_rows")
    counts = results.steps.get(STEP_COUNT)
    for bucketing in bucketings:
        if len(bucketing.graph_tokens) != len(tokens):
            raise ResultsError(
                f"bucketing {bucketing.label!r} has {len(bucketing.graph_tokens)} steps, "
                f"{results.steps.name} has {len(tokens)}"
            )
    figure = new_figure(10.0, 9.0)
    top, middle, bottom = figure.subplots(3, 1)
    hit = bucketings[0].graph_tokens > 0
    _histogram(top, tokens, hit, [b.token_edges for b in bucketings], "tokens per step", counts)
    _histogram(middle, rows, hit, [b.row_edges for b in bucketings], "rows per step", counts)
    _padded_share(bottom, tokens, bucketings, counts)
    for index, bucketing in enumerate(bucketings):
        color = EDGE_COLORS[index % len(EDGE_COLORS)]
        top.plot([], [], color=color, linewidth=1, label=f"edges: {bucketing.label}")
    top.legend(loc="upper right", fontsize=8)
    steps = len(tokens) if counts is None else int(counts.sum())
    figure.suptitle(title or f"Step sizes and CUDA-graph buckets ({steps:,} steps)")
    return figure


def _log_bins(values: np.ndarray) -> np.ndarray:
    """Bins on a base-2 log scale, at least one unit wide, covering ``values``."""
    largest = max(int(values.max()), 1)
    edges = np.unique(np.round(np.geomspace(1, largest + 1, 60)))
    return np.concatenate([edges - 0.5, [edges[-1] + 0.5]])


def _histogram(
    axes: Axes,
    values: np.ndarray,
    hit: np.ndarray,
    edge_sets: list,
    xlabel: str,
    counts: np.ndarray | None = None,
) -> None:
    bins = _log_bins(values)
    axes.hist(
        [values[hit], values[~hit]],
        bins=bins,
        weights=None if counts is None else [counts[hit], counts[~hit]],
        stacked=True,
        color=[COLORS["graph"], COLORS["eager"]],
        label=["replays a graph", "eager"],
    )
    for index, edges in enumerate(edge_sets):
        color = EDGE_COLORS[index % len(EDGE_COLORS)]
        style = "-" if index == 0 else "--"
        for edge in edges:
            axes.axvline(edge, color=color, linewidth=0.6, linestyle=style, alpha=0.7)
    axes.set_xscale("log", base=2)
    axes.set_xlim(left=0.7)
    axes.set_yscale("log")
    plain_log_labels(axes.xaxis, base=2)
    plain_log_labels(axes.yaxis)
    axes.set_xlabel(xlabel)
    axes.set_ylabel("steps (log scale)")
    axes.legend(loc="upper left", fontsize=8)


def _padded_share(
    axes: Axes,
    tokens: np.ndarray,
    bucketings: Sequence[Bucketing],
    counts: np.ndarray | None = None,
) -> None:
    """Per bucket: padded tokens over the bucket's capacity, summed over its steps."""
    for index, bucketing in enumerate(bucketings):
        capacity = bucketing.graph_tokens
        hit = capacity > 0
        if not hit.any():
            continue
        weight = 1 if counts is None else counts[hit]
        buckets, which = np.unique(capacity[hit], return_inverse=True)
        padded = np.bincount(which, (capacity - tokens)[hit] * weight)
        filled = np.bincount(which, capacity[hit] * weight)
        share = padded.sum() / filled.sum()
        color = EDGE_COLORS[index % len(EDGE_COLORS)]
        label = f"{bucketing.label}: {share:.1%} of graph tokens padded"
        axes.plot(buckets, padded / filled, "o-", color=color, markersize=3, label=label)
    axes.set_xscale("log", base=2)
    plain_log_labels(axes.xaxis, base=2)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("graph bucket (tokens)")
    axes.set_ylabel("padded share of bucket")
    axes.yaxis.set_major_formatter("{x:.0%}")
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="best", fontsize=8)
    else:
        axes.text(0.5, 0.5, "no step replays a graph", ha="center", transform=axes.transAxes)
