"""What a simulation run leaves: its steps, handed chunk by chunk to a store as the loop
makes them (:class:`MemoryStore` for ``simulate``'s :class:`~.results.SimResult`; a
results folder's files for the command line, ``writer.py``), its request rows, and its
summary. The loop keeps no step once a chunk is handed on, so a run's memory does not
grow with its steps (only ``plan_us`` stays, for its percentiles).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np

from ..memory_sizing import memory_summary
from ..settings.config import SimConfig
from ..timing.pricing import deployment_dollars
from ..traces import RequestTable
from .records import STEP_RECORD, RequestLog, RequestRows, step_columns
from .schema import MEASURED, STEPS_IN_MEMORY
from .summary import FINISHED_COLUMNS, StepTotals, summarize
from .table import Table

if TYPE_CHECKING:
    from ..live import LiveStepper
    from ..scheduler import Scheduler


class StepStore(Protocol):
    """Where a run's steps go as the loop makes them."""

    def start(self, rows: RequestRows) -> None:
        """Called before the first step: the run's request rows, none final yet."""

    def add_steps(self, steps: Mapping[str, np.ndarray]) -> None:
        """One chunk of ``schema.STEPS_IN_MEMORY`` columns, ``[k]`` each (views the loop
        reuses after the call: keep copies)."""

    def add_requests(self, rows: RequestRows) -> None:
        """Called after each chunk: the rows of finished requests are final now."""


class MemoryStore:
    """Keeps every step in memory, for a :class:`~.results.SimResult`."""

    def __init__(self) -> None:
        self._chunks: list[dict[str, np.ndarray]] = []

    def add_steps(self, steps: Mapping[str, np.ndarray]) -> None:
        self._chunks.append({name: np.array(values) for name, values in steps.items()})

    def start(self, rows: RequestRows) -> None:
        pass

    def add_requests(self, rows: RequestRows) -> None:
        pass  # all of them at the end (RunEnd.rows)

    def table(self) -> Table:
        """Every step's columns as one table."""
        chunks = self._chunks or [step_columns(np.zeros((0, len(STEP_RECORD))))]
        columns = {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}
        return Table.from_columns("steps", columns, STEPS_IN_MEMORY)


@attrs.frozen(eq=False)
class RunEnd:
    """A run once its loop ended.

    Attributes:
        summary: the ``summary.json`` document (with its ``measured`` section).
        rows: its request rows.
        log: its request log (``itl_s``: every inter-token gap).
    """

    summary: dict[str, Any]
    rows: RequestRows
    log: RequestLog


def run_summary(
    table: RequestTable,
    config: SimConfig,
    totals: StepTotals,
    rows: RequestRows,
    scheduler: Scheduler,
    wall_s: float,
    live: LiveStepper | None = None,
    extra: dict[str, Any] | None = None,
    *,
    complete: bool = True,
    keep_gaps: bool = True,
) -> dict[str, Any]:
    """The summary of a run over ``table`` whose steps came to ``totals``; without
    ``keep_gaps`` the log's inter-token gaps are consumed (scaled and reordered)."""
    requests, log = rows.stored(), rows.log
    finished = rows.columns(where=~np.isnan(log.finish_s), names=FINISHED_COLUMNS)
    trace: dict[str, Any] = {
        "path": table.source,
        "format": table.format,
        "requests": table.num_requests,
        "span_s": table.span_s,
        "skipped": table.skipped,
        "rejected_max_model_len": table.rejected,
    }
    gaps = log.gaps[: int(log.size[0])]  # a view: the gaps of a long run are many
    spec_steps = int(scheduler.spec_steps.sum())
    summary = summarize(
        config.to_dict(),
        trace,
        totals,
        requests,
        finished,
        gaps,
        spec_steps,
        wall_s,
        complete=complete,
        itl_in_place=not keep_gaps,
    )
    if scheduler.pool is not None:
        summary["memory"] = memory_summary(scheduler.pool.layout, totals, requests)
    summary.update(extra or {})
    output = int(finished["output_tokens"].sum())
    summary["dollars"] = deployment_dollars(
        config.gpu.resolved().price_per_hour,
        config.parallel.gpus_per_replica * config.deployment.replicas,  # every GPU held
        summary["duration_s"],
        output,
        summary["goodput"]["requests"],
    )
    summary["cost"] = _cost_sources(config, totals, live)
    summary["live"] = live is not None
    if live is not None:
        live_run = summary["live_run"] = live.summary()
        summary[MEASURED]["live_run"] = {"model_wall_s": live_run.pop("model_wall_s")}
    return summary


def _cost_sources(config: SimConfig, steps: StepTotals, live: LiveStepper | None) -> dict[str, Any]:
    """Where the steps' times came from: an engine profile (the steps it covered), the
    roofline (the rest), or the live engine's measurements."""
    if live is not None and live.measured_time:
        return {"source": "measured", "steps_measured": steps.count}
    from_profile = steps.from_profile if config.cost.profile else 0
    return {
        "source": "profile" if config.cost.profile else "roofline",
        "profile": config.cost.profile,
        "steps_from_profile": from_profile,
        "steps_from_roofline": steps.count - from_profile,
    }
