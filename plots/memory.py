"""KV-cache usage, preemptions and the waiting queue over the simulated clock."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from stepplan.sim.results.sim_result import SimResult

from .canvas import COLORS, new_figure

#: ``steps.csv`` columns the figure reads.
FIGURE_COLUMNS = ("start_s", "duration_s", "kv_usage", "num_waiting", "num_preempted")


def has_memory_columns(results: SimResult) -> bool:
    """Whether the run's ``steps.csv`` has the memory columns (older runs do not)."""
    return all(name in results.steps.columns for name in FIGURE_COLUMNS)


def _preemptions(results: SimResult, preempted: np.ndarray) -> int:
    """The run's preemptions: its summary's count (the steps drawn may be a sample of a
    long run's), else the steps' sum."""
    memory = results.summary.get("memory")
    count = memory.get("preemptions") if isinstance(memory, dict) else None
    return int(count) if isinstance(count, int) else int(preempted.sum())


def plot_memory(results: SimResult) -> Figure:
    """Two panels over simulated time: KV-cache usage (share of the blocks, with a tick
    per step that preempted), and requests waiting (arrived, not running)."""
    steps = results.steps
    steps.require_rows("the memory figure")
    start = steps.column("start_s")
    end = start + steps.column("duration_s")
    usage = steps.column("kv_usage") * 100.0
    waiting = steps.column("num_waiting")
    preempted = steps.column("num_preempted")
    figure = new_figure(10.0, 5.0)
    kv, queue = figure.subplots(2, 1, sharex=True)
    kv.step(end, usage, where="pre", color=COLORS["spec"], linewidth=0.8, label="KV blocks in use")
    hits = preempted > 0
    if hits.any():
        kv.plot(
            end[hits],
            np.full(hits.sum(), 101.0),
            "|",
            color=COLORS["seed"],
            markersize=8,
            label=f"preemption ({_preemptions(results, preempted):,} in all)",
        )
    kv.set_ylim(0, 105)
    kv.set_ylabel("KV cache used (%)")
    kv.legend(loc="lower right", fontsize=8)
    kv.grid(alpha=0.3)
    queue.step(end, waiting, where="pre", color=COLORS["prefill"], linewidth=0.8)
    queue.set_ylim(bottom=0)
    queue.set_ylabel("requests waiting")
    queue.set_xlabel("simulated time (s)")
    queue.grid(alpha=0.3)
    figure.suptitle(
        f"KV cache and queue (peak {usage.max():.0f}% used, at most {int(waiting.max()):,} waiting)"
    )
    return figure
