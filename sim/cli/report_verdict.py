"""What a report says first: the verdict (each SLO met or missed and by how much,
overloaded or not and from when, goodput, TTFT p99, TPOT p99) and the summary in the
console's words and units. Figures as the console prints them: thousands separated,
units named."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..results.sim_result import SimResult
from ..results.summary import summary_rows
from .tables import run_header

if TYPE_CHECKING:
    from stepplan.plots.report import ReportTable, Verdict

#: A run is overloaded when its waiting queue stays non-empty for at least this share
#: of its simulated time in one stretch (requests pile up faster than they are served).
OVERLOAD_SHARE = 0.25
#: The objectives, as (name, latency key, SLO key).
OBJECTIVES = (("TTFT", "ttft", "ttft_ms"), ("TPOT", "tpot", "tpot_ms"))


def milliseconds(value: float | None) -> str:
    """``1,584 ms``, ``26.9 ms``, ``6.89 ms``: the console's precision for a latency."""
    if value is None or not np.isfinite(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f} ms"
    return f"{value:.1f} ms" if abs(value) >= 10 else f"{value:.2f} ms"


def overload(sample: SimResult) -> tuple[float, float, int] | None:
    """``(from_s, share, peak)``: the start of the longest stretch in which the waiting
    queue never emptied, its share of the run's simulated time and the queue's peak in
    it; ``None`` when no stretch reaches :data:`OVERLOAD_SHARE` (or the steps carry no
    queue). ``sample`` may be every k-th step with each block's peak queue: a block
    whose peak is 0 had an empty queue throughout."""
    steps = sample.steps
    if steps.num_rows == 0 or "num_waiting" not in steps.columns:
        return None
    start = steps.column("start_s")
    waiting = steps.column("num_waiting")
    span = float(start[-1] - start[0]) or 1.0
    busy = np.concatenate([[False], waiting > 0, [False]])
    edges = np.flatnonzero(np.diff(busy.astype(np.int8)))
    best: tuple[float, float, int] | None = None
    for first, end in zip(edges[::2], edges[1::2], strict=True):
        until = float(start[end]) if end < start.size else float(start[-1])
        share = (until - float(start[first])) / span
        if share >= OVERLOAD_SHARE and (best is None or share > best[1]):
            best = (float(start[first]), share, int(waiting[first:end].max()))
    return best


def verdict_of(summary: Mapping[str, Any], sample: SimResult, notes: Sequence[str] = ()) -> Verdict:
    """The report's opening block for a run of ``summary`` (``sample``: its steps, or
    every k-th of them, for the queue)."""
    from stepplan.plots.report import Verdict

    latency, slo = summary.get("latency_ms", {}), summary.get("config", {}).get("slo", {})
    checks = []
    for name, key, target_key in OBJECTIVES:
        p99, target = latency.get(key, {}).get("p99"), slo.get(target_key)
        if p99 is None or not target:
            continue
        objective = f"{name} p99 <= {milliseconds(target)}"
        if p99 <= target:
            outcome = f"{milliseconds(p99)}, {milliseconds(target - p99)} under"
        else:
            over = f"over by {milliseconds(p99 - target)} ({p99 / target:,.2f}x)"
            outcome = f"{milliseconds(p99)}, {over}"
        checks.append((objective, outcome, p99 <= target))
    missed = [objective.split()[0] for objective, _, ok in checks if not ok]
    headline = _headline(summary, overload(sample), missed)
    goodput = summary.get("goodput", {})
    figures = [
        ("goodput", f"{100 * goodput.get('share', 0.0):.1f}% of requests within both SLOs "
                    f"({goodput.get('requests_per_s', 0.0):,.2f} req/s)"),
        ("TTFT p99", milliseconds(latency.get("ttft", {}).get("p99"))),
        ("TPOT p99", milliseconds(latency.get("tpot", {}).get("p99"))),
    ]  # fmt: skip
    done, total = summary.get("finished_requests", 0), summary.get("requests", 0)
    finished = f"{done:,} of {total:,} requests finished"
    return Verdict(headline, f"{_subject(summary)}; {finished}", figures, checks, notes)


def _headline(
    summary: Mapping[str, Any], overloaded: tuple[float, float, int] | None, missed: list[str]
) -> str:
    verdict = f"{' and '.join(missed)} SLO missed" if missed else "Both SLOs met at p99"
    if len(missed) == 2:
        verdict = "both SLOs missed"
    if overloaded is not None:
        from_s, share, peak = overloaded
        duration = float(summary.get("duration_s", 0.0))
        verdict = (
            f"Overloaded from {from_s:,.0f} s of {duration:,.0f} s (the queue never empties "
            f"for {share:.0%} of the run, up to {peak:,} waiting): {verdict}"
        )
    elif missed:
        verdict = verdict[0].upper() + verdict[1:]
    if summary.get("complete") is False:
        verdict += " (the run was stopped early: partial results)"
    return verdict


def _subject(summary: Mapping[str, Any]) -> str:
    try:
        return run_header(summary)
    except (KeyError, TypeError):
        return "a run without its settings in summary.json"


def summary_table(summary: Mapping[str, Any]) -> ReportTable | None:
    """The console's summary rows (words, units, thousands separated), or ``None`` for a
    summary they cannot be made of."""
    from stepplan.plots.report import ReportTable

    try:
        rows = summary_rows(dict(summary))
    except (KeyError, TypeError):
        return None
    return ReportTable("Summary", ("", "value"), rows)


def differing(
    a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = ""
) -> list[tuple[str, Any, Any]]:
    """``(dotted key, a's value, b's value)`` of each setting two ``config`` dicts differ in."""
    found = []
    for key in sorted(set(a) | set(b)):
        left, right = a.get(key), b.get(key)
        if isinstance(left, Mapping) and isinstance(right, Mapping):
            found += differing(left, right, f"{prefix}{key}.")
        elif left != right:
            found.append((f"{prefix}{key}", left, right))
    return found


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The settings two runs' ``config`` dicts differ in: ``cost.host_cost: model -> seed``."""
    return [f"{key}: {left} -> {right}" for key, left, right in differing(a, b)]


def side_labels(a: Mapping[str, Any], b: Mapping[str, Any], most: int = 2) -> tuple[str, str]:
    """Column titles of two runs that say what differs: ``A: host_cost=model`` and
    ``B: host_cost=seed`` (the first ``most`` differences; ``A`` and ``B`` for none)."""
    found = differing(a, b)

    def title(side: str, values: list[str]) -> str:
        more = ", ..." if len(found) > most else ""
        return f"{side}: {', '.join(values[:most])}{more}" if values else side

    def value(text: Any) -> str:
        shown = ",".join(map(str, text)) if isinstance(text, list) else str(text)
        return shown if len(shown) <= 24 else shown[:21] + "..."

    leaf = [key.rsplit(".", 1)[-1] for key, _, _ in found]
    return (
        title("A", [f"{k}={value(v)}" for k, (_, v, _) in zip(leaf, found, strict=True)]),
        title("B", [f"{k}={value(v)}" for k, (_, _, v) in zip(leaf, found, strict=True)]),
    )
