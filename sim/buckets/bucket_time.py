"""Predicted step time and graph memory of CUDA-graph size lists: what the time objective of
``stepplan buckets`` (:func:`stepplan.sim.buckets.size_dp.fastest_sizes`) weighs.

**A step's time under a list** is its graph's time when the planner's bucket rule
(:mod:`stepplan.planner.buckets`) gives it one, else its eager time. A graph's time
depends only on its kind and size (its dense work is the bucket's): the engine profile's
prediction for the full bucket where the profile covers it, else the cost model's terms
(roofline, short conv, host, launch) for it, through :meth:`CostModel.terms` either way.
An eager step's time is the same call on the step's own shape. The step shapes ``buckets``
reads carry no context lengths: every spec and decode row reads the run's mean context per
row (:attr:`StepDemand.row_context`, from its requests; 0 where unknown), a graph's on
the live rows the steps it holds have on average (its padding reads none: the profile
measures full buckets, and attention's cost follows the live context), and a prefill
row's pairs are those of its own chunk (the step's prefill tokens split evenly over its
rows). Zero context priced a hybrid-1b run on an H100 a quarter low.
A mixed graph is predicted holding the median live rows of the steps that are not
uniform (one prefill row, spec rows beside it) in the power-of-two row bucket holding
them: its rows bucket is the list's row size for each step, which a time per size
cannot follow. Eager steps the profile does not cover (say, pure spec steps, which it
measures only as graphs) take the cost model's time scaled by the median ratio of the
profile's to the model's time over the eager steps it covers.

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

from ..timing.cost import COST_TERMS, CostModel
from .demand import (
    BucketError,
    StepDemand,
    sorted_sizes,
)
from .size_dp import TimeProblem

#: Graph kinds in :attr:`SizeCosts.graph_us`'s row order (``planner.buckets``' order).
KINDS = GRAPH_KINDS
SPEC, DECODE, MIXED = range(3)
#: Where :meth:`CostModel.terms` puts the engine profile's time (by name: terms are added).
ENGINE_TERM = COST_TERMS.index("engine")


@attrs.frozen(eq=False)
class _RowsBatch:
    """What :func:`stepplan.sim.timing.engine_fit.step_shape` reads of a batch: per row its kind
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
    rows: Sequence[int],
    tokens: Sequence[int],
    tile_tokens: int,
    graph: GraphKey | None,
    row_context: int,
    context_rows: int | None = None,
) -> tuple[_ShapePlan, float, int]:
    """The plan-like shape of live ``rows`` and ``tokens`` per kind with ``row_context``
    KV entries behind each of the first ``context_rows`` spec and decode rows (all of
    them for ``None``; prefill rows start at zero), its attention pairs and the KV
    entries it reads."""
    spec, decode, prefill = (int(r) for r in rows)
    chunks = np.full(prefill, tokens[2] // max(prefill, 1), dtype=np.int64)
    chunks[: tokens[2] - int(chunks.sum())] += 1
    lens = [np.full(spec, tokens[0] // max(spec, 1)), np.full(decode, 1), chunks]
    kinds = np.repeat(np.arange(3), (spec, decode, prefill))
    query = np.concatenate(lens).astype(np.int64)
    reading = kinds < 2
    if context_rows is not None:
        reading &= np.cumsum(reading) <= context_rows
    context = np.where(reading, row_context, 0).astype(np.int64)
    batch = _RowsBatch(kinds, query, context)
    tiles = int((-(-chunks // tile_tokens)).sum())
    if graph is not None:
        tiles = graph.num_tiles
    padded = sum(int(t) for t in tokens) if graph is None else graph.num_tokens
    plan = _ShapePlan(
        *(int(r) for r in rows), *(int(t) for t in tokens), tiles, padded, graph, batch
    )
    pairs = float(chunks @ ((chunks + 1) * 0.5))
    return plan, pairs, plan.num_tokens + int(context.sum())


def _time_us(cost: CostModel, plan: _ShapePlan, pairs: float, kv_tokens: int) -> tuple[float, bool]:
    """``(µs, from the engine profile)`` of one step shape."""
    terms = cost.terms(plan, kv_tokens, pairs, 0.0)  # type: ignore[arg-type]
    return sum(terms) * 1e6, terms[ENGINE_TERM] > 0


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
    mixed_rows = _mixed_rows(demand)
    live_rows = _graph_live_rows(demand, largest)
    graph_model = np.full((3, largest), np.inf)
    for kind in kinds:
        profiled = np.zeros(largest, dtype=bool)
        model_us = np.full(largest, np.inf)
        for size in range(1, largest + 1):
            shape = _graph_shape(
                kind,
                size,
                q,
                (int(live_rows[min(kind, DECODE), size - 1]), mixed_rows),
                demand.max_num_seqs,
                tile_tokens,
                demand.row_context,
            )
            if shape is not None:
                graph_us[kind, size - 1], profiled[size - 1] = _time_us(cost, *shape)
                model_us[size - 1] = _time_us(modelled, *shape)[0]
        from_profile += int(profiled.sum())
        graph_us[kind] = _anchored(graph_us[kind], model_us, profiled)
        graph_model[kind] = model_us
    eager = np.zeros(demand.rows.size)
    eager_model = np.zeros(demand.rows.size)
    covered = np.zeros(demand.rows.size, dtype=bool)
    for i in range(eager.size):
        live = (demand.kind_rows[:, i], _kind_tokens(demand, i))
        shape = _shape_plan(*live, tile_tokens, None, demand.row_context)
        eager[i], covered[i] = _time_us(cost, *shape)
        eager_model[i] = _time_us(modelled, *shape)[0] if cost.engine is not None else eager[i]
    from_profile += int(covered.sum())
    if cost.engine is not None:
        _anchor_eager(demand, eager, eager_model, covered, graph_us, graph_model)
    memory, missing = _graph_memory(cost, kinds, largest)
    for array in (graph_us, eager, memory):
        if array is not None:
            array.flags.writeable = False
    return SizeCosts(graph_us, memory, eager, from_profile, missing)


def _anchor_eager(
    demand: StepDemand,
    eager: np.ndarray,
    model: np.ndarray,
    covered: np.ndarray,
    graph_us: np.ndarray,
    graph_model: np.ndarray,
) -> None:
    """Eager times the profile does not cover, at the profile's level (in place): a
    uniform step's is its own size's graph time plus the model's eager-minus-graph
    difference (a profile measures uniform steps as graphs only); any other's the model's
    time scaled by the median profile-to-model ratio of the eager steps it covers."""
    ratio = float(np.median(eager[covered] / model[covered])) if covered.any() else 1.0
    kind = np.where(demand.kind_rows[0] > 0, SPEC, DECODE)
    column = np.minimum(demand.need, graph_us.shape[1]) - 1
    uniform = ~covered & demand.uniform & (demand.need <= graph_us.shape[1])
    at = (kind[uniform], column[uniform])
    measured_level = np.isfinite(graph_us[at]) & np.isfinite(graph_model[at])
    pick = np.flatnonzero(uniform)[measured_level]
    eager[pick] = graph_us[at][measured_level] + model[pick] - graph_model[at][measured_level]
    rest = ~covered
    rest[pick] = False
    eager[rest] = model[rest] * ratio


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


def _mixed_rows(demand: StepDemand) -> tuple[int, int]:
    """``(live rows, row bucket)`` of the mixed graph the costs stand for: the median live
    rows of the steps that are not uniform, and the power of two holding them (up to
    ``max_num_seqs``); a mixed graph's rows bucket is the list's row size for each step,
    which the per-size time cannot follow."""
    others = ~demand.uniform & (demand.rows > 0)
    if not others.any():
        return 1, 1
    order = np.argsort(demand.rows[others])
    reached = np.cumsum(demand.counts[others][order])
    median = int(demand.rows[others][order][np.searchsorted(reached, reached[-1] / 2)])
    bucket = 1 << max(0, (median - 1).bit_length())
    return median, min(bucket, demand.max_num_seqs)


def _graph_live_rows(demand: StepDemand, largest: int) -> np.ndarray:
    """``[2, largest], int64`` live rows a spec (row 0) or decode (row 1) graph of each
    size is priced with: the mean, rounded, over the kind's steps that need at most that
    size (the size itself where none does). Attention's context term grows with the live
    rows, not the bucket's, and a size mostly holds steps well below it."""
    spec = demand.kind_rows[0] > 0
    live = np.tile(np.arange(1, largest + 1, dtype=np.int64), (2, 1))
    for row, mine in enumerate((demand.uniform & spec, demand.uniform & ~spec)):
        order = np.argsort(demand.need[mine], kind="stable")
        need, weight = demand.need[mine][order], demand.counts[mine][order].astype(np.float64)
        rows = demand.rows[mine][order] * weight
        reached = np.searchsorted(need, np.arange(1, largest + 1), side="right")
        steps = np.concatenate([[0.0], np.cumsum(weight)])[reached]
        total = np.concatenate([[0.0], np.cumsum(rows)])[reached]
        mean = np.rint(total / np.maximum(steps, 1.0))
        live[row] = np.where(steps > 0, np.clip(mean, 1, live[row]), live[row])
    return live


def _graph_shape(
    kind: int,
    size: int,
    q: int,
    holds: tuple[int, tuple[int, int]],
    max_num_seqs: int,
    tile_tokens: int,
    row_context: int,
) -> tuple[_ShapePlan, float, int] | None:
    """The full bucket of kind ``kind`` at ``size`` (the shape a profile measures), its
    context that of the steps it ``holds``: a uniform one's live rows
    (:func:`_graph_live_rows`) read ``row_context`` each, the padding none; ``(live rows,
    row bucket)`` of a mixed one (:func:`_mixed_rows`). ``None`` where there is none."""
    live_uniform, mixed_rows = holds
    if kind == SPEC and size <= max_num_seqs:
        key = GraphKey("spec", size * q, size, 0)
        full = ((size, 0, 0), (size * q, 0, 0))
        return _shape_plan(*full, tile_tokens, key, row_context, live_uniform)
    if kind == DECODE and size <= max_num_seqs:
        key = GraphKey("decode", size, size, 0)
        full = ((0, size, 0), (0, size, 0))
        return _shape_plan(*full, tile_tokens, key, row_context, live_uniform)
    if kind == MIXED and size >= 2:
        live = min(mixed_rows[0], size // 2)  # one prefill row of the rest, spec rows beside
        rows = min(size, max(mixed_rows[1], live))
        key = GraphKey("mixed", size, rows, tile_capacity(size, rows, tile_tokens))
        spec = max(0, min(live - 1, (size - 2) // q))
        tokens = (spec * q, 0, size - spec * q)
        return _shape_plan((spec, 0, 1), tokens, tile_tokens, key, row_context)
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


def demand_points(problem: TimeProblem) -> np.ndarray | None:
    """``[m], bool`` the candidates that suffice, or ``None`` where all are needed: when
    every kind's time and the memory grow with the size, a size can move down to the
    largest demand it holds, so demands, forced sizes and the first size above an excluded
    range suffice."""
    with np.errstate(invalid="ignore"):  # inf - inf: a kind without graphs there
        steps = np.diff(problem.graph_us, axis=1)
    rising = bool((np.nan_to_num(steps, nan=0.0) >= 0).all()) and bool(
        (np.diff(problem.memory_mib) >= 0).all()
    )
    if not rising:
        return None
    keep = problem.forced.copy()
    keep |= np.isin(problem.candidates, problem.demand[problem.kind >= 0])
    keep[1:] |= problem.allowed[1:] & ~problem.allowed[:-1]
    keep &= problem.allowed | problem.forced
    if not keep.any():
        keep[np.argmax(problem.allowed)] = True
    return keep


def restricted(problem: TimeProblem, keep: np.ndarray | None) -> TimeProblem:
    """``problem`` over the candidates ``keep`` marks (all of them for ``None``)."""
    if keep is None:
        return problem
    return attrs.evolve(
        problem,
        candidates=problem.candidates[keep],
        graph_us=problem.graph_us[:, keep],
        memory_mib=problem.memory_mib[keep],
        allowed=problem.allowed[keep],
        forced=problem.forced[keep],
    )


def on_demand_points(problem: TimeProblem) -> TimeProblem:
    """The same problem over fewer candidates where that loses nothing
    (:func:`demand_points`)."""
    return restricted(problem, demand_points(problem))


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
