"""The graph-size optimizer's 1-D problem and its exact solver, the interval DP.

**The 1-D problem.** Every step that replays a graph (which ones do, and how:
:mod:`stepplan.planner.buckets`) has a *demand* ``d`` on the one size axis (``need``
for a uniform step, its token count for a mixed one) and a *weight* ``u`` (padded
tokens per unit of size: ``Q``, ``1``, ``1``). A list ``S`` pads it by
``u * (min{s in S : s >= d} - d)`` tokens, plus, for a spec step whose rows carry fewer
than ``Q`` tokens, ``u * d - tokens``, which no list changes. The optimizer takes the
steps a reference list covers (those that replay a graph under it), keeps that list's
largest size ``M`` and largest row size ``R`` (so exactly the same steps replay a graph,
and the same still run eagerly) and, for a budget of ``N`` sizes, minimizes the total
padded tokens over the covered steps. It never places a size in ``(R, max_num_seqs]``:
there it would become a row size and let uniform steps beyond ``R`` replay a graph,
changing which steps are covered. Padded *rows* of mixed graphs are not part of the
objective (it counts tokens).

**Why the dynamic program is exact.** Moving any size of an optimal list down
to the largest demand it serves (or to ``max_num_seqs + 1`` when that demand is
in the excluded range) keeps every step fitting and pads no more; a size that
serves nothing can be dropped. So sizes at observed demands, the forced sizes
and ``max_num_seqs + 1`` suffice, and over those candidates the classic
interval DP (``f[k][j]``: least padding of the demands up to candidate ``j``
with ``k`` sizes, the last at ``j``) finds the optimum, in
``O(N * m^2)`` for ``m`` candidates.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stepplan.planner.buckets import smallest_at_least


class BucketError(ValueError):
    """Input the optimizer cannot use, saying which and why."""


def sorted_sizes(sizes: Sequence[int]) -> np.ndarray:
    """``[N], int64``: ``sizes`` ascending, each once; :class:`BucketError` unless all are
    positive and there is one at least."""
    array = np.array(sorted({int(s) for s in sizes}), dtype=np.int64)
    if array.size == 0 or array[0] < 1:
        raise BucketError(f"graph sizes must be positive integers, at least one; got {sizes}")
    return array


def padded_cost(values: np.ndarray, weights: np.ndarray, sizes: Sequence[int]) -> float:
    """The objective: ``sum(weights * (smallest size >= value - value))``.

    ``values`` and ``weights`` are ``[n]`` (int64 and float64); every value
    must fit the largest size.
    """
    array = sorted_sizes(sizes)
    values = np.asarray(values, dtype=np.int64)
    if values.size and values.max() > array[-1]:
        raise BucketError(f"demand {values.max()} exceeds the largest size {array[-1]}")
    buckets = smallest_at_least(array, values)
    return float((np.asarray(weights, dtype=np.float64) * (buckets - values)).sum())


def optimal_sizes(
    values: np.ndarray,
    weights: np.ndarray,
    *,
    max_graphs: int,
    forced: Sequence[int],
    forbidden: tuple[int, int] | None = None,
) -> tuple[int, ...]:
    """The size list of at most ``max_graphs`` sizes with the least :func:`padded_cost`.

    Args:
        values: ``[n], int`` demands (each ``1 <= v <= max(forced)``).
        weights: ``[n], int or float`` padded tokens per unit of size, ``>= 0``.
        max_graphs: the budget of sizes.
        forced: sizes the list must hold (its largest is the list's largest).
        forbidden: ``(lo, hi)``: no size in ``(lo, hi]``.

    Returns the sizes ascending; among lists of equal cost, the one with the
    fewest sizes.
    """
    values, weights = _check_problem(values, weights, max_graphs, forced, forbidden)
    candidates = _candidates(values, forced, forbidden)
    allowed = np.ones(candidates.size, dtype=bool)
    if forbidden is not None:
        allowed &= (candidates <= forbidden[0]) | (candidates > forbidden[1])
    index = np.searchsorted(candidates, values)
    candidate_weights = np.bincount(index, weights, minlength=candidates.size)
    is_forced = np.isin(candidates, np.asarray(forced, dtype=np.int64))
    ends = _solve(candidates, candidate_weights, allowed, is_forced, max_graphs)
    return tuple(int(candidates[j]) for j in ends)


def _check_problem(
    values: np.ndarray,
    weights: np.ndarray,
    max_graphs: int,
    forced: Sequence[int],
    forbidden: tuple[int, int] | None,
) -> tuple[np.ndarray, np.ndarray]:
    values = np.asarray(values, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float64)
    if values.shape != weights.shape or values.ndim != 1:
        raise BucketError(f"values {values.shape} and weights {weights.shape} must be equal 1-D")
    if not forced or min(forced) < 1:
        raise BucketError(f"forced sizes must be positive, at least one; got {tuple(forced)}")
    if len(set(forced)) > max_graphs:
        raise BucketError(f"max_graphs={max_graphs} cannot hold the forced sizes {tuple(forced)}")
    if values.size and (values.min() < 1 or values.max() > max(forced)):
        raise BucketError(
            f"demands must lie in 1..{max(forced)}, got {values.min()}..{values.max()}"
        )
    if (weights < 0).any():
        raise BucketError("weights must be >= 0")
    if forbidden is not None and any(forbidden[0] < f <= forbidden[1] for f in forced):
        raise BucketError(f"a forced size lies in the forbidden range {forbidden}")
    return values, weights


def _candidates(
    values: np.ndarray, forced: Sequence[int], forbidden: tuple[int, int] | None
) -> np.ndarray:
    extra = list(forced)
    if forbidden is not None and forbidden[1] + 1 <= max(forced):
        extra.append(forbidden[1] + 1)  # the lowest size above the forbidden range
    return np.unique(np.concatenate([values, np.asarray(extra, dtype=np.int64)]))


def _solve(
    candidates: np.ndarray,
    weights: np.ndarray,
    allowed: np.ndarray,
    is_forced: np.ndarray,
    max_graphs: int,
) -> list[int]:
    """Indices of the candidates chosen as sizes (the interval DP, 1-based inside)."""
    m = candidates.size
    budget = min(max_graphs, m)
    count = np.concatenate([[0.0], np.cumsum(weights)])  # weight of candidates 1..j
    mass = np.concatenate([[0.0], np.cumsum(weights * candidates)])
    size = np.concatenate([[0], candidates])
    best = np.full((budget + 1, m + 1), np.inf)
    parent = np.zeros((budget + 1, m + 1), dtype=np.int64)
    best[0, 0] = 0.0
    last_forced = 0  # a segment (i, j] may not pass over a forced candidate
    for j in range(1, m + 1):
        if allowed[j - 1]:
            starts = np.arange(last_forced, j)
            cost = size[j] * (count[j] - count[starts]) - (mass[j] - mass[starts])
            total = best[:budget, last_forced:j] + cost
            pick = np.argmin(total, axis=1)
            best[1:, j] = total[np.arange(budget), pick]
            parent[1:, j] = last_forced + pick
        if is_forced[j - 1]:
            last_forced = j
    k = int(np.argmin(best[:, m]))
    ends, j = [], m
    while j > 0:
        ends.append(j - 1)
        j, k = int(parent[k, j]), k - 1
    return ends[::-1]
