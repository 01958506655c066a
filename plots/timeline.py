"""What each step carried, over time: spec, decode and prefill tokens, and graph hits."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from stepplan.sim.results.schema import KIND_TOKENS
from stepplan.sim.results.sim_result import SimResult
from stepplan.sim.results.table import ResultsError, Table

from .canvas import COLORS, new_figure, plain_log_labels


def plot_timeline(results: SimResult, first_step: int = 0, num_steps: int = 400) -> Figure:
    """Tokens per step, stacked by kind, for steps ``first_step .. first_step + num_steps``;
    a strip below marks the steps that replayed a CUDA graph.

    One step per unit of x (the simulated clock would spend most of the width on idle
    gaps and on long prefill steps), tokens on a symmetric-log scale (a spec step of a
    few tokens stays visible beside a prefill chunk of thousands)."""
    steps = results.steps
    steps.require_rows("the step timeline")
    if num_steps < 1 or not 0 <= first_step < steps.num_rows:
        raise ResultsError(
            f"{steps.name}: steps {first_step}..{first_step + num_steps} are outside "
            f"0..{steps.num_rows - 1}"
        )
    window = slice(first_step, first_step + num_steps)
    start = steps.column("start_s")[window]
    duration = steps.column("duration_s")[window]
    if (duration < 0).any() or (np.diff(start) < 0).any():
        raise ResultsError(f"{steps.name}: step start times must grow and durations be >= 0")
    edges = np.arange(first_step, first_step + len(start) + 1)
    figure = new_figure(10.0, 4.5)
    axes, strip = figure.subplots(2, 1, sharex=True, height_ratios=[6, 1])
    baseline = np.zeros(len(start))
    for part, name in KIND_TOKENS.items():
        values = baseline + steps.column(name)[window]
        axes.stairs(values, edges, baseline=baseline, fill=True, color=COLORS[part], label=part)
        baseline = values
    axes.set_yscale("symlog", linthresh=16)
    plain_log_labels(axes.yaxis)
    axes.set_ylim(bottom=0)
    axes.set_ylabel("tokens per step (symlog)")
    axes.legend(loc="upper right", fontsize=8, ncols=3)
    hit = steps.column("graph_hit")[window] > 0
    strip.stairs(hit.astype(float), edges, fill=True, color=COLORS["graph"])
    strip.set_yticks([])
    strip.set_ylabel("graph", rotation=0, labelpad=18, va="center")
    strip.set_xlabel("step")
    last = first_step + len(start) - 1
    clock = f"{start[0]:.2f}-{start[-1] + duration[-1]:.2f} s"
    figure.suptitle(
        f"Step composition, steps {first_step}..{last} (simulated {clock}; "
        f"{hit.mean():.0%} replay a graph)"
    )
    return figure


#: Time bins of the whole-run composition figure.
RUN_BINS = 120


def composition_sums(steps: Table, edges: np.ndarray) -> dict[str, np.ndarray]:
    """Per span of ``edges`` (``[bins + 1]``, seconds; a step counts in the span it starts
    in): ``steps``, each kind's tokens summed and ``graph_hit`` (steps that replayed a
    graph), ``[bins]`` float64 each -- sums, so that chunks of a run add up exactly."""
    bins = len(edges) - 1
    start = steps.column("start_s")
    index = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, bins - 1)
    sums = {"steps": np.bincount(index, minlength=bins).astype(np.float64)}
    for name in KIND_TOKENS.values():
        sums[name] = np.bincount(index, weights=steps.column(name), minlength=bins)
    hits = steps.column("graph_hit") > 0
    sums["graph_hit"] = np.bincount(index, weights=hits, minlength=bins)
    return sums


def plot_composition_over_run(
    results: SimResult, every: int = 1, binned: Table | None = None
) -> Figure:
    """Step composition over the whole run: per stretch of simulated time, the mean
    tokens of a step by kind (stacked) and the share of steps that replayed a CUDA graph.
    ``binned`` (``start_s``, ``end_s`` and :func:`composition_sums`' columns, one row per
    stretch, counted from every step) gives the figure its numbers; without it they are
    those of ``results``' steps, every ``every``-th step of the run (the title says so)."""
    if binned is None:
        steps = results.steps
        steps.require_rows("the step composition over the run")
        start = steps.column("start_s")
        edges = np.linspace(float(start[0]), float(start[-1]) + 1e-9, RUN_BINS + 1)
        sums = composition_sums(steps, edges)
        sampled = "" if every <= 1 else f"; every {every:,}th step drawn"
    else:
        binned.require_rows("the step composition over the run")
        edges = np.append(binned.column("start_s"), binned.column("end_s")[-1])
        sums = dict(binned.items())
        sampled = f"; all {int(sums['steps'].sum()):,} steps"
    bins = len(edges) - 1
    counts = sums["steps"]
    seen = counts > 0
    figure = new_figure(10.0, 4.5)
    axes, strip = figure.subplots(2, 1, sharex=True, height_ratios=[4, 1.4])
    baseline = np.zeros(bins)
    for part, name in KIND_TOKENS.items():
        values = baseline + np.divide(sums[name], counts, out=np.zeros(bins), where=seen)
        axes.stairs(values, edges, baseline=baseline, fill=True, color=COLORS[part], label=part)
        baseline = values
    axes.set_ylabel("mean tokens per step")
    axes.legend(loc="upper right", fontsize=8, ncols=3)
    share = np.divide(sums["graph_hit"], counts, out=np.zeros(bins), where=seen)
    strip.stairs(share, edges, fill=True, color=COLORS["graph"])
    strip.set_ylim(0, 1)
    strip.set_ylabel("graph\nshare", rotation=0, labelpad=22, va="center")
    strip.set_xlabel("simulated time (s)")
    overall = sums["graph_hit"].sum() / max(counts.sum(), 1.0)
    figure.suptitle(
        f"Step composition over the whole run ({overall:.1%} of steps replay a graph{sampled})"
    )
    return figure
