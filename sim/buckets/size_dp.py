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

import attrs
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


# --- The time objective ---------------------------------------------------------------
#
# Each step of a workload belongs to a graph *kind* (spec, decode or mixed graphs: an
# index into the problem's rows) and has a demand on the size axis; under a list ``S``
# it replays the kind's graph at ``s = min{s in S : s >= demand}`` and costs that
# graph's time, or runs eagerly at its own eager time when no size holds it. The cost
# stays separable by the smallest size holding a step, so the interval DP above solves it
# exactly once the segment cost ``(c_i, c_j]`` is the graphs' time at ``c_j`` of the steps
# whose demand lies there, and the steps above the list's largest size add their eager
# time. When every kind's graph time and memory grow with the size, sizes at demands (and
# the forced ones) suffice, as for padding; otherwise every integer size is a candidate.


@attrs.frozen(eq=False)
class TimeProblem:
    """The graph-size problem with step time as the objective (see the comment above).

    Attributes:
        candidates: ``[m], int64`` ascending sizes a list may hold.
        kind: ``[n], int64`` each step entry's graph kind (row of ``graph_us``), ``-1``
            for a step no list gives a graph.
        demand: ``[n], int64`` the size each entry needs (``<= candidates[-1]`` or it
            always runs eagerly).
        count: ``[n], float64`` steps each entry stands for.
        unit: ``[n], float64`` padded tokens per unit of size above the demand.
        eager_us: ``[n], float64`` one step's eager time.
        graph_us: ``[K, m], float64`` one replay of kind ``k``'s graph at ``candidates[j]``.
        memory_mib: ``[m], float64`` graph memory a list holding ``candidates[j]`` adds.
        allowed: ``[m], bool`` candidates a list may hold.
        forced: ``[m], bool`` candidates every list must hold.
    """

    candidates: np.ndarray
    kind: np.ndarray
    demand: np.ndarray
    count: np.ndarray
    unit: np.ndarray
    eager_us: np.ndarray
    graph_us: np.ndarray
    memory_mib: np.ndarray
    allowed: np.ndarray
    forced: np.ndarray

    def step_times(self, sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``([n], [n])`` float64: each entry's time (µs per step) and padded tokens per step
        under ``sizes`` (each a candidate)."""
        chosen = np.asarray(sorted(int(s) for s in sizes), dtype=np.int64)
        held = smallest_at_least(chosen, self.demand)
        graph = (held > 0) & (self.kind >= 0)
        at = np.searchsorted(self.candidates, np.where(graph, held, self.candidates[0]))
        times = self.eager_us.copy()
        times[graph] = self.graph_us[self.kind[graph], at[graph]]
        padded = np.where(graph, (held - self.demand) * self.unit, 0.0)
        return times, padded

    def memory_of(self, sizes: Sequence[int]) -> float:
        """Graph memory (MiB) of a list of candidate sizes."""
        index = np.searchsorted(self.candidates, np.asarray(sorted(sizes), dtype=np.int64))
        return float(self.memory_mib[index].sum())


def fastest_sizes(
    problem: TimeProblem, *, max_graphs: int, memory_weight: float = 0.0
) -> tuple[int, ...]:
    """The list of 1 to ``max_graphs`` candidate sizes (the forced ones among them) with
    the least total step time plus ``memory_weight`` (µs per MiB) times its graph memory;
    among equal times, the least padded tokens, then the fewest sizes. Exact."""
    if max_graphs < max(1, int(problem.forced.sum())):
        raise BucketError(f"max_graphs={max_graphs} cannot hold the forced sizes")
    totals = _time_totals(problem, problem.eager_us, problem.graph_us)
    return _solve_time(problem, totals, max_graphs, memory_weight)


def percentile_sizes(
    problem: TimeProblem, *, max_graphs: int, percentile: float, memory_weight: float = 0.0
) -> tuple[int, ...]:
    """The list whose ``percentile`` (0-100) of step time is least: the smallest step time
    ``t`` for which some list leaves at most ``(1 - percentile / 100)`` of the steps slower
    than ``t`` (a bisection over the times a step can take, each an exact DP counting the
    slower steps, ties broken by the least total time). Step counts must be whole."""
    (sizes,) = percentile_sizes_batch(
        [problem], max_graphs=max_graphs, percentile=percentile, memory_weight=memory_weight
    )
    if sizes is None:
        raise BucketError("no size list of the budget gives every forced size a graph")
    return sizes


def percentile_sizes_batch(
    problems: Sequence[TimeProblem],
    *,
    max_graphs: int,
    percentile: float,
    memory_weight: float = 0.0,
) -> list[tuple[int, ...] | None]:
    """:func:`percentile_sizes` of several problems on the same candidates, their
    bisections in step (one DP pass per round over the problems still searching)."""
    if not 0.0 < percentile <= 100.0:
        raise BucketError(f"percentile must lie in (0, 100], got {percentile}")
    if not problems:
        return []
    _check_batch(problems, max_graphs)
    used = np.unique(np.concatenate([p.kind[p.kind >= 0] for p in problems]))
    times = [p.eager_us for p in problems] + [problems[0].graph_us[used].ravel()]
    values = np.unique(np.concatenate(times))
    values = values[np.isfinite(values)]
    top = max(float(values[-1]), 1.0) if values.size else 1.0
    low = np.zeros(len(problems), dtype=np.int64)
    high = np.full(len(problems), values.size - 1, dtype=np.int64)
    best: list[tuple[int, ...] | None] = [None] * len(problems)
    while (searching := np.flatnonzero(low <= high)).size:
        middle = (low[searching] + high[searching]) // 2
        every, graph_costs = [], []
        for b, at in zip(searching.tolist(), middle.tolist(), strict=True):
            problem, limit = problems[b], values[at]
            # Steps over the limit count whole; the total time, scaled below one step,
            # breaks ties among the lists with the fewest (whole counts keep the order).
            scale = 4.0 * max(float(problem.count.sum()), 1.0) * top
            eager = (problem.eager_us > limit) + np.minimum(problem.eager_us, top) / scale
            graph = (problem.graph_us > limit) + np.minimum(problem.graph_us, top) / scale
            every.append(_time_totals(problem, eager, graph))
            graph_costs.append(graph)
        found = _solve_batch(
            problems[0].candidates,
            _stacked(every, np.stack(graph_costs)),
            *(np.stack([getattr(problems[b], n) for b in searching]) for n in _PER_PROBLEM),
            max_graphs,
            memory_weight,
        )
        for b, at, sizes in zip(searching.tolist(), middle.tolist(), found, strict=True):
            problem, limit = problems[b], values[at]
            slower = np.inf
            if sizes is not None:
                step, _ = problem.step_times(sizes)
                slower = float(problem.count[step > limit].sum())
            allowance = problem.count.sum() * (1.0 - percentile / 100.0) + 1e-9
            if slower <= allowance:
                best[b], high[b] = sizes, at - 1
            else:
                low[b] = at + 1
    return best


#: The fields of a batch's problems that differ from problem to problem, as the DP reads them.
_PER_PROBLEM = ("memory_mib", "allowed", "forced")


def _check_batch(problems: Sequence[TimeProblem], max_graphs: int) -> None:
    first = problems[0]
    for p in problems:
        if p.candidates.size != first.candidates.size or (p.candidates != first.candidates).any():
            raise BucketError("a batch of problems must share its candidates")
        if max_graphs < max(1, int(p.forced.sum())):
            raise BucketError(f"max_graphs={max_graphs} cannot hold the forced sizes")


def _stacked(every: Sequence[_Totals], graph_cost: np.ndarray) -> _Totals:
    """The problems' totals along a leading ``[B]`` axis; ``graph_cost`` ``[K, m]`` shared
    or ``[B, K, m]``."""
    fields = [np.stack([attrs.astuple(t, recurse=False)[i] for t in every]) for i in range(4)]
    return _Totals(*fields, graph_cost)


def fastest_sizes_batch(
    problems: Sequence[TimeProblem], *, max_graphs: int, memory_weight: float = 0.0
) -> list[tuple[int, ...] | None]:
    """:func:`fastest_sizes` of several problems on the same candidates and graph times
    (one DP pass over all), ``None`` for a problem no list of the budget solves."""
    if not problems:
        return []
    _check_batch(problems, max_graphs)
    every = [_time_totals(p, p.eager_us, p.graph_us) for p in problems]
    return _solve_batch(
        problems[0].candidates,
        _stacked(every, problems[0].graph_us),
        *(np.stack([getattr(p, n) for p in problems]) for n in _PER_PROBLEM),
        max_graphs,
        memory_weight,
    )


@attrs.frozen(eq=False)
class _Totals:
    """What the DP reads, for costs ``eager_cost`` ``[n]`` and ``graph_cost`` ``[K, m]``:
    per kind, the steps and their padding weight and mass at candidates ``1..j``
    (``[K, m + 1]`` prefix sums), and the eager cost of the steps above candidate ``j``
    (``[m + 1]``; ``j = 0``: every step)."""

    steps: np.ndarray
    weight: np.ndarray
    mass: np.ndarray
    eager_above: np.ndarray
    graph_cost: np.ndarray


def _time_totals(problem: TimeProblem, eager_cost: np.ndarray, graph_cost: np.ndarray) -> _Totals:
    m, kinds = problem.candidates.size, problem.graph_us.shape[0]
    graph = problem.kind >= 0
    at = np.searchsorted(problem.candidates, problem.demand)  # m: above every candidate
    where = (problem.kind[graph], at[graph])
    sums = np.zeros((3, kinds, m + 1))
    count, weight = problem.count[graph], (problem.count * problem.unit)[graph]
    for row, values in enumerate((count, weight, weight * problem.demand[graph])):
        np.add.at(sums[row], where, values)
    prefix = np.concatenate([np.zeros((3, kinds, 1)), np.cumsum(sums[:, :, :m], axis=2)], axis=2)
    eager = np.zeros(m + 1)
    np.add.at(eager, at[graph], (problem.count * eager_cost)[graph])
    never = float((problem.count * eager_cost)[~graph].sum())  # eager under every list
    above = np.cumsum(eager[::-1])[::-1] + never  # [j]: the steps above candidate j
    return _Totals(*prefix, above, np.asarray(graph_cost, dtype=np.float64))


def _solve_time(
    problem: TimeProblem, totals: _Totals, max_graphs: int, memory_weight: float
) -> tuple[int, ...]:
    """The best list of one problem (:func:`_solve_batch` of one)."""
    stacked = _Totals(
        *(a[None] for a in attrs.astuple(totals, recurse=False)[:4]), totals.graph_cost
    )
    memory, allowed, forced = (
        a[None] for a in (problem.memory_mib, problem.allowed, problem.forced)
    )
    (sizes,) = _solve_batch(
        problem.candidates, stacked, memory, allowed, forced, max_graphs, memory_weight
    )
    if sizes is None:
        raise BucketError("no size list of the budget gives every forced size a graph")
    return sizes


def _solve_batch(
    candidates: np.ndarray,
    totals: _Totals,
    memory: np.ndarray,
    allowed: np.ndarray,
    forced: np.ndarray,
    max_graphs: int,
    memory_weight: float,
) -> list[tuple[int, ...] | None]:
    """The interval DP over ``(cost, padded tokens)`` in that order, for ``B`` problems on
    the same candidates and graph costs at once (``totals``' arrays and ``memory``,
    ``allowed``, ``forced`` with a leading ``[B]`` axis). 1-based inside: ``best[b, :, k,
    j]``, ``k`` sizes, the last at candidate ``j``. ``None`` for a problem no list of the
    budget solves."""
    m, batch = candidates.size, memory.shape[0]
    budget = min(max_graphs, m)
    best = np.full((batch, 2, budget + 1, m + 1), np.inf)  # [:, 0]: cost, [:, 1]: padding
    best[:, :, 0, 0] = 0.0
    parent = np.zeros((batch, budget + 1, m + 1), dtype=np.int64)
    last_forced = np.zeros(batch, dtype=np.int64)  # a segment may not pass over one
    for j in range(1, m + 1):
        active = allowed[:, j - 1]
        if active.any():
            served = totals.steps[:, :, j, None] - totals.steps[:, :, :j]  # [B, K, starts]
            cost = np.broadcast_to(totals.graph_cost[..., j - 1], served.shape[:2])[:, :, None]
            # a kind with no step here adds nothing, even at an uncapturable (inf) size
            time = np.multiply(served, cost, out=np.zeros_like(served), where=served > 0)
            time = time.sum(axis=1) + memory_weight * memory[:, j - 1, None]
            weight = totals.weight[:, :, j, None] - totals.weight[:, :, :j]
            mass = totals.mass[:, :, j, None] - totals.mass[:, :, :j]
            padded = (candidates[j - 1] * weight - mass).sum(axis=1)
            total = best[:, :, :budget, :j] + np.stack([time, padded], axis=1)[:, :, None, :]
            passing = np.arange(j)[None, :] < last_forced[:, None]  # [B, starts]
            total[np.broadcast_to(passing[:, None, None, :], total.shape)] = np.inf
            pick = _first_least(total[:, 0], total[:, 1], axis=2)  # [B, budget]
            chosen = np.take_along_axis(total, pick[:, None, :, None], axis=3)[..., 0]
            best[active, :, 1:, j] = chosen[active]
            parent[active, 1:, j] = pick[active]
        last_forced = np.where(forced[:, j - 1], j, last_forced)
    results: list[tuple[int, ...] | None] = []
    for b in range(batch):
        final = best[b].copy()
        final[0] += totals.eager_above[b][None, :]
        final[:, :, : max(1, int(last_forced[b]))] = np.inf  # one size at least, forced held
        flat = final.reshape(2, -1)  # k-major: among full ties, the fewest sizes
        choice = int(_first_least(flat[0], flat[1], axis=0))
        if not np.isfinite(flat[0, choice]):
            results.append(None)
            continue
        k, j = divmod(choice, m + 1)
        ends = []
        while j > 0:
            ends.append(j - 1)
            j, k = int(parent[b, k, j]), k - 1
        results.append(tuple(int(candidates[e]) for e in ends[::-1]))
    return results


def _first_least(cost: np.ndarray, second: np.ndarray, axis: int) -> np.ndarray:
    """Index along ``axis`` of the least ``cost``, ties broken by the least ``second``
    (then the first)."""
    least = cost.min(axis=axis, keepdims=True)
    tied = cost <= least + 1e-9 * np.abs(least) + 1e-12
    tied |= ~np.isfinite(least)
    return np.argmin(np.where(tied, second, np.inf), axis=axis)
