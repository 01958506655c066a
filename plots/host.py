"""Host time per step: the planner's measured compile time against the seed builder's cost."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from stepplan.sim.results.sim_result import SimResult
from stepplan.sim.results.table import ResultsError

from .canvas import COLORS, new_figure, plain_log_labels
from .latency import cdf_points


def seed_host_us(results: SimResult, num_groups: int) -> np.ndarray:
    """``[S], float64``: what the seed builder would spend on each step, in µs, by the
    cost model's rule (``SimResult.seed_host_us``: SPEC §4's figures)."""
    if num_groups < 1:
        raise ResultsError(f"num_groups must be positive, got {num_groups}")
    return results.seed_host_us(num_groups)


def run_num_groups(results: SimResult) -> int:
    """Layer groups of the run (``scheduler.num_groups`` in its config; 1 when absent)."""
    scheduler = results.config.get("scheduler", {})
    return int(scheduler.get("num_groups", 1)) if isinstance(scheduler, dict) else 1


def plot_host_time(results: SimResult, num_groups: int | None = None) -> Figure:
    """Per-step host time of the planner (measured ``plan_us``) and of the seed builder
    (SPEC §4 figures times the layer groups): over the run, and as CDFs."""
    steps = results.steps
    steps.require_rows("the host-time figure")
    groups = run_num_groups(results) if num_groups is None else num_groups
    if "plan_us" not in steps.columns:
        raise ResultsError(f"{steps.name}: no plan_us column (measured_steps.csv is missing)")
    planner = steps.column("plan_us")
    if not np.isfinite(planner).all() or (planner < 0).any():
        row = int(np.argmax(~np.isfinite(planner) | (planner < 0)))
        raise ResultsError(f"{steps.name}: plan_us of step row {row} is {planner[row]}")
    seed = seed_host_us(results, groups)
    start = steps.column("start_s")
    figure = new_figure(11.0, 3.8)
    series, cdf = figure.subplots(1, 2, width_ratios=[3, 2])
    for values, name, label in (
        (seed, "seed", "seed builder (SPEC §4)"),
        (planner, "planner", "planner"),
    ):
        series.plot(start, values, ".", color=COLORS[name], markersize=1.5, label=label)
    series.set_yscale("log")
    plain_log_labels(series.yaxis)
    series.set_xlabel("simulated time (s)")
    series.set_ylabel("host µs per step")
    series.legend(loc="center right", fontsize=8, markerscale=6)
    for values, name in ((planner, "planner"), (seed, "seed")):
        ordered, share = cdf_points(np.sort(values))
        median = np.median(values)
        cdf.step(
            ordered, share, where="post", color=COLORS[name], label=f"{name}: p50 {median:.0f} µs"
        )
    cdf.set_xscale("log")
    plain_log_labels(cdf.xaxis)
    cdf.set_xlabel("host µs per step")
    cdf.set_ylabel("share of steps")
    cdf.legend(loc="lower right", fontsize=8)
    figure.suptitle(
        f"Host time per step, {groups} layer group(s): planner measured on the simulating "
        "machine, seed builder's figures from the H200 host"
    )
    return figure
