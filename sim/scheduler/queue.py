"""The waiting queue of an admission policy that is not arrival order (``sim/admission.py``):
the requests that arrived and were never admitted, in the policy's order, with the age
limit's exception. The compiled stepper (``sim/csrc/queue.c``) runs the same on the same
arrays; this is its specification.

The queue is a binary min-heap of request ids by rank (``admission_rank``). An admitted
request is not taken out of the heap at once (the age limit may admit one from its
middle): it is dropped when it comes to the top. Requests enter as they arrive, in
arrival order.
"""

from __future__ import annotations

import numpy as np

from .state import ADMITTED, NEXT_ADMIT, PUSHED, QUEUED


class WaitingQueue:
    """New requests waiting, in a policy's order.

    Attributes:
        arrival: ``[N], float64`` arrival times (sorted).
        rank: ``[N], int64`` each request's place in the policy's order.
        age_limit_s: a request that has waited longer goes first (``inf``: never).
        heap: ``[N], int64`` request ids; the first ``counters[QUEUED]`` are the heap.
        admitted: ``[N], uint8`` 1 once a request was admitted.
        counters: the scheduler's ``[NUM_COUNTERS], int64`` scalars: ``NEXT_ADMIT`` is the
            oldest request never admitted, ``PUSHED`` the requests that entered the heap
            (the first ``PUSHED`` by arrival), ``QUEUED`` the heap's size.
    """

    def __init__(
        self, arrival: np.ndarray, rank: np.ndarray, age_limit_s: float, counters: np.ndarray
    ) -> None:
        n = arrival.shape[0]
        self.arrival, self.rank, self.age_limit_s = arrival, rank, age_limit_s
        self.heap = np.zeros(max(1, n), np.int64)
        self.admitted = np.zeros(max(1, n), np.uint8)
        self.counters = counters

    def first(self, now_s: float, arrived: int) -> int:
        """The request to admit next at ``now_s`` among the first ``arrived``: the oldest
        when it has waited longer than the age limit, else the heap's top; -1: none."""
        counters = self.counters
        for request in range(int(counters[PUSHED]), arrived):
            self._push(request)
        counters[PUSHED] = max(int(counters[PUSHED]), arrived)
        oldest = self.oldest(arrived)
        if oldest < arrived and now_s - float(self.arrival[oldest]) > self.age_limit_s:
            return oldest
        while counters[QUEUED] and self.admitted[self.heap[0]]:
            self._pop()
        return int(self.heap[0]) if counters[QUEUED] else -1

    def oldest(self, end: int) -> int:
        """The first request never admitted, or ``end`` when all before it were."""
        counters = self.counters
        first = int(counters[NEXT_ADMIT])
        while first < end and self.admitted[first]:
            first += 1
        counters[NEXT_ADMIT] = first
        return first

    def take(self, request: int) -> None:
        """Mark ``request`` admitted."""
        self.admitted[request] = 1
        self.counters[ADMITTED] += 1

    def _before(self, a: int, b: int) -> bool:
        return bool(self.rank[self.heap[a]] < self.rank[self.heap[b]])

    def _swap(self, a: int, b: int) -> None:
        heap = self.heap
        heap[a], heap[b] = heap[b], heap[a]

    def _push(self, request: int) -> None:
        index = int(self.counters[QUEUED])
        self.heap[index] = request
        self.counters[QUEUED] = index + 1
        while index > 0 and self._before(index, (index - 1) // 2):
            self._swap(index, (index - 1) // 2)
            index = (index - 1) // 2

    def _pop(self) -> None:
        size = int(self.counters[QUEUED]) - 1
        self.heap[0] = self.heap[size]
        self.counters[QUEUED] = size
        index = 0
        while True:
            smallest = index
            for child in (2 * index + 1, 2 * index + 2):
                if child < size and self._before(child, smallest):
                    smallest = child
            if smallest == index:
                return
            self._swap(index, smallest)
            index = smallest
