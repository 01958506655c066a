"""Choose CUDA-graph sizes for a workload: exact dynamic programming over its step sizes.

Which graph a step replays under a list of sizes is the planner's bucket rule,
:mod:`stepplan.planner.buckets`: this module asks it (:func:`assign`, :func:`coverage`)
and uses its terms (row sizes; a uniform step's ``need`` and tokens per unit ``u``).

The 1-D problem the optimizer solves, and why its dynamic program is exact:
:mod:`stepplan.sim.buckets.size_dp`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import attrs
import numpy as np

from stepplan.planner import GRAPH_MODES, PlanError, PlannerConfig, default_graph_sizes
from stepplan.planner.buckets import (
    DECODE_GRAPH,
    MIXED_GRAPH,
    SPEC_GRAPH,
    GraphChoices,
    choose_graphs,
    uniform_demand,
)

from ..results.schema import KIND_ROWS, KIND_TOKENS, STEP_COUNT
from .size_dp import BucketError, optimal_sizes, padded_cost, sorted_sizes

__all__ = [  # the optimizer's names, wherever they live
    "Assignment",
    "BucketError",
    "Comparison",
    "Coverage",
    "Score",
    "StepDemand",
    "assign",
    "best_sizes",
    "compare_to_defaults",
    "coverage",
    "default_lists",
    "format_table",
    "graph_edges",
    "optimal_sizes",
    "padded_cost",
    "row_context_of",
    "score",
    "sglang_default_graph_sizes",
    "sizes_snippet",
    "step_demand",
    "usable_sizes",
]


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
        kind_rows: ``[3, S], int64`` live spec, decode and prefill rows of each step.
        rows: ``[S], int64`` live rows of each step.
        tokens: ``[S], int64`` live tokens of each step.
        need: ``[S], int64`` size a uniform step needs; 0 for other steps.
        per_unit: ``[S], int64`` tokens per size of a uniform step's graph
            (``Q`` spec, ``1`` decode); 0 for other steps.
        counts: ``[S], int64`` steps each entry stands for: 1 each for a run's every
            step, more for its distinct step shapes (``results.step_shapes``: a long run
            is read a chunk at a time into its few shapes).
        graph_mode: the planner's graph mode (``none``, ``full``, ``mixed``).
        max_num_seqs: the planner's row limit; row sizes are the sizes up to it.
        num_spec_tokens: drafts per spec row (``Q - 1``) the demand was read with.
        row_context: mean KV entries a spec or decode row attends over, per row and step
            of the run (0: unknown; then times are predicted at zero context).
    """

    kind_rows: np.ndarray
    rows: np.ndarray
    tokens: np.ndarray
    need: np.ndarray
    per_unit: np.ndarray
    counts: np.ndarray
    graph_mode: str
    max_num_seqs: int
    num_spec_tokens: int
    row_context: int = 0

    @property
    def num_steps(self) -> int:
        """Steps of the simulation (the entries' counts added)."""
        return int(self.counts.sum())

    @property
    def uniform(self) -> np.ndarray:
        """``[S], bool`` the steps that are pure spec or pure decode."""
        return self.per_unit > 0


def step_demand(
    steps: Mapping[str, np.ndarray],
    *,
    num_spec_tokens: int,
    graph_mode: str,
    max_num_seqs: int,
    row_context: int = 0,
) -> StepDemand:
    """The demand of every step of a simulation's step table.

    Reads the columns ``num_spec_rows``, ``num_decode_rows``, ``num_prefill_rows``,
    ``num_spec_decode_tokens``, ``num_decode_tokens``, ``num_prefill_tokens`` (each
    ``[S]``, integer) of ``steps.csv`` (``schema.KIND_ROWS``, ``schema.KIND_TOKENS``),
    and ``schema.STEP_COUNT`` where the rows are distinct step shapes.
    """
    if row_context < 0:
        raise BucketError(f"row_context must be >= 0, got {row_context}")
    rows = [_int_column(steps, name) for name in KIND_ROWS.values()]
    tokens = [_int_column(steps, name) for name in KIND_TOKENS.values()]
    lengths = {len(column) for column in rows + tokens}
    if len(lengths) != 1:
        raise BucketError(f"step columns have different lengths: {sorted(lengths)}")
    if graph_mode not in GRAPH_MODES:
        raise BucketError(f"graph_mode must be one of {GRAPH_MODES}, got {graph_mode!r}")
    live_rows, live_tokens = rows[0] + rows[1] + rows[2], tokens[0] + tokens[1] + tokens[2]
    per_unit, need = uniform_demand(*rows, live_tokens, num_spec_tokens + 1)
    counts = _int_column(steps, STEP_COUNT) if STEP_COUNT in steps else np.ones_like(live_rows)
    arrays = (np.stack(rows), live_rows, live_tokens, need, per_unit, counts)
    frozen = [_frozen(a) for a in arrays]
    return StepDemand(
        *frozen,
        graph_mode=graph_mode,
        max_num_seqs=max_num_seqs,
        num_spec_tokens=num_spec_tokens,
        row_context=row_context,
    )


def row_context_of(
    prompt_tokens: np.ndarray, output_tokens: np.ndarray, num_steps: np.ndarray
) -> int:
    """Mean KV entries a row attends over, per request and step it was scheduled in:
    a request's context grows from its prompt to prompt plus output, so its steps see
    ``prompt + output / 2`` on average (each ``[R]``, integer, ``requests.csv``'s
    columns). 0 without steps."""
    steps = np.asarray(num_steps, dtype=np.float64)
    if not steps.sum() > 0:
        return 0
    context = np.asarray(prompt_tokens, np.float64) + np.asarray(output_tokens, np.float64) / 2
    return round(float(context @ steps / steps.sum()))


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


def _graphs(demand: StepDemand, sizes: np.ndarray) -> GraphChoices:
    """The graph of every step under ``sizes``: the planner's rule, with the config the
    simulation would plan with (a setting the planner refuses is a :class:`BucketError`)."""
    try:
        config = PlannerConfig(
            num_spec_tokens=demand.num_spec_tokens,
            graph_mode=demand.graph_mode,
            graph_sizes=sizes.tolist(),
            max_num_seqs=demand.max_num_seqs,
        )
    except PlanError as exc:
        raise BucketError(str(exc)) from None
    return choose_graphs(config, *demand.kind_rows, demand.tokens)


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
    graphs = _graphs(demand, sorted_sizes(sizes))
    return Assignment(graphs.num_tokens, graphs.num_rows)


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
    hit, counts = graphs > 0, demand.counts
    return Score(
        label=label,
        sizes=tuple(int(s) for s in sorted_sizes(sizes)),
        steps=demand.num_steps,
        graph_steps=int(counts[hit].sum()),
        live_tokens=int((demand.tokens * counts).sum()),
        graph_tokens=int((graphs * counts).sum()),
        padded_tokens=int(((graphs - demand.tokens) * counts)[hit].sum()),
    )


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
    sizes = sorted_sizes(reference)
    row_sizes = sizes[sizes <= demand.max_num_seqs]
    if row_sizes.size == 0:
        raise BucketError(f"no size of {tuple(sizes)} is <= max_num_seqs={demand.max_num_seqs}")
    largest, largest_row = int(sizes[-1]), int(row_sizes[-1])
    if demand.graph_mode == "none":
        raise BucketError("graph_mode is none: no step replays a graph, nothing to optimize")
    kind = _graphs(demand, sizes).kind
    uniform = (kind == SPEC_GRAPH) | (kind == DECODE_GRAPH)
    mixed = kind == MIXED_GRAPH
    values = [demand.need[uniform], demand.tokens[mixed]]
    weights = [demand.per_unit[uniform] * demand.counts[uniform], demand.counts[mixed]]
    forbidden = None
    if demand.graph_mode == "mixed" and largest_row < demand.max_num_seqs < largest:
        forbidden = (largest_row, demand.max_num_seqs)
    forced = tuple(sorted({largest_row, largest}))
    return Coverage(np.concatenate(values), np.concatenate(weights), forced, forbidden)


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
    ordered = tuple(int(s) for s in sorted_sizes(sizes))
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
    all_sizes = sorted_sizes(sizes)
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
