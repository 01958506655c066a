"""Predicted step time and graph memory of CUDA-graph size lists: what the time objective of
``stepplan buckets`` (:func:`stepplan.sim.size_dp.fastest_sizes`) weighs.

**A step's time under a list** is its graph's time when the planner's bucket rule
(:mod:`stepplan.planner.buckets`) gives it one, else its eager time. A graph's time
depends only on its kind and size (its dense work is the bucket's): the engine profile's
prediction for the full bucket where the profile covers it, else the cost model's terms
(roofline, short conv, host, launch) for it, through :meth:`CostModel.terms` either way.
An eager step's time is the same call on the step's own shape. The step shapes ``buckets``
reads carry no context lengths, so both sides are predicted at zero context: attention's
context term, which no list changes much, is left out of the totals, and a prefill row's
pairs are those of its own chunk (the step's prefill tokens split evenly over its rows).
A mixed graph is predicted holding one prefill row (its rows bucket is the list's row
size for the step, which the profile's mixed model weighs little).

**Graph memory** of a list is the sum over its sizes of each captured graph's memory: at
a size up to the largest row size, a graph of each uniform kind the workload's steps use
(spec, decode), and in ``mixed`` mode a mixed graph at every size. The engine profile's
``graph_memory`` figures give it (``docs/profile_format.md``), linear between measured
sizes and along the last segment past them.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from stepplan.planner import GraphKey
from stepplan.planner.buckets import GRAPH_KINDS, tile_capacity

from .buckets import (
    BucketError,
    Score,
    StepDemand,
    best_sizes,
    default_lists,
    score,
    sorted_sizes,
    usable_sizes,
)
from .cost import CostModel
from .size_dp import TimeProblem, fastest_sizes, percentile_sizes

#: Graph kinds in :attr:`SizeCosts.graph_us`'s row order (``planner.buckets``' order).
KINDS = GRAPH_KINDS
SPEC, DECODE, MIXED = range(3)


@attrs.frozen(eq=False)
class _RowsBatch:
    """What :func:`stepplan.sim.engine_fit.step_shape` reads of a batch: per row its kind
    (0 spec, 1 decode, 2 prefill), query length and context (``[R]``)."""

    kinds: np.ndarray
    query_lens: np.ndarray
    num_computed_tokens: np.ndarray


@attrs.frozen(eq=False)
class _ShapePlan:
    """A step shape with the fields the cost model reads of an ``ExecutionPlan``."""

    num_spec_rows: int
    num_decode_rows: int
    num_prefill_rows: int
    num_spec_decode_tokens: int
    num_decode_tokens: int
    num_prefill_tokens: int
    num_tiles: int
    padded_tokens: int
    graph: GraphKey | None
    batch: _RowsBatch

    @property
    def num_rows(self) -> int:
        return self.num_spec_rows + self.num_decode_rows + self.num_prefill_rows

    @property
    def num_tokens(self) -> int:
        return self.num_spec_decode_tokens + self.num_decode_tokens + self.num_prefill_tokens


def _shape_plan(
    rows: Sequence[int], tokens: Sequence[int], tile_tokens: int, graph: GraphKey | None
) -> tuple[_ShapePlan, float]:
    """The plan-like shape of live ``rows`` and ``tokens`` per kind, and its attention
    pairs at zero context."""
    spec, decode, prefill = (int(r) for r in rows)
    chunks = np.full(prefill, tokens[2] // max(prefill, 1), dtype=np.int64)
    chunks[: tokens[2] - int(chunks.sum())] += 1
    lens = [np.full(spec, tokens[0] // max(spec, 1)), np.full(decode, 1), chunks]
    kinds = np.repeat(np.arange(3), (spec, decode, prefill))
    query = np.concatenate(lens).astype(np.int64)
    batch = _RowsBatch(kinds, query, np.zeros_like(query))
    tiles = int((-(-chunks // tile_tokens)).sum())
    if graph is not None:
        tiles = graph.num_tiles
    padded = sum(int(t) for t in tokens) if graph is None else graph.num_tokens
    plan = _ShapePlan(
        *(int(r) for r in rows), *(int(t) for t in tokens), tiles, padded, graph, batch
    )
    pairs = float(chunks @ ((chunks + 1) * 0.5))
    return plan, pairs


def _time_us(cost: CostModel, plan: _ShapePlan, pairs: float) -> tuple[float, bool]:
    """``(µs, from the engine profile)`` of one step shape at zero context."""
    terms = cost.terms(plan, plan.num_tokens, pairs, 0.0)  # type: ignore[arg-type]
    return sum(terms) * 1e6, terms[-1] > 0


@attrs.frozen(eq=False)
class SizeCosts:
    """One replay's predicted time and memory per graph kind and size ``1..largest``, and
    each step entry's eager time.

    Attributes:
        graph_us: ``[3, largest], float64`` µs of a graph of kind ``k`` (:data:`KINDS`) at
            size ``s`` in column ``s - 1``; ``inf`` where the kind has no graph there.
        graph_mib: ``[3, largest], float64`` MiB per graph, or ``None`` without figures
            (then :attr:`memory_missing` says why).
        eager_us: ``[S], float64`` µs of each step entry of the demand run eagerly.
        profile_steps: graph kinds and sizes and step entries the engine profile
            predicted (the others: the cost model's terms).
        memory_missing: why there are no memory figures (``""`` when there are).
    """

    graph_us: np.ndarray
    graph_mib: np.ndarray | None
    eager_us: np.ndarray
    profile_steps: int
    memory_missing: str

    @property
    def largest(self) -> int:
        """The largest size costed."""
        return int(self.graph_us.shape[1])


def size_costs(demand: StepDemand, cost: CostModel, largest: int, tile_tokens: int) -> SizeCosts:
    """:class:`SizeCosts` of sizes ``1..largest`` for ``demand``'s graph mode and steps."""
    if largest < 1:
        raise BucketError(f"the largest size must be positive, got {largest}")
    q = demand.num_spec_tokens + 1
    graph_us = np.full((3, largest), np.inf)
    from_profile = 0
    kinds = used_kinds(demand)
    modelled = cost if cost.engine is None else attrs.evolve(cost, engine=None)
    for kind in kinds:
        profiled = np.zeros(largest, dtype=bool)
        model_us = np.full(largest, np.inf)
        for size in range(1, largest + 1):
            shape = _graph_shape(kind, size, q, demand.max_num_seqs, tile_tokens)
            if shape is not None:
                graph_us[kind, size - 1], profiled[size - 1] = _time_us(cost, *shape)
                model_us[size - 1] = _time_us(modelled, *shape)[0]
        from_profile += int(profiled.sum())
        graph_us[kind] = _anchored(graph_us[kind], model_us, profiled)
    eager = np.zeros(demand.rows.size)
    for i in range(eager.size):
        rows, tokens = demand.kind_rows[:, i], _kind_tokens(demand, i)
        eager[i], profiled = _time_us(cost, *_shape_plan(rows, tokens, tile_tokens, None))
        from_profile += profiled
    memory, missing = _graph_memory(cost, kinds, largest)
    for array in (graph_us, eager, memory):
        if array is not None:
            array.flags.writeable = False
    return SizeCosts(graph_us, memory, eager, from_profile, missing)


def _anchored(times: np.ndarray, model: np.ndarray, profiled: np.ndarray) -> np.ndarray:
    """One kind's graph times by size with the profile's measured buckets as anchors:
    linear between them, and the cost model's times scaled to meet the nearest one
    outside them (the model's shape, the profile's level; a profile measures a few
    buckets, and its level differs from the model's)."""
    if not profiled.any():
        return times
    sizes = np.arange(1, times.size + 1, dtype=np.float64)
    anchors = np.flatnonzero(profiled)
    first, last = anchors[0], anchors[-1]
    result = times.copy()
    inside = (sizes >= first + 1) & (sizes <= last + 1)
    result[inside] = np.interp(sizes[inside], sizes[anchors], times[anchors])
    with np.errstate(invalid="ignore"):  # inf where the kind has no graph stays inf
        result[:first] = model[:first] * (times[first] / model[first])
        result[last + 1 :] = model[last + 1 :] * (times[last] / model[last])
    return result


def used_kinds(demand: StepDemand) -> tuple[int, ...]:
    """Graph kinds (indices into :data:`KINDS`) the workload's steps can replay."""
    if demand.graph_mode == "none":
        return ()
    uniform = demand.uniform
    spec = uniform & (demand.kind_rows[0] > 0)
    kinds = [k for k, used in ((SPEC, spec.any()), (DECODE, (uniform & ~spec).any())) if used]
    if demand.graph_mode == "mixed":
        kinds.append(MIXED)
    return tuple(kinds)


def _kind_tokens(demand: StepDemand, step: int) -> tuple[int, int, int]:
    """Live tokens per kind of a step entry (spec rows carry ``Q`` tokens, decode rows 1:
    the demand keeps the total, so prefill rows take the rest)."""
    spec, decode, _ = (int(r) for r in demand.kind_rows[:, step])
    total = int(demand.tokens[step])
    spec_tokens = min(total, spec * (demand.num_spec_tokens + 1))
    decode_tokens = min(total - spec_tokens, decode)
    return spec_tokens, decode_tokens, total - spec_tokens - decode_tokens


def _graph_shape(
    kind: int, size: int, q: int, max_num_seqs: int, tile_tokens: int
) -> tuple[_ShapePlan, float] | None:
    """The full bucket of kind ``kind`` at ``size``, or ``None`` where there is none."""
    if kind == SPEC and size <= max_num_seqs:
        key = GraphKey("spec", size * q, size, 0)
        return _shape_plan((size, 0, 0), (size * q, 0, 0), tile_tokens, key)
    if kind == DECODE and size <= max_num_seqs:
        key = GraphKey("decode", size, size, 0)
        return _shape_plan((0, size, 0), (0, size, 0), tile_tokens, key)
    if kind == MIXED and size >= 2:
        rows = min(size, max_num_seqs)
        key = GraphKey("mixed", size, rows, tile_capacity(size, rows, tile_tokens))
        return _shape_plan((0, 0, 1), (0, 0, size), tile_tokens, key)
    return None


def _graph_memory(
    cost: CostModel, kinds: Sequence[int], largest: int
) -> tuple[np.ndarray | None, str]:
    """``[3, largest]`` MiB per graph from the engine profile's figures, or why not."""
    if cost.engine is None:
        return None, "no engine profile (give one with --profile FILE)"
    figures = cost.engine.graph_mib
    memory = np.zeros((3, largest))
    for kind in kinds:
        measured = sorted(
            (size, mib) for (name, size), mib in figures.items() if name == KINDS[kind]
        )
        if not measured:
            return None, (
                f"{cost.engine.source}: no graph memory figures for {KINDS[kind]} graphs "
                "(the profile's graph_memory, docs/profile_format.md)"
            )
        sizes = np.array([0] + [s for s, _ in measured], dtype=np.float64)
        mib = np.array([0.0] + [m for _, m in measured])
        wanted = np.arange(1, largest + 1, dtype=np.float64)
        slope = (mib[-1] - mib[-2]) / (sizes[-1] - sizes[-2])
        memory[kind] = np.where(
            wanted <= sizes[-1],
            np.interp(wanted, sizes, mib),
            mib[-1] + slope * (wanted - sizes[-1]),
        )
    return memory, ""


@attrs.frozen(eq=False)
class ListPrediction:
    """One size list's predicted total and memory.

    Attributes:
        sizes: the list, ascending.
        total_s: predicted total step time of the workload (s).
        step_us: ``[S], float64`` each step entry's predicted time (µs).
        memory_mib: graph memory (MiB), ``None`` without figures.
    """

    sizes: tuple[int, ...]
    total_s: float
    step_us: np.ndarray
    memory_mib: float | None


def time_problem(demand: StepDemand, costs: SizeCosts, largest_row: int) -> TimeProblem:
    """The 1-D time problem of lists whose largest row size is ``largest_row`` (``R``).

    Uniform steps needing at most ``R`` replay their kind's graph; in ``mixed`` mode the
    other steps with at most ``R`` live rows replay a mixed graph at their tokens; every
    other step runs eagerly. In ``mixed`` mode ``R`` is forced and no size may lie in
    ``(R, max_num_seqs]`` (it would be a row size); in ``full`` mode the largest size is
    ``R`` itself, chosen by the DP, and ``largest_row`` only caps the candidates.
    """
    uniform = demand.uniform & (demand.need <= largest_row)
    spec = demand.kind_rows[0] > 0
    kind = np.where(uniform, np.where(spec, SPEC, DECODE), -1)
    demand_size = np.where(uniform, demand.need, 0)
    unit = np.where(uniform, demand.per_unit, 1).astype(np.float64)
    mixed_mode = demand.graph_mode == "mixed"
    if mixed_mode:
        mixed = ~uniform & (demand.rows > 0) & (demand.rows <= largest_row)
        kind = np.where(mixed, MIXED, kind)
        demand_size = np.where(mixed, demand.tokens, demand_size)
    if demand.graph_mode == "none":
        kind = np.full_like(kind, -1)
    candidates = np.arange(1, costs.largest + 1, dtype=np.int64)
    if mixed_mode:
        allowed = (candidates <= largest_row) | (candidates > demand.max_num_seqs)
        forced = candidates == largest_row
    else:
        allowed = candidates <= min(largest_row, demand.max_num_seqs)
        forced = np.zeros(candidates.size, dtype=bool)
    # a step needing more than any candidate always runs eagerly
    kind = np.where(demand_size > costs.largest, -1, kind)
    memory = _list_memory(demand, costs, largest_row)
    problem = TimeProblem(
        candidates=candidates,
        kind=kind.astype(np.int64),
        demand=np.maximum(demand_size, 1).astype(np.int64),
        count=demand.counts.astype(np.float64),
        unit=unit,
        eager_us=np.asarray(costs.eager_us, dtype=np.float64),
        graph_us=np.asarray(costs.graph_us, dtype=np.float64),
        memory_mib=memory,
        allowed=allowed,
        forced=forced,
    )
    return problem


def _list_memory(demand: StepDemand, costs: SizeCosts, largest_row: int) -> np.ndarray:
    """``[largest]`` MiB a list adds by holding each size (zeros without figures)."""
    if costs.graph_mib is None:
        return np.zeros(costs.largest)
    sizes = np.arange(1, costs.largest + 1)
    memory = np.zeros(costs.largest)
    for kind in used_kinds(demand):
        captured = sizes <= largest_row if kind != MIXED else np.ones(sizes.size, dtype=bool)
        memory += np.where(captured, costs.graph_mib[kind], 0.0)
    return memory


def on_demand_points(problem: TimeProblem) -> TimeProblem:
    """The same problem over fewer candidates where that loses nothing: when every kind's
    time and the memory grow with the size, a size can move down to the largest demand it
    holds, so demands, forced sizes and the first size above an excluded range suffice."""
    with np.errstate(invalid="ignore"):  # inf - inf: a kind without graphs there
        steps = np.diff(problem.graph_us, axis=1)
    rising = bool((np.nan_to_num(steps, nan=0.0) >= 0).all()) and bool(
        (np.diff(problem.memory_mib) >= 0).all()
    )
    if not rising:
        return problem
    keep = problem.forced.copy()
    keep |= np.isin(problem.candidates, problem.demand[problem.kind >= 0])
    keep[1:] |= problem.allowed[1:] & ~problem.allowed[:-1]
    keep &= problem.allowed | problem.forced
    if not keep.any():
        keep[np.argmax(problem.allowed)] = True
    return attrs.evolve(
        problem,
        candidates=problem.candidates[keep],
        graph_us=problem.graph_us[:, keep],
        memory_mib=problem.memory_mib[keep],
        allowed=problem.allowed[keep],
        forced=problem.forced[keep],
    )


def predict(demand: StepDemand, costs: SizeCosts, sizes: Sequence[int]) -> ListPrediction:
    """The predicted total step time and graph memory of ``sizes`` on ``demand``."""
    ordered = tuple(int(s) for s in sorted_sizes(sizes))
    if ordered[-1] > costs.largest:
        raise BucketError(f"size {ordered[-1]} exceeds the largest costed, {costs.largest}")
    rows = [s for s in ordered if s <= demand.max_num_seqs]
    if not rows:
        raise BucketError(f"no size of {ordered} is <= max_num_seqs={demand.max_num_seqs}")
    full = time_problem(demand, costs, rows[-1])
    times, _ = full.step_times(ordered)
    total = float((times * demand.counts).sum()) * 1e-6
    memory = None if costs.graph_mib is None else full.memory_of(ordered)
    times.flags.writeable = False
    return ListPrediction(ordered, total, times, memory)


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

    def solve(self, problem: TimeProblem, max_graphs: int, memory_weight: float) -> tuple[int, ...]:
        """The best list of ``problem`` under this objective."""
        if self.percentile is None:
            return fastest_sizes(problem, max_graphs=max_graphs, memory_weight=memory_weight)
        return percentile_sizes(
            problem, max_graphs=max_graphs, percentile=self.percentile, memory_weight=memory_weight
        )


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
    objective: Objective = Objective(),
    memory_weight: float = 0.0,
    references: Sequence[Sequence[int]] = (),
) -> tuple[int, ...]:
    """The best list of at most ``max_graphs`` sizes for ``objective`` plus
    ``memory_weight`` (µs per MiB) times its graph memory, over every largest row size."""
    if max_graphs < 1:
        raise BucketError(f"--max-graphs must be positive, got {max_graphs}")
    best: tuple[float, tuple[int, ...]] | None = None
    for largest_row in _largest_rows(demand, costs, references):
        problem = on_demand_points(time_problem(demand, costs, largest_row))
        try:
            sizes = objective.solve(problem, max_graphs, memory_weight)
        except BucketError:
            continue  # no list with this largest row size gives a graph to anything
        prediction = predict(demand, costs, sizes)
        value = objective.of(prediction, demand.counts) * (
            1e6 if objective.percentile is None else 1.0
        ) + memory_weight * (prediction.memory_mib or 0.0)
        if best is None or value < best[0] - 1e-9 * abs(best[0]):
            best = (value, sizes)
    if best is None:
        raise BucketError("no size list gives any step a graph")
    return best[1]


def within_memory(
    demand: StepDemand,
    costs: SizeCosts,
    *,
    max_graphs: int,
    memory_mib: float,
    objective: Objective = Objective(),
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
    return min(
        fitting, key=lambda s: (objective.of(predict(demand, costs, s), demand.counts), len(s))
    )


def time_memory_front(
    demand: StepDemand,
    costs: SizeCosts,
    *,
    max_graphs: int,
    objective: Objective = Objective(),
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


@attrs.frozen
class TimedScore:
    """One size list's row of the table a person reads: its bucketing and its prediction.

    Attributes:
        score: padding and graph hits (:func:`stepplan.sim.buckets.score`).
        total_s: predicted total step time (s).
        percentile_us: the objective's percentile of step time (µs), ``None`` when the
            objective is the total.
        memory_mib: graph memory (MiB), ``None`` without figures.
    """

    score: Score
    total_s: float
    percentile_us: float | None
    memory_mib: float | None


@attrs.frozen
class TimeComparison:
    """The time objective's lists against the default lists on one simulation.

    Attributes:
        rows: the default lists (cut to the graph budget), the fastest lists at each
            default's graph count and graph memory, today's least-padding list, and
            the recommended list, duplicates left out.
        recommended: the fastest list within ``--max-graphs`` and ``--graph-memory``:
            what ``--write`` writes.
        objective: what was minimized.
        references: ``(name, total_s)`` of each default list, the table's baselines.
    """

    rows: tuple[TimedScore, ...]
    recommended: TimedScore
    objective: Objective
    references: tuple[tuple[str, float], ...]


def timed_score(
    demand: StepDemand, costs: SizeCosts, sizes: Sequence[int], label: str, objective: Objective
) -> TimedScore:
    """:class:`TimedScore` of one list."""
    prediction = predict(demand, costs, sizes)
    value = None if objective.percentile is None else objective.of(prediction, demand.counts)
    return TimedScore(
        score(demand, prediction.sizes, label), prediction.total_s, value, prediction.memory_mib
    )


def compare_times(
    demand: StepDemand,
    costs: SizeCosts,
    *,
    max_graphs: int | None = None,
    memory_mib: float | None = None,
    objective: Objective = Objective(),
) -> TimeComparison:
    """The default lists, each cut to ``max_graphs`` (as in :func:`compare_to_defaults`),
    and the fastest lists of as many sizes and no more graph memory; then the fastest of
    ``max_graphs`` sizes (vLLM's count when not given) within ``memory_mib``."""
    if max_graphs is not None and max_graphs < 1:
        raise BucketError(f"--max-graphs must be positive, got {max_graphs}")
    if memory_mib is not None and costs.graph_mib is None:
        raise BucketError(f"--graph-memory needs graph memory figures: {costs.memory_missing}")
    defaults = [
        (name, usable_sizes(demand, sizes)[:max_graphs])
        for name, sizes in default_lists(demand.max_num_seqs, demand.num_spec_tokens)
    ]
    defaults = [(name, sizes) for name, sizes in defaults if sizes and sizes[-1] <= costs.largest]
    references = [sizes for _, sizes in defaults]
    rows = [timed_score(demand, costs, s, f"{name} ({len(s)})", objective) for name, s in defaults]
    for (_, sizes), row in zip(defaults, list(rows), strict=True):
        chosen = _best(demand, costs, len(sizes), row.memory_mib, objective, references)
        label = f"fastest, <= {len(sizes)} graphs"
        if row.memory_mib is not None:
            label += f", <= {row.memory_mib:,.0f} MiB"
        rows.append(timed_score(demand, costs, chosen, label, objective))
    vllm = usable_sizes(demand, default_lists(demand.max_num_seqs, demand.num_spec_tokens)[0][1])
    budget = len(vllm) if max_graphs is None else max_graphs
    if vllm[-1] <= costs.largest:
        padding = best_sizes(demand, vllm, budget)
        label = f"least padding, <= {budget} up to {vllm[-1]}"
        rows.append(timed_score(demand, costs, padding, label, objective))
    chosen = _best(demand, costs, budget, memory_mib, objective, references)
    label = f"fastest, <= {budget} graphs" + (
        "" if memory_mib is None else f", <= {memory_mib / 1024:g} GiB"
    )
    recommended = timed_score(demand, costs, chosen, label, objective)
    unique = {(r.score.label, r.score.sizes): r for r in [*rows, recommended]}
    named = tuple((name, rows[i].total_s) for i, (name, _) in enumerate(defaults))
    return TimeComparison(tuple(unique.values()), recommended, objective, named)


def _best(
    demand: StepDemand,
    costs: SizeCosts,
    max_graphs: int,
    memory_mib: float | None,
    objective: Objective,
    references: Sequence[Sequence[int]],
) -> tuple[int, ...]:
    if memory_mib is None:
        return fastest_list(
            demand, costs, max_graphs=max_graphs, objective=objective, references=references
        )
    return within_memory(
        demand,
        costs,
        max_graphs=max_graphs,
        memory_mib=memory_mib,
        objective=objective,
        references=references,
    )


def format_time_table(comparison: TimeComparison) -> str:
    """The comparison as a fixed-width text table, one row per list."""
    names = [name.split()[0] for name, _ in comparison.references]
    percentile = comparison.objective.percentile
    header = f"{'sizes list':<34} {'graphs':>6} {'largest':>7} {'step time s':>11}"
    header += "".join(f" {'vs ' + n:>9}" for n in names)
    if percentile is not None:
        header += f" {f'p{percentile:g} ms':>9}"
    header += f" {'hit rate':>8} {'padded tokens':>13} {'graph MiB':>9}"
    lines = [header, "-" * len(header)]
    for row in comparison.rows:
        s = row.score
        line = f"{s.label:<34} {len(s.sizes):>6} {s.sizes[-1]:>7} {row.total_s:>11,.3f}"
        for _, total in comparison.references:
            line += f" {(row.total_s / total - 1.0) if total else 0.0:>+9.2%}"
        if row.percentile_us is not None:
            line += f" {row.percentile_us / 1e3:>9.3f}"
        memory = "n/a" if row.memory_mib is None else f"{row.memory_mib:,.0f}"
        line += f" {s.hit_rate:>8.2%} {s.padded_tokens:>13,} {memory:>9}"
        lines.append(line)
    return "\n".join(lines)


def prediction_lines(comparison: TimeComparison, source: str) -> list[str]:
    """What ``--write`` records beside the sizes: the prediction they were chosen for."""
    best = comparison.recommended
    lines = [
        f"chosen for: least {comparison.objective.name}, {best.score.label}",
        f"predicted total step time: {best.total_s:.3f} s over {best.score.steps:,} steps "
        f"({source})",
    ]
    for name, total in comparison.references:
        lines.append(
            f"against {name}: {best.total_s - total:+.3f} s ({best.total_s / total - 1:+.2%})"
        )
    if best.percentile_us is not None:
        lines.append(f"predicted {comparison.objective.name}: {best.percentile_us / 1e3:.3f} ms")
    lines.append(f"hit rate {best.score.hit_rate:.2%}, padded tokens {best.score.padded_tokens:,}")
    if best.memory_mib is not None:
        lines.append(f"graph memory: {best.memory_mib:,.1f} MiB")
    return lines
