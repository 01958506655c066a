"""Capacity search: the largest request-rate scale whose run meets every SLO.

The search keeps a bracket ``[a, b]``: ``a`` met the SLOs, ``b`` did not. It starts
from ``lo`` and ``hi`` (and, with more than two points a round, scales between them),
and each round runs ``per_round`` scales spread evenly in log scale inside the bracket,
so the bracket shrinks ``per_round + 1``-fold a round (bisection for one). It stops when
``b / a <= 1 + tol``; the answer is ``a``. Latency grows with the rate, so a scale that
meets the SLOs has every lower one meeting them too; where the runs say otherwise the
bracket follows the lowest scale that failed, and a note says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import attrs

#: Significant digits a probed scale is rounded to (equal searches probe equal scales,
#: and a re-run finds their records).
SCALE_DIGITS = 6
STATUSES = ("found", "below-lo", "above-hi")

#: Runs the scales of one round (the round's number second); which of them met the SLOs.
Evaluate = Callable[[Sequence[float], int], Sequence[bool]]


class SearchError(ValueError):
    """Search bounds that cannot bracket anything; the message names the option."""


@attrs.frozen
class Probe:
    """One scale run: whether it met every SLO, and the round that ran it (from 0)."""

    scale: float
    met: bool
    round: int


@attrs.frozen
class SearchResult:
    """What the search found.

    Attributes:
        answer: the largest scale that met the SLOs (``None``: not even ``lo``).
        status: ``found`` (``answer`` within ``tol`` of the first failing scale),
            ``below-lo`` (``lo`` failed) or ``above-hi`` (``hi`` met: the capacity is
            at least ``hi``).
        bracket: the last ``(met, failed)`` scales (``None`` unless ``found``).
        probes: every scale run, by scale.
        notes: where the runs were not monotone in the scale.
    """

    answer: float | None
    status: str
    bracket: tuple[float, float] | None
    probes: tuple[Probe, ...]
    notes: tuple[str, ...] = ()

    @property
    def rounds(self) -> int:
        """Rounds the search ran."""
        return 1 + max((probe.round for probe in self.probes), default=-1)


def rounded(scale: float) -> float:
    """``scale`` to :data:`SCALE_DIGITS` significant digits."""
    return float(f"{scale:.{SCALE_DIGITS}g}")


def between(low: float, high: float, count: int) -> list[float]:
    """``count`` scales evenly spread in log scale strictly inside ``(low, high)``
    (fewer where rounding makes two equal)."""
    ratio = high / low
    scales = (rounded(low * ratio ** (i / (count + 1))) for i in range(1, count + 1))
    return sorted({s for s in scales if low < s < high})


def check_bounds(lo: float, hi: float, tol: float, per_round: int) -> None:
    """Refuse bounds the search cannot use, naming the option."""
    for name, value in (("--lo", lo), ("--hi", hi), ("--tol", tol)):
        if not (math.isfinite(value) and value > 0):
            raise SearchError(f"{name}: must be a positive number, got {value}")
    if rounded(lo) >= rounded(hi):
        raise SearchError(f"--lo: {lo} must be below --hi {hi}")
    if per_round < 1:
        raise SearchError(f"--per-round: must be at least 1, got {per_round}")


def capacity_search(
    evaluate: Evaluate, lo: float, hi: float, tol: float, per_round: int = 1
) -> SearchResult:
    """Search ``[lo, hi]`` for the capacity (see the module docstring); ``evaluate``
    runs each round's scales."""
    check_bounds(lo, hi, tol, per_round)
    lo, hi = rounded(lo), rounded(hi)
    met: dict[float, Probe] = {}
    scales = [lo, hi, *between(lo, hi, per_round - 2)]
    round_ = 0
    while True:
        outcomes = evaluate(scales, round_)
        for scale, ok in zip(scales, outcomes, strict=True):
            met[scale] = Probe(scale, bool(ok), round_)
        probes = tuple(sorted(met.values(), key=lambda p: p.scale))
        if not met[lo].met:
            return SearchResult(None, "below-lo", None, probes, _notes(probes))
        failed = [p.scale for p in probes if not p.met]
        if not failed:
            return SearchResult(hi, "above-hi", None, probes, _notes(probes))
        high = failed[0]
        low = max(p.scale for p in probes if p.met and p.scale < high)
        scales = [s for s in between(low, high, per_round) if s not in met]
        if high / low <= 1 + tol or not scales:
            return SearchResult(low, "found", (low, high), probes, _notes(probes))
        round_ += 1


def _notes(probes: Sequence[Probe]) -> tuple[str, ...]:
    """A note for every scale that met the SLOs above one that did not."""
    failed = [p.scale for p in probes if not p.met]
    if not failed:
        return ()
    return tuple(
        f"scale {p.scale:g} met the SLOs though {failed[0]:g} did not (not monotone)"
        for p in probes
        if p.met and p.scale > failed[0]
    )
