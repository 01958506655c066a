"""What each step carried, over time: spec, decode and prefill tokens, and graph hits."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from stepplan.sim.results.schema import KIND_TOKENS
from stepplan.sim.results.sim_result import SimResult
from stepplan.sim.results.table import ResultsError

from .canvas import COLORS, new_figure


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


def plot_composition_over_run(results: SimResult, every: int = 1) -> Figure:
    """Step composition over the whole run: per stretch of simulated time, the mean
    tokens of a step by kind (stacked) and the share of steps that replayed a CUDA graph.
    ``results`` holds every ``every``-th step of the run (the figure's title says so);
    the shares and means are of those steps."""
    steps = results.steps
    steps.require_rows("the step composition over the run")
    start = steps.column("start_s")
    edges = np.linspace(float(start[0]), float(start[-1]) + 1e-9, RUN_BINS + 1)
    index = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, RUN_BINS - 1)
    counts = np.bincount(index, minlength=RUN_BINS).astype(np.float64)
    seen = counts > 0
    figure = new_figure(10.0, 4.5)
    axes, strip = figure.subplots(2, 1, sharex=True, height_ratios=[4, 1.4])
    baseline = np.zeros(RUN_BINS)
    for part, name in KIND_TOKENS.items():
        sums = np.bincount(index, weights=steps.column(name), minlength=RUN_BINS)
        values = baseline + np.divide(sums, counts, out=np.zeros(RUN_BINS), where=seen)
        axes.stairs(values, edges, baseline=baseline, fill=True, color=COLORS[part], label=part)
        baseline = values
    axes.set_ylabel("mean tokens per step")
    axes.legend(loc="upper right", fontsize=8, ncols=3)
    hits = np.bincount(index, weights=steps.column("graph_hit") > 0, minlength=RUN_BINS)
    share = np.divide(hits, counts, out=np.zeros(RUN_BINS), where=seen)
    strip.stairs(share, edges, fill=True, color=COLORS["graph"])
    strip.set_ylim(0, 1)
    strip.set_ylabel("graph\nshare", rotation=0, labelpad=22, va="center")
    strip.set_xlabel("simulated time (s)")
    sampled = "" if every <= 1 else f"; every {every:,}th step drawn"
    overall = (steps.column("graph_hit") > 0).mean()
    figure.suptitle(
        f"Step composition over the whole run ({overall:.1%} of steps replay a graph{sampled})"
    )
    return figure
