"""Routers: which replica an arriving request goes to. One entry of :data:`TABLE` each.

A router sees every replica as a :class:`ReplicaView` at the request's arrival time
(steps that end later are still in flight: their requests still count) and answers a
replica's index. Ties go to the lowest index, so equal inputs route equally. A router is
made fresh for each run (:meth:`RouterEntry.make`): its state (a turn, a random
generator) belongs to that run alone.

To add a router: a class with ``choose`` (and ``moved`` when it has a reason to leave
the least loaded replica), and one :class:`RouterEntry` in :data:`TABLE`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
import numpy as np


class ReplicaView(Protocol):
    """What a router reads of a replica (``deployment/replica.py``)."""

    @property
    def outstanding(self) -> int:
        """Requests routed to it and not finished."""

    @property
    def kv_usage(self) -> float:
        """Share of its KV blocks held by running requests (0 without a memory model)."""

    def cached_prefix(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes`` (a prompt's block hashes, in order) its prefix cache
        holds as a leading run."""

    def predicted_wait_s(self, now_s: float) -> float:
        """Seconds a request arriving at ``now_s`` would wait before its prefill starts."""


@attrs.frozen(eq=False)
class RouterSetup:
    """What a router may know of the run before it starts.

    Attributes:
        replicas: how many replicas there are.
        seed: the run's seed (``SimConfig.seed``).
        prefix_offsets: ``[N + 1], int64`` offsets into ``prefix_blocks``, or ``None``.
        prefix_blocks: ``[sum], int64`` every request's prompt block hashes, or ``None``.
    """

    replicas: int
    seed: int = 0
    prefix_offsets: np.ndarray | None = None
    prefix_blocks: np.ndarray | None = None


class Router(Protocol):
    """Picks a replica for each arriving request."""

    #: Requests sent elsewhere than the least loaded replica for a cached prefix.
    moved: int

    def choose(self, request: int, replicas: Sequence[ReplicaView], now_s: float) -> int:
        """The index of the replica request ``request`` (its trace row) goes to."""


def _least(loads: Sequence[float]) -> int:
    """The index of the smallest load, the lowest index among equals."""
    best = 0
    for index in range(1, len(loads)):
        if loads[index] < loads[best]:
            best = index
    return best


class RoundRobin:
    """Replica 0, 1, ..., N - 1, 0, ... in arrival order, whatever their load."""

    def __init__(self, setup: RouterSetup) -> None:
        self._count, self._turn, self.moved = setup.replicas, 0, 0

    def choose(self, request: int, replicas: Sequence[ReplicaView], now_s: float) -> int:
        turn = self._turn
        self._turn = (turn + 1) % self._count
        return turn


class SeededRandom:
    """A uniform draw per request from a generator seeded with the run's seed."""

    def __init__(self, setup: RouterSetup) -> None:
        self._count, self.moved = setup.replicas, 0
        self._draws = np.random.default_rng(setup.seed)

    def choose(self, request: int, replicas: Sequence[ReplicaView], now_s: float) -> int:
        return int(self._draws.integers(self._count))


class LeastOutstanding:
    """The replica with the fewest requests routed to it and not finished."""

    def __init__(self, setup: RouterSetup) -> None:
        self.moved = 0

    def choose(self, request: int, replicas: Sequence[ReplicaView], now_s: float) -> int:
        return _least([replica.outstanding for replica in replicas])


class LeastKvUsage:
    """The replica whose running requests hold the smallest share of its KV blocks
    (fewest outstanding requests among equals)."""

    def __init__(self, setup: RouterSetup) -> None:
        self.moved = 0

    def choose(self, request: int, replicas: Sequence[ReplicaView], now_s: float) -> int:
        return _least([(r.kv_usage, r.outstanding) for r in replicas])  # type: ignore[misc]


class PrefixAware:
    """The replica whose prefix cache holds the longest leading run of the request's
    block hashes; among equal runs the fewest outstanding requests (llm-d's prefix
    scorer, with the load as its tie-break). Without hashes: least outstanding."""

    def __init__(self, setup: RouterSetup) -> None:
        self._offsets, self._blocks, self.moved = setup.prefix_offsets, setup.prefix_blocks, 0

    def choose(self, request: int, replicas: Sequence[ReplicaView], now_s: float) -> int:
        loads = [replica.outstanding for replica in replicas]
        least = _least(loads)
        if self._offsets is None or self._blocks is None:
            return least
        start, stop = int(self._offsets[request]), int(self._offsets[request + 1])
        hashes = self._blocks[start:stop].tolist()
        if not hashes:
            return least
        scores = [
            (-replica.cached_prefix(hashes), load)
            for replica, load in zip(replicas, loads, strict=True)
        ]
        chosen = _least(scores)  # type: ignore[arg-type]
        if chosen != least:  # only a strictly longer cached prefix outweighs the load
            self.moved += 1
        return chosen


class LeastPredictedWait:
    """The replica where the request would start soonest: what is left of its step in
    flight plus its queue's prompt tokens at the cost model's full-prefill rate (fewest
    outstanding requests among equals)."""

    def __init__(self, setup: RouterSetup) -> None:
        self.moved = 0

    def choose(self, request: int, replicas: Sequence[ReplicaView], now_s: float) -> int:
        return _least([(r.predicted_wait_s(now_s), r.outstanding) for r in replicas])  # type: ignore[misc]


@attrs.frozen
class RouterEntry:
    """One router: its name (``deployment.router``), what it does, and its maker."""

    name: str
    description: str
    make: Callable[[RouterSetup], Router]


TABLE: tuple[RouterEntry, ...] = (
    RouterEntry("round-robin", "each replica in turn", RoundRobin),
    RouterEntry("random", "a uniform draw seeded with the run's seed", SeededRandom),
    RouterEntry("least-outstanding", "fewest requests routed and not finished", LeastOutstanding),
    RouterEntry("least-kv", "smallest share of KV blocks in use", LeastKvUsage),
    RouterEntry(
        "prefix-aware", "longest cached prefix of the prompt's hashes, then load", PrefixAware
    ),
    RouterEntry("least-wait", "shortest predicted wait (queue and cost model)", LeastPredictedWait),
)
ROUTER_NAMES: tuple[str, ...] = tuple(entry.name for entry in TABLE)
BY_NAME: dict[str, RouterEntry] = {entry.name: entry for entry in TABLE}


def make_router(name: str, setup: RouterSetup) -> Router:
    """A fresh router of the registered ``name`` for one run."""
    return BY_NAME[name].make(setup)
