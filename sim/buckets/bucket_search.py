"""The search for the fastest CUDA-graph size list: the objective (total or a percentile of
step time), every largest row size tried, the graph memory budget, and the front of time
against memory. The step times it weighs: :mod:`stepplan.sim.buckets.bucket_time`; the exact DP
for one largest row size: :mod:`stepplan.sim.buckets.size_dp`.

A memory budget is met through a weight on memory (µs per MiB): for each weight the DP
finds the exact optimum of time plus weight times memory, a vertex of the convex hull of
the time-memory front; a bisection on the weight finds the least one whose list fits,
and the best list seen that fits (the reference lists included) is kept. A list inside
the hull (between two vertices) can be missed, so under a budget the list is the best
of those vertices, never over the budget.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from .bucket_time import (
    ListPrediction,
    SizeCosts,
    demand_points,
    on_demand_points,
    predict,
    restricted,
    time_problem,
)
from .demand import BucketError, StepDemand, sorted_sizes
from .size_dp import (
    fastest_sizes_batch,
    percentile_sizes_batch,
)


@attrs.frozen
class Objective:
    """What the optimizer minimizes: the total step time, or a percentile of step time.

    Attributes:
        percentile: ``None`` for the total, else in ``(0, 100]``.
    """

    percentile: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.percentile is not None and not 0.0 < self.percentile <= 100.0:
            raise BucketError(f"--percentile must lie in (0, 100], got {self.percentile}")

    @property
    def name(self) -> str:
        """How the table names it."""
        if self.percentile is None:
            return "total step time"
        return f"p{self.percentile:g} step time"

    def of(self, prediction: ListPrediction, counts: np.ndarray) -> float:
        """The objective's value for one list (s for the total, µs for a percentile)."""
        if self.percentile is None:
            return prediction.total_s
        order = np.argsort(prediction.step_us, kind="stable")
        reached = np.cumsum(counts[order])
        at = np.searchsorted(reached, reached[-1] * self.percentile / 100.0 - 1e-9)
        return float(prediction.step_us[order][min(at, order.size - 1)])


#: The default objective: the total step time.
TOTAL = Objective()


def _largest_rows(
    demand: StepDemand, costs: SizeCosts, references: Sequence[Sequence[int]]
) -> list[int]:
    """The largest row sizes ``R`` the search tries: one in ``full`` mode (the DP chooses
    the largest size itself), every size up to ``max_num_seqs`` in ``mixed`` mode (fewer,
    the demands and row counts, where sizes can move down to them: the module docstring
    of :mod:`.size_dp`), with the references' own always among them."""
    top = min(demand.max_num_seqs, costs.largest)
    if demand.graph_mode != "mixed":
        return [top]
    full = time_problem(demand, costs, top)
    if on_demand_points(full).candidates.size == full.candidates.size:
        tried = set(range(1, top + 1))
    else:
        points = np.concatenate([demand.need, demand.rows, demand.tokens])
        tried = {int(v) for v in points if 1 <= v <= top} | {top}
    for sizes in references:
        rows = [int(s) for s in sizes if s <= demand.max_num_seqs]
        if rows and rows[-1] <= top:
            tried.add(rows[-1])
    return sorted(tried)


def fastest_list(
    demand: StepDemand,
    costs: SizeCosts,
    *,
    max_graphs: int,
    objective: Objective = TOTAL,
    memory_weight: float = 0.0,
    references: Sequence[Sequence[int]] = (),
) -> tuple[int, ...]:
    """The best list of at most ``max_graphs`` sizes for ``objective`` plus
    ``memory_weight`` (µs per MiB) times its graph memory, over every largest row size."""
    if max_graphs < 1:
        raise BucketError(f"--max-graphs must be positive, got {max_graphs}")
    best: tuple[float, float, tuple[int, ...]] | None = None
    for sizes in _each_largest_row(demand, costs, max_graphs, objective, memory_weight, references):
        prediction = predict(demand, costs, sizes)
        value = objective.of(prediction, demand.counts) * (
            1e6 if objective.percentile is None else 1.0
        ) + memory_weight * (prediction.memory_mib or 0.0)
        key = (value, prediction.total_s)  # a percentile's ties: the least total
        if best is None or _less(key, best[:2]):
            best = (*key, sizes)
    if best is None:
        raise BucketError("no size list gives any step a graph")
    return best[2]


#: Largest row sizes solved in one DP pass (the batch's arrays grow with it).
_BATCH = 32


def _each_largest_row(
    demand: StepDemand,
    costs: SizeCosts,
    max_graphs: int,
    objective: Objective,
    memory_weight: float,
    references: Sequence[Sequence[int]],
) -> list[tuple[int, ...]]:
    """The best list for each largest row size tried (those some list solves), the
    problems a batch at a time over their common candidates."""
    problems = [time_problem(demand, costs, r) for r in _largest_rows(demand, costs, references)]
    masks = [demand_points(p) for p in problems]
    keep = None if any(m is None for m in masks) else np.logical_or.reduce(masks)
    found = []
    for start in range(0, len(problems), _BATCH):
        chunk = [restricted(p, keep) for p in problems[start : start + _BATCH]]
        if objective.percentile is None:
            lists = fastest_sizes_batch(chunk, max_graphs=max_graphs, memory_weight=memory_weight)
        else:
            lists = percentile_sizes_batch(
                chunk,
                max_graphs=max_graphs,
                percentile=objective.percentile,
                memory_weight=memory_weight,
            )
        found += [sizes for sizes in lists if sizes is not None]
    return found


def _less(key: tuple[float, float], than: tuple[float, ...]) -> bool:
    """``key`` before ``than``: a smaller first value (beyond rounding), then second."""
    tolerance = 1e-9 * abs(than[0])
    return key[0] < than[0] - tolerance or (key[0] <= than[0] + tolerance and key[1] < than[1])


def within_memory(
    demand: StepDemand,
    costs: SizeCosts,
    *,
    max_graphs: int,
    memory_mib: float,
    objective: Objective = TOTAL,
    references: Sequence[Sequence[int]] = (),
) -> tuple[int, ...]:
    """The best list found within ``memory_mib`` of graph memory: the lists the memory
    weight's bisection visits (each the exact optimum of time plus weight times memory,
    a vertex of the time-memory front's convex hull) and the reference lists that fit,
    the one of least objective. Never over the budget."""
    if costs.graph_mib is None:
        raise BucketError(f"--graph-memory needs graph memory figures: {costs.memory_missing}")
    if memory_mib <= 0:
        raise BucketError(f"--graph-memory must be positive, got {memory_mib / 1024:g} GiB")
    found: list[tuple[int, ...]] = [
        tuple(int(s) for s in sorted_sizes(r)) for r in references if len(set(r)) <= max_graphs
    ]

    def solve(weight: float) -> float:
        sizes = fastest_list(
            demand,
            costs,
            max_graphs=max_graphs,
            objective=objective,
            memory_weight=weight,
            references=references,
        )
        found.append(sizes)
        return predict(demand, costs, sizes).memory_mib or 0.0

    low, high = 0.0, 1e-3
    if solve(low) > memory_mib:
        while solve(high) > memory_mib and high < 1e12:
            low, high = high, high * 8.0
        for _ in range(12):
            middle = (low + high) / 2.0
            if solve(middle) > memory_mib:
                low = middle
            else:
                high = middle
    fitting = [s for s in found if (predict(demand, costs, s).memory_mib or 0.0) <= memory_mib]
    if not fitting:
        raise BucketError(
            f"no list of at most {max_graphs} sizes fits {memory_mib / 1024:g} GiB of graph memory"
        )

    def rank(sizes: tuple[int, ...]) -> tuple[float, float, int]:
        prediction = predict(demand, costs, sizes)
        return objective.of(prediction, demand.counts), prediction.total_s, len(sizes)

    return min(fitting, key=rank)


def time_memory_front(
    demand: StepDemand,
    costs: SizeCosts,
    *,
    max_graphs: int,
    objective: Objective = TOTAL,
    points: int = 10,
) -> tuple[ListPrediction, ...]:
    """Lists on the convex hull of the time-memory front (memory weights from 0 up to
    where one graph's memory outweighs the whole run's graph time), Pareto-optimal ones
    only, by memory."""
    if costs.graph_mib is None:
        raise BucketError(
            f"the time-memory front needs graph memory figures: {costs.memory_missing}"
        )
    first = predict(
        demand, costs, fastest_list(demand, costs, max_graphs=max_graphs, objective=objective)
    )
    scale = first.total_s * 1e6 / max(first.memory_mib or 1.0, 1e-9)
    weights = [0.0, *np.geomspace(scale * 1e-4, scale, points - 1)]
    lists = {first.sizes: first}
    for weight in weights[1:]:
        sizes = fastest_list(
            demand, costs, max_graphs=max_graphs, objective=objective, memory_weight=float(weight)
        )
        lists.setdefault(sizes, predict(demand, costs, sizes))
    ordered = sorted(lists.values(), key=lambda p: (p.memory_mib or 0.0, p.total_s))
    front: list[ListPrediction] = []
    for prediction in ordered:
        if not front or prediction.total_s < front[-1].total_s:
            front.append(prediction)
    return tuple(front)
