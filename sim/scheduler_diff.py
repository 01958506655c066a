"""Two schedulers on the same trace and cost model, decision by decision
(``stepplan scheduler-diff``; ``docs/scheduler_vllm.md``).

Both runs take the same settings but ``scheduler.implementation`` (and whatever else
the caller changes on one side). Step ``i`` of one run is set against step ``i`` of
the other: they *agree* when they schedule the same requests with the same token
counts (row order aside). While they agree their clocks, arrivals and acceptance
draws (drawn by request and spec step) stay equal, so the first step that differs
is where their rules part; later steps are compared by index all the same.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from .results.outcome import MemoryStore
from .run import StepEvent, run_steps
from .settings.config import SimConfig
from .traces import RequestTable

#: Steps shown before the first divergence.
CONTEXT_STEPS = 2


@attrs.frozen
class StepDecision:
    """What one scheduler decided in one step.

    Attributes:
        start_s: when the step began. requests: ``[R], int64`` requests scheduled,
        ascending. tokens: ``[R], int64`` their token counts. preempted: requests
        preempted while scheduling it.
    """

    start_s: float
    requests: np.ndarray
    tokens: np.ndarray
    preempted: int

    def same(self, other: StepDecision) -> bool:
        """The same requests with the same token counts."""
        return np.array_equal(self.requests, other.requests) and np.array_equal(
            self.tokens, other.tokens
        )

    def text(self) -> str:
        """``t=... s: r17:1024 r18:4 ... (preempted 1)``, for a person."""
        pairs = " ".join(f"r{r}:{t}" for r, t in zip(self.requests, self.tokens, strict=True))
        preempted = f" (preempted {self.preempted})" if self.preempted else ""
        return f"t={self.start_s:.6f} s: {pairs}{preempted}"


def _decisions(table: RequestTable, config: SimConfig) -> tuple[list[StepDecision], Any]:
    """Every step's decision under ``config``, and the run's end (``RunEnd``)."""
    decisions: list[StepDecision] = []

    def observe(event: StepEvent) -> None:
        step = event.step
        order = np.argsort(step.request_ids, kind="stable")
        decisions.append(
            StepDecision(
                event.start_s,
                step.request_ids[order],
                step.batch.query_lens[order].astype(np.int64),
                step.memory.num_preempted,
            )
        )

    end = run_steps(table, config, MemoryStore(), observer=observe)
    return decisions, end


@attrs.frozen
class SchedulerDiff:
    """The two runs' decisions compared (see the module docstring).

    Attributes:
        labels: the two sides' names. steps: their step counts.
        agreeing_steps: step indices both ran where they agree.
        first_divergence: the first index where they do not (``None``: none).
        context: ``(label, decision text)`` lines around it, both sides.
        sides: per side, preemptions, prefix-cache tokens and end-to-end figures.
    """

    labels: tuple[str, str]
    steps: tuple[int, int]
    agreeing_steps: int
    first_divergence: int | None
    context: tuple[str, ...]
    sides: tuple[dict[str, float], dict[str, float]]

    @property
    def agreement(self) -> float:
        """Agreeing steps over the longer run's steps."""
        return self.agreeing_steps / max(1, *self.steps)

    def to_dict(self) -> dict[str, Any]:
        """The comparison as JSON-ready data."""
        return {
            "labels": list(self.labels),
            "steps": list(self.steps),
            "agreeing_steps": self.agreeing_steps,
            "agreement": self.agreement,
            "first_divergence": self.first_divergence,
            "context": list(self.context),
            "sides": {label: side for label, side in zip(self.labels, self.sides, strict=True)},
        }

    def format(self) -> str:
        """The comparison as text."""
        a, b = self.labels
        lines = [
            f"steps: {a} {self.steps[0]:,}, {b} {self.steps[1]:,}; identical decisions on "
            f"{self.agreeing_steps:,} ({100 * self.agreement:.2f}%)",
            "first divergence: "
            + ("none" if self.first_divergence is None else f"step {self.first_divergence}"),
            *(f"  {line}" for line in self.context),
            f"{'':28}{a:>16}{b:>16}{'B - A':>14}",
        ]
        for key in self.sides[0]:
            x, y = self.sides[0][key], self.sides[1][key]
            lines.append(f"{key:28}{x:16.6g}{y:16.6g}{y - x:14.6g}")
        return "\n".join(lines)


def _number(value: float | None) -> float:
    return np.nan if value is None else float(value)


def _side(end: Any, decisions: list[StepDecision]) -> dict[str, float]:
    """One run's preemptions, prefix-cache tokens and end-to-end figures."""
    summary, columns = end.summary, end.rows.columns()
    latency = summary["latency_ms"]
    return {
        "preemptions": float(sum(d.preempted for d in decisions)),
        "prefix_cached_tokens": float(np.sum(columns["cached_tokens"])),
        "recomputed_tokens": float(np.sum(columns["recomputed_tokens"])),
        "ttft_ms_mean": _number(latency["ttft"]["mean"]),
        "ttft_ms_p99": _number(latency["ttft"]["p99"]),
        "tpot_ms_mean": _number(latency["tpot"]["mean"]),
        "output_tokens_per_s": float(summary["throughput"]["output_tokens_per_s"]),
        "duration_s": float(summary["duration_s"]),
    }


def compare_schedulers(
    table: RequestTable,
    config_a: SimConfig,
    config_b: SimConfig,
    labels: tuple[str, str] = ("A", "B"),
) -> SchedulerDiff:
    """Run ``table`` under both configurations and compare their decisions step by step."""
    runs = [_decisions(table, config) for config in (config_a, config_b)]
    (steps_a, end_a), (steps_b, end_b) = runs
    same = [x.same(y) for x, y in zip(steps_a, steps_b, strict=False)]
    first = same.index(False) if False in same else None
    if first is None and len(steps_a) != len(steps_b):
        first = min(len(steps_a), len(steps_b))
    context: list[str] = []
    if first is not None:
        for index in range(max(0, first - CONTEXT_STEPS), first + 1):
            for label, steps in zip(labels, (steps_a, steps_b), strict=True):
                shown = steps[index].text() if index < len(steps) else "(no step)"
                context.append(f"step {index} {label}: {shown}")
    return SchedulerDiff(
        labels,
        (len(steps_a), len(steps_b)),
        int(sum(same)),
        first,
        tuple(context),
        (_side(end_a, steps_a), _side(end_b, steps_b)),
    )
