"""Choose CUDA-graph sizes for a workload: exact dynamic programming over its step sizes.

**How the planner uses one list of sizes** (``planner/compile.py``, ``_choose_graph``):

* a *uniform* step (every live row spec, or every live row decode) takes the
  smallest size ``s >= need`` among the sizes ``<= max_num_seqs`` ("row sizes"),
  ``need = max(rows, ceil(tokens / u))``, and replays a graph of ``s`` rows and
  ``s * u`` tokens, where ``u = Q`` for spec and ``u = 1`` for decode;
* in ``mixed`` graph mode every other step (and a uniform one no row size fits)
  takes the smallest size ``>= tokens`` for its tokens and the smallest row size
  ``>= rows`` for its rows; in ``full`` mode it runs eagerly, as it does
  wherever no size fits.

**The 1-D problem.** So every step that replays a graph has a *demand* ``d`` on
the one size axis (``need`` for a uniform step, its token count for a mixed
one) and a *weight* ``u`` (padded tokens per unit of size: ``Q``, ``1``, ``1``).
A list ``S`` pads it by ``u * (min{s in S : s >= d} - d)`` tokens, plus, for a
spec step whose rows carry fewer than ``Q`` tokens, ``u * d - tokens``, which
no list changes. The optimizer takes the steps a reference list covers (those
that replay a graph under it), keeps that list's largest size ``M`` and largest
row size ``R`` (so exactly the same steps replay a graph, and the same still run
eagerly) and, for a budget of ``N`` sizes, minimizes the total padded tokens
over the covered steps. It never places a size in ``(R, max_num_seqs]``: there
it would become a row size and let uniform steps beyond ``R`` replay a graph,
changing which steps are covered. Padded *rows* of mixed graphs are not part
of the objective (it counts tokens).

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

import json
from collections.abc import Mapping, Sequence

import attrs
import numpy as np

from stepplan.planner import GRAPH_MODES, default_graph_sizes


class BucketError(ValueError):
    """Input the optimizer cannot use, saying which and why."""


def sglang_default_graph_sizes(max_bs: int, speculative: bool) -> tuple[int, ...]:
    """SGLang's default CUDA-graph batch sizes (``--cuda-graph-bs`` when not given).

    From ``ServerArgs._generate_cuda_graph_batch_sizes`` in
    ``python/sglang/srt/server_args.py`` (github.com/sgl-project/sglang, 2025
    releases): without speculative decoding ``[1, 2, 4, 8, 12]`` then 16..256
    step 8, 272..511 step 16, 512..``max_bs`` step 32; with speculative decoding
    ("less padding for smaller batch sizes") 1..8, 10..32 step 2, 40..64 step 4,
    72..256 step 8, then 272..``max_bs`` step 16; sizes above
    ``cuda_graph_max_bs`` dropped. ``cuda_graph_max_bs`` defaults to 256 on an
    H100/H200 at tensor parallelism below 4. SGLang's sizes count requests;
    with speculation a graph of ``bs`` requests holds ``bs * draft tokens``
    tokens, as the planner's spec graphs do.
    """
    if max_bs < 1:
        raise BucketError(f"max_bs must be positive, got {max_bs}")
    if speculative:
        sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8)]
        sizes += range(272, max_bs + 1, 16)
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16)]
        sizes += range(512, max_bs + 1, 32)
    return tuple(s for s in sizes if s <= max_bs)


@attrs.frozen(eq=False)
class StepDemand:
    """What each simulated step asks of a graph-size list (see the module docstring).

    Attributes:
        rows: ``[S], int64`` live rows of each step.
        tokens: ``[S], int64`` live tokens of each step.
        need: ``[S], int64`` size a uniform step needs; 0 for other steps.
        per_unit: ``[S], int64`` tokens per size of a uniform step's graph
            (``Q`` spec, ``1`` decode); 0 for other steps.
        graph_mode: the planner's graph mode (``none``, ``full``, ``mixed``).
        max_num_seqs: the planner's row limit; row sizes are the sizes up to it.
        num_spec_tokens: drafts per spec row (``Q - 1``) the demand was read with.
    """

    rows: np.ndarray
    tokens: np.ndarray
    need: np.ndarray
    per_unit: np.ndarray
    graph_mode: str
    max_num_seqs: int
    num_spec_tokens: int

    @property
    def num_steps(self) -> int:
        """``S``: steps of the simulation."""
        return len(self.rows)

    @property
    def uniform(self) -> np.ndarray:
        """``[S], bool`` the steps that are pure spec or pure decode."""
        return self.per_unit > 0


def step_demand(
    steps: Mapping[str, np.ndarray], *, num_spec_tokens: int, graph_mode: str, max_num_seqs: int
) -> StepDemand:
    """The demand of every step of a simulation's step table.

    Reads the columns ``num_spec_rows``, ``num_decode_rows``, ``num_prefill_rows``,
    ``num_spec_tokens``, ``num_decode_tokens``, ``num_prefill_tokens`` (each
    ``[S]``, integer) of ``steps.csv``.
    """
    names = ("spec", "decode", "prefill")
    rows = [_int_column(steps, f"num_{name}_rows") for name in names]
    tokens = [_int_column(steps, f"num_{name}_tokens") for name in names]
    lengths = {len(column) for column in rows + tokens}
    if len(lengths) != 1:
        raise BucketError(f"step columns have different lengths: {sorted(lengths)}")
    if graph_mode not in GRAPH_MODES:
        raise BucketError(f"graph_mode must be one of {GRAPH_MODES}, got {graph_mode!r}")
    live_rows, live_tokens = rows[0] + rows[1] + rows[2], tokens[0] + tokens[1] + tokens[2]
    pure_spec = (rows[0] == live_rows) & (live_rows > 0)
    pure_decode = (rows[1] == live_rows) & (live_rows > 0)
    per_unit = np.where(pure_spec, num_spec_tokens + 1, np.where(pure_decode, 1, 0))
    safe_unit = np.maximum(per_unit, 1)
    need = np.where(per_unit > 0, np.maximum(live_rows, -(-live_tokens // safe_unit)), 0)
    frozen = [_frozen(a) for a in (live_rows, live_tokens, need, per_unit)]
    return StepDemand(
        *frozen, graph_mode=graph_mode, max_num_seqs=max_num_seqs, num_spec_tokens=num_spec_tokens
    )


def _int_column(steps: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    if name not in steps:
        raise BucketError(f"steps table has no column {name!r}")
    column = np.asarray(steps[name])
    if column.dtype.kind not in "iu":
        raise BucketError(f"steps column {name!r} must hold integers, got dtype {column.dtype}")
    if (column < 0).any():
        row = int(np.argmax(column < 0))
        raise BucketError(f"steps column {name!r} row {row}: negative value {column[row]}")
    return column.astype(np.int64)


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.array(array, dtype=np.int64)
    array.flags.writeable = False
    return array


def _sorted_sizes(sizes: Sequence[int]) -> np.ndarray:
    array = np.array(sorted({int(s) for s in sizes}), dtype=np.int64)
    if array.size == 0 or array[0] < 1:
        raise BucketError(f"graph sizes must be positive integers, at least one; got {sizes}")
    return array


def _bucket(sizes: np.ndarray, need: np.ndarray) -> np.ndarray:
    """``[S], int64``: the smallest size ``>= need``, or 0 where none is."""
    if sizes.size == 0:
        return np.zeros_like(need)
    index = np.searchsorted(sizes, need, side="left")
    return np.where(index < sizes.size, sizes[np.minimum(index, sizes.size - 1)], 0)


@attrs.frozen(eq=False)
class Assignment:
    """The graph each step replays under one size list (the planner's rule).

    Attributes:
        graph_tokens: ``[S], int64`` token capacity of the step's graph; 0 = eager.
        graph_rows: ``[S], int64`` row capacity of the step's graph; 0 = eager.
    """

    graph_tokens: np.ndarray
    graph_rows: np.ndarray


def assign(demand: StepDemand, sizes: Sequence[int]) -> Assignment:
    """Bucket every step as ``compile_plan`` would with ``graph_sizes=sizes``."""
    all_sizes = _sorted_sizes(sizes)
    row_sizes = all_sizes[all_sizes <= demand.max_num_seqs]
    graph_tokens = np.zeros(demand.num_steps, dtype=np.int64)
    graph_rows = np.zeros(demand.num_steps, dtype=np.int64)
    if demand.graph_mode == "none":
        return Assignment(_frozen(graph_tokens), _frozen(graph_rows))
    uniform_rows = np.where(demand.uniform, _bucket(row_sizes, demand.need), 0)
    hit = uniform_rows > 0
    graph_rows[hit] = uniform_rows[hit]
    graph_tokens[hit] = uniform_rows[hit] * demand.per_unit[hit]
    if demand.graph_mode == "mixed":
        tokens = _bucket(all_sizes, demand.tokens)
        rows = _bucket(row_sizes, demand.rows)
        mixed = ~hit & (demand.rows > 0) & (tokens > 0) & (rows > 0)
        graph_tokens[mixed], graph_rows[mixed] = tokens[mixed], rows[mixed]
    return Assignment(_frozen(graph_tokens), _frozen(graph_rows))


@attrs.frozen
class Score:
    """How one size list buckets a simulation's steps.

    Attributes:
        label: what the list is (``vLLM default``, ``optimal``, ...).
        sizes: the graph sizes, ascending.
        steps: steps of the simulation.
        graph_steps: steps that replay a graph.
        live_tokens: tokens of all steps.
        graph_tokens: token capacity of the graphs replayed, summed over steps.
        padded_tokens: padding tokens the graphs add, summed over steps.
    """

    label: str
    sizes: tuple[int, ...]
    steps: int
    graph_steps: int
    live_tokens: int
    graph_tokens: int
    padded_tokens: int

    @property
    def hit_rate(self) -> float:
        """Share of steps that replay a graph."""
        return self.graph_steps / self.steps if self.steps else 0.0

    @property
    def padded_share(self) -> float:
        """Padded tokens over all tokens the GPU processes (live + padded, every step)."""
        total = self.live_tokens + self.padded_tokens
        return self.padded_tokens / total if total else 0.0

    @property
    def padded_share_of_graphs(self) -> float:
        """Padded tokens over the token capacity of the graphs replayed."""
        return self.padded_tokens / self.graph_tokens if self.graph_tokens else 0.0


def score(demand: StepDemand, sizes: Sequence[int], label: str) -> Score:
    """Padding and graph hits of ``sizes`` on the simulation's steps."""
    graphs = assign(demand, sizes).graph_tokens
    hit = graphs > 0
    return Score(
        label=label,
        sizes=tuple(int(s) for s in _sorted_sizes(sizes)),
        steps=demand.num_steps,
        graph_steps=int(hit.sum()),
        live_tokens=int(demand.tokens.sum()),
        graph_tokens=int(graphs.sum()),
        padded_tokens=int((graphs - demand.tokens)[hit].sum()),
    )


def padded_cost(values: np.ndarray, weights: np.ndarray, sizes: Sequence[int]) -> float:
    """The objective: ``sum(weights * (smallest size >= value - value))``.

    ``values`` and ``weights`` are ``[n]`` (int64 and float64); every value
    must fit the largest size.
    """
    array = _sorted_sizes(sizes)
    values = np.asarray(values, dtype=np.int64)
    if values.size and values.max() > array[-1]:
        raise BucketError(f"demand {values.max()} exceeds the largest size {array[-1]}")
    buckets = _bucket(array, values)
    return float((np.asarray(weights, dtype=np.float64) * (buckets - values)).sum())


@attrs.frozen
class Coverage:
    """The steps a reference list covers, as the 1-D problem the optimizer solves.

    Attributes:
        values: ``[n], int64`` demand of every covered step.
        weights: ``[n], int64`` padded tokens per unit of size of each.
        forced: sizes every list must hold: the largest row size ``R`` and the
            largest size ``M`` of the reference.
        forbidden: ``(lo, hi)``: no size may lie in ``(lo, hi]`` (see the module
            docstring), or ``None``.
    """

    values: np.ndarray = attrs.field(eq=False)
    weights: np.ndarray = attrs.field(eq=False)
    forced: tuple[int, ...]
    forbidden: tuple[int, int] | None


def coverage(demand: StepDemand, reference: Sequence[int]) -> Coverage:
    """The steps ``reference`` makes replay a graph, with its largest sizes forced."""
    sizes = _sorted_sizes(reference)
    row_sizes = sizes[sizes <= demand.max_num_seqs]
    if row_sizes.size == 0:
        raise BucketError(f"no size of {tuple(sizes)} is <= max_num_seqs={demand.max_num_seqs}")
    largest, largest_row = int(sizes[-1]), int(row_sizes[-1])
    uniform = demand.uniform & (demand.need <= largest_row)
    values, weights = [demand.need[uniform]], [demand.per_unit[uniform]]
    forbidden = None
    if demand.graph_mode == "mixed":
        mixed = ~uniform & (demand.rows > 0) & (demand.rows <= largest_row)
        mixed &= demand.tokens <= largest
        values.append(demand.tokens[mixed])
        weights.append(np.ones(int(mixed.sum()), dtype=np.int64))
        if largest_row < demand.max_num_seqs < largest:
            forbidden = (largest_row, demand.max_num_seqs)
    elif demand.graph_mode != "full":
        raise BucketError("graph_mode is none: no step replays a graph, nothing to optimize")
    forced = tuple(sorted({largest_row, largest}))
    return Coverage(np.concatenate(values), np.concatenate(weights), forced, forbidden)


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


@attrs.frozen
class Comparison:
    """The optimizer against the default lists on one simulation.

    Attributes:
        scores: one row per list: each default list, then the optimal list with
            its count and its largest sizes, the recommended list, and the floor
            (a graph at every size: the padding no list removes); duplicates
            left out.
        recommended: the optimal list of ``max_graphs`` sizes (vLLM's count when
            not given) up to the largest size of vLLM's whole default list: what
            ``stepplan buckets --write`` writes.
    """

    scores: tuple[Score, ...]
    recommended: Score


def compare_to_defaults(demand: StepDemand, *, max_graphs: int | None = None) -> Comparison:
    """Padding and hits of vLLM's and SGLang's default lists and of the optimizer's.

    The comparison is fair by construction: each default list is first cut to
    the sizes the planner can use (in ``full`` mode, those ``<= max_num_seqs``),
    then to its ``max_graphs`` smallest sizes (how both engines shrink their
    lists when their largest capture size is lowered). The optimizer then gets
    the *same* number of sizes and the *same* largest size and largest row size,
    so the very same steps replay a graph; only the padding differs, and the
    default list itself is one of the lists it searched, so it is never worse.
    ``max_graphs=None`` keeps each default list whole.
    """
    if max_graphs is not None and max_graphs < 1:
        raise BucketError(f"max_graphs must be positive, got {max_graphs}")
    defaults = default_lists(demand.max_num_seqs, demand.num_spec_tokens)
    lists = [(name, usable_sizes(demand, sizes)) for name, sizes in defaults]
    scores: list[Score] = []
    for name, usable in lists:
        kept = usable[:max_graphs]
        scores.append(score(demand, kept, f"{name} ({len(kept)})"))
        chosen = best_sizes(demand, kept, len(kept))
        scores.append(score(demand, chosen, f"optimal, <= {len(kept)} up to {kept[-1]}"))
    vllm = lists[0][1]
    budget = len(vllm) if max_graphs is None else max_graphs
    chosen = best_sizes(demand, vllm, budget)
    recommended = score(demand, chosen, f"optimal, <= {budget} up to {vllm[-1]}")
    # What padding no list of sizes removes: spec rows with fewer than Q tokens.
    floor = score(demand, range(1, vllm[-1] + 1), f"floor: every size up to {vllm[-1]}")
    unique = {(s.label, s.sizes): s for s in [*scores, recommended, floor]}
    return Comparison(tuple(unique.values()), recommended)


def usable_sizes(demand: StepDemand, sizes: Sequence[int]) -> tuple[int, ...]:
    """The sizes the planner can replay: in ``full`` mode only row sizes (``<= max_num_seqs``)."""
    ordered = tuple(int(s) for s in _sorted_sizes(sizes))
    if demand.graph_mode == "mixed":
        return ordered
    return tuple(s for s in ordered if s <= demand.max_num_seqs)


def default_lists(
    max_num_seqs: int, num_spec_tokens: int
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """vLLM's and SGLang's default size lists for these limits, by name."""
    return (
        ("vLLM default", default_graph_sizes(max_num_seqs, num_spec_tokens)),
        ("SGLang default", sglang_default_graph_sizes(max_num_seqs, num_spec_tokens > 0)),
    )


def graph_edges(
    demand: StepDemand, sizes: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The token and row capacities of the graphs ``sizes`` give the kinds of steps
    this simulation has (spec graphs hold ``size * Q`` tokens): bucket edges to draw."""
    all_sizes = _sorted_sizes(sizes)
    row_sizes = all_sizes[all_sizes <= demand.max_num_seqs]
    tokens = {int(s * u) for u in np.unique(demand.per_unit[demand.uniform]) for s in row_sizes}
    if demand.graph_mode == "mixed":
        tokens |= {int(s) for s in all_sizes}
    return tuple(sorted(tokens)), tuple(int(s) for s in row_sizes)


def best_sizes(demand: StepDemand, reference: Sequence[int], max_graphs: int) -> tuple[int, ...]:
    """The optimal list of at most ``max_graphs`` sizes covering what ``reference`` covers."""
    problem = coverage(demand, reference)
    return optimal_sizes(
        problem.values,
        problem.weights,
        max_graphs=max_graphs,
        forced=problem.forced,
        forbidden=problem.forbidden,
    )


def format_table(scores: Sequence[Score]) -> str:
    """The scores as a fixed-width text table, one row per list."""
    header = (
        f"{'sizes list':<38} {'graphs':>6} {'largest':>7} {'hit rate':>8} "
        f"{'padded tokens':>13} {'padded/all':>10} {'padded/graph':>12}"
    )
    lines = [header, "-" * len(header)]
    for s in scores:
        lines.append(
            f"{s.label:<38} {len(s.sizes):>6} {s.sizes[-1]:>7} {s.hit_rate:>8.2%} "
            f"{s.padded_tokens:>13,} {s.padded_share:>10.2%} {s.padded_share_of_graphs:>12.2%}"
        )
    return "\n".join(lines)


def sizes_snippet(sizes: Sequence[int], fmt: str) -> str:
    """``planner.graph_sizes`` as a TOML table or a JSON object, ready for a config file
    (the TOML one is a ``stepplan simulate --config`` file as it is)."""
    values = [int(s) for s in sizes]
    if fmt == "toml":
        return f"[planner]\ngraph_sizes = [{', '.join(map(str, values))}]\n"
    if fmt == "json":
        return json.dumps({"planner": {"graph_sizes": values}}) + "\n"
    raise BucketError(f"snippet format must be toml or json, got {fmt!r}")
