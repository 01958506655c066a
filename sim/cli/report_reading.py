"""What a report reads of a results folder: one pass over its steps, a chunk at a time, so
that a run of any length fits in memory.

Of the steps it keeps the first :data:`HEAD_STEPS` (the step timeline), every ``k``-th
step with each block of ``k`` steps' peaks of KV usage, queue and preemptions (the
host-time and memory figures: ``k`` makes about :data:`FIGURE_STEPS` steps, 1 for a
shorter run), the distinct step shapes with their counts (the bucketing figure and the
bucket comparison, exact) and the richest step (the op graph); of the requests, the
latency columns. Of a deployment's steps (a ``replica`` column), the timeline and the
per-step figures draw replica 0's, the shapes count every replica's; and each
replica's queue length and KV usage over time, averaged over :data:`TIME_BINS` spans of the run
(``plots.deployment``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np

from ..progress import CountProgress
from ..results.schema import KIND_ROWS, REQUESTS, STEPS_IN_MEMORY
from ..results.sim_result import (
    SHAPE_COLUMNS,
    SimResult,
    StepShapes,
    empty_table,
    iter_steps,
    iter_table,
    read_summary,
)
from ..results.table import Table, join_tables

#: The steps the step timeline draws (``plots.timeline``'s window).
HEAD_STEPS = 400
#: About how many steps the per-step figures draw of a longer run (drawing more points
#: costs time and shows nothing more at a figure's width).
FIGURE_STEPS = 20_000
#: Step columns whose peaks every block of the thinned steps keeps.
PEAK_COLUMNS = ("kv_usage", "num_waiting", "num_preempted")
#: Spans of simulated time a deployment's per-replica series average over.
TIME_BINS = 200
#: Request columns the latency figure reads.
LATENCY_COLUMNS = ("request_id", "ttft_s", "tpot_s")
#: Step columns the figures read (the timeline, host time, memory, op graph; the shapes).
STEP_COLUMNS = (
    "step",
    "start_s",
    "duration_s",
    "num_rows",
    "num_tokens",
    "plan_us",
    *PEAK_COLUMNS,
    *SHAPE_COLUMNS,
    "replica",
)


@attrs.frozen(eq=False)
class ReportRun:
    """A results folder as a report reads it (see the module docstring); each part is a
    :class:`SimResult` with the run's summary, path and name.

    Attributes:
        head: the first steps, every column. sample: every ``every``-th step and each
        block's peaks. shapes: the distinct step shapes. richest: the richest step.
        latency: the requests' latency columns (no steps). every: the sample's stride.
        composition: the step composition over the run, counted from every step (replica
        0's), one row per span of time (``plots.timeline.composition_sums``), or ``None``.
        replicas: a deployment's per-replica series (``replica``, ``time_s``,
        ``num_waiting``, ``kv_usage``, ``[replicas * TIME_BINS]`` each), or ``None``.
    """

    head: SimResult
    sample: SimResult
    shapes: SimResult
    richest: SimResult
    latency: SimResult
    every: int
    replicas: Table | None = None
    composition: Table | None = None


def read_latency(folder: Path, name: str | None = None) -> SimResult:
    """The folder's summary and its requests' latency columns."""
    summary = read_summary(folder)
    chunks = list(iter_table(folder, REQUESTS, LATENCY_COLUMNS))
    steps = empty_table(STEPS_IN_MEMORY)
    return SimResult(
        steps, join_tables(chunks, REQUESTS), np.zeros(0), summary, path=folder, name=name
    )


def read_report_run(
    folder: Path,
    name: str | None = None,
    progress: Callable[[int], CountProgress | None] | None = None,
) -> ReportRun:
    """:class:`ReportRun` of ``folder`` (``name``: the run's name in legends);
    ``progress(steps)`` gives what hears of the steps read (none for no progress)."""
    latency = read_latency(folder, name)
    steps = int(latency.summary.get("steps", {}).get("count", 0) or 0)
    every = max(1, math.ceil(steps / FIGURE_STEPS))
    reading = None if progress is None else progress(steps)
    head: list[Table] = []
    sample: list[Table] = []
    shapes, richest = StepShapes(), _Richest()
    series = _ReplicaSeries(float(latency.summary.get("duration_s") or 0.0))
    composition = _Composition(float(latency.summary.get("duration_s") or 0.0))
    for chunk in iter_steps(folder, STEP_COLUMNS):
        series.add(chunk)
        shapes.add(chunk)
        richest.add(chunk)
        if "replica" in chunk:  # a deployment: the per-step figures follow replica 0
            chunk = _rows(chunk, np.flatnonzero(chunk.column("replica") == 0))
        composition.add(chunk)
        if sum(c.num_rows for c in head) < HEAD_STEPS:
            head.append(_rows(chunk, np.arange(min(chunk.num_rows, HEAD_STEPS))))
        sample.append(_rows(chunk, _thinned(chunk, every)))
        if reading is not None:
            reading.advance(chunk.num_rows)
    if reading is not None:
        reading.close()

    def part(table: Table) -> SimResult:
        return attrs.evolve(latency, steps=table, requests=empty_table(REQUESTS))

    head_table = _rows(join_tables(head, STEPS_IN_MEMORY), np.arange(HEAD_STEPS))
    return ReportRun(
        head=part(head_table),
        sample=part(join_tables(sample, STEPS_IN_MEMORY)),
        shapes=part(shapes.table()),
        richest=part(richest.table or head_table),
        latency=latency,
        every=every,
        replicas=series.table(),
        composition=composition.table(),
    )


def _rows(table: Table, index: np.ndarray) -> Table:
    """Rows ``index`` of ``table`` (those past its end left out)."""
    index = index[index < table.num_rows]
    return Table.from_columns(table.name, {k: v[index] for k, v in table.items()})


def _thinned(steps: Table, every: int) -> np.ndarray:
    """``[k], int64`` the rows of a chunk the figures draw: every ``every``-th step and,
    in each block of ``every`` steps, the first step of each peak column's maximum."""
    step = steps.column("step")
    keep = step % every == 0
    if every > 1:
        block = step // every
        for name in PEAK_COLUMNS:
            if name in steps:
                order = np.lexsort((-steps[name], block))
                first = np.r_[True, block[order][1:] != block[order][:-1]]
                keep[order[first]] = True
    return np.flatnonzero(keep)


class _Richest:
    """The run's richest step (most kinds of rows, then most rows; the first of equals),
    kept as its chunks go by."""

    def __init__(self) -> None:
        self.table: Table | None = None
        self._key = (-1, -1)

    def add(self, steps: Table) -> None:
        if steps.num_rows == 0:
            return
        kinds = sum((steps.column(name) > 0).astype(np.int64) for name in KIND_ROWS.values())
        rows = steps.column("num_rows")
        row = int(np.lexsort((-rows, -kinds))[0])
        key = (int(kinds[row]), int(rows[row]))
        if key > self._key:
            self._key, self.table = key, _rows(steps, np.array([row]))


class _Composition:
    """The step composition over ``[0, duration_s]`` (``plots.timeline``'s spans), summed
    from every step as the chunks go by: the figure's numbers never come from a sample."""

    def __init__(self, duration_s: float) -> None:
        from stepplan.plots.timeline import RUN_BINS

        self._edges = np.linspace(0.0, max(duration_s, 1e-9), RUN_BINS + 1)
        self._sums: dict[str, np.ndarray] = {}

    def add(self, steps: Table) -> None:
        from stepplan.plots.timeline import composition_sums

        if steps.num_rows == 0:
            return
        for name, values in composition_sums(steps, self._edges).items():
            held = self._sums.setdefault(name, np.zeros_like(values))
            held += values

    def table(self) -> Table | None:
        if not self._sums:
            return None
        columns = {"start_s": self._edges[:-1], "end_s": self._edges[1:], **self._sums}
        return Table.from_columns("composition", columns)


class _ReplicaSeries:
    """Each replica's time-weighted queue length and KV usage in :data:`TIME_BINS` spans
    of ``[0, duration_s]`` (a step counts in the span it starts in), kept as the
    chunks go by."""

    def __init__(self, duration_s: float) -> None:
        self._width = max(duration_s, 1e-9) / TIME_BINS
        self._sums: dict[str, np.ndarray] = {}

    def add(self, steps: Table) -> None:
        if "replica" not in steps or steps.num_rows == 0:
            return
        replica = steps.column("replica").astype(np.int64)
        spans = np.minimum(steps.column("start_s") // self._width, TIME_BINS - 1)
        cell = replica * TIME_BINS + spans.astype(np.int64)
        size = (int(replica.max()) + 1) * TIME_BINS
        duration = steps.column("duration_s")
        parts = {
            "time": duration,
            "num_waiting": steps.column("num_waiting") * duration,
            "kv_usage": steps.column("kv_usage") * duration,
        }
        for name, values in parts.items():
            held = self._sums.setdefault(name, np.zeros(size))
            if held.size < size:
                held = self._sums[name] = np.concatenate([held, np.zeros(size - held.size)])
            held += np.bincount(cell, weights=values, minlength=held.size)

    def table(self) -> Table | None:
        if not self._sums:
            return None
        time = self._sums["time"]
        cells = np.arange(time.size)
        with np.errstate(invalid="ignore", divide="ignore"):
            columns = {
                "replica": cells // TIME_BINS,
                "time_s": (cells % TIME_BINS + 0.5) * self._width,
                "num_waiting": np.where(time > 0, self._sums["num_waiting"] / time, np.nan),
                "kv_usage": np.where(time > 0, self._sums["kv_usage"] / time, np.nan),
            }
        return Table.from_columns("replicas", columns)
