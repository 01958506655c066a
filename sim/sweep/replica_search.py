"""The fewest replicas that meet the SLOs at a given request rate
(``stepplan capacity --find replicas``).

More replicas behind a router take load off each, so the search assumes a count that
meets the SLOs is followed by counts that meet them too: it doubles from 1 until a
count meets them (or ``most`` fails), then narrows the bracket ``(failed, met)``; each
round runs up to ``per_round`` counts (in parallel, as points of a sweep). A count that
meets the SLOs below one that fails is noted (not monotone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from .search import Probe, SearchError

#: Runs one round's replica counts, saying which met the SLOs.
Evaluate = Callable[[Sequence[int], int], Sequence[bool]]


@attrs.frozen
class ReplicaResult:
    """What the search found.

    Attributes:
        answer: the fewest replicas that met the SLOs (``None``: not even ``most``).
        status: ``found`` or ``above-most`` (``most`` replicas failed).
        probes: every count run (``Probe.scale`` holds the count), by count.
        notes: where the runs were not monotone in the count.
    """

    answer: int | None
    status: str
    probes: tuple[Probe, ...]
    notes: tuple[str, ...] = ()

    @property
    def rounds(self) -> int:
        """Rounds the search ran."""
        return 1 + max((probe.round for probe in self.probes), default=-1)


def check_most(most: int, per_round: int) -> None:
    """Refuse bounds the search cannot use, naming the option."""
    if most < 1:
        raise SearchError(f"--max-replicas: must be at least 1, got {most}")
    if per_round < 1:
        raise SearchError(f"--per-round: must be at least 1, got {per_round}")


def _inside(low: int, high: int, count: int) -> list[int]:
    """Up to ``count`` integers evenly spread strictly inside ``(low, high)``."""
    step = (high - low) / (count + 1)
    return sorted({round(low + step * i) for i in range(1, count + 1)} - {low, high})


def replica_search(evaluate: Evaluate, most: int, per_round: int = 1) -> ReplicaResult:
    """The fewest replicas in ``[1, most]`` that meet the SLOs (module docstring)."""
    check_most(most, per_round)
    runs: dict[int, Probe] = {}
    round_, failed, met = 0, 0, None
    while True:
        if met is None:  # doubling: 1, 2, 4, ... (``most`` last)
            counts, count = [], max(1, 2 * failed)
            while len(counts) < per_round and (not counts or counts[-1] < most):
                counts.append(min(count, most))
                count *= 2
        else:
            counts = _inside(failed, met, per_round)
        counts = [c for c in counts if c not in runs]
        if not counts:
            break
        for count, ok in zip(counts, evaluate(counts, round_), strict=True):
            runs[count] = Probe(count, bool(ok), round_)
        passing = [c for c, p in runs.items() if p.met]
        met = min(passing) if passing else None
        failed = max(
            (c for c, p in runs.items() if not p.met and (met is None or c < met)), default=0
        )
        if met is None and most in runs:
            break
        if met is not None and met - failed <= 1:
            break
        round_ += 1
    probes = tuple(sorted(runs.values(), key=lambda p: p.scale))
    notes = tuple(
        f"{int(p.scale)} replicas met the SLOs though {int(q.scale)} did not (not monotone)"
        for p in probes
        for q in probes
        if p.met and not q.met and q.scale > p.scale
    )
    if met is None:
        return ReplicaResult(None, "above-most", probes, notes)
    return ReplicaResult(met, "found", probes, notes)
