"""The step shapes ``stepplan profile`` measures, and the measuring loop.

:func:`profile_batches` lays out the grid: every CUDA-graph bucket the planner config
can replay for uniform steps (each at full rows at :data:`CONTEXT_LEVELS`, with one long
row among short ones, and once partly filled), and eager steps over a token grid (a
prefill chunk without and with context, spec rows beside one prefill chunk or several, at
each node and between nodes, and from 512 tokens 8-16 chunks in one step; in graph mode
``mixed`` also steps full of spec rows beside a short chunk, which such graphs serve).
The planner decides each batch's graph, so the grid needs no copy of the bucket rule.
:func:`measure` times each batch through a caller's ``run`` (the live engine's timed
step), after warm-up, as the median of repeats taken round the whole grid, planner
compile included: the same work the live engine's measured steps consist of, each after
steps of about its weight and a short stretch of host work, as a live step comes after
the host's scheduling, and each eager run at a token count of its own, as live.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from stepplan.planner import ExecutionPlan, PlanError, Planner, PlannerConfig, StepBatch

from ..progress import CountProgress
from .engine_fit import ProfilePoint, step_shape

#: Context levels (tokens per row, mean) of each measured graph bucket.
CONTEXT_LEVELS = (128, 1024, 4096, 6144)
#: A skewed bucket point: one row at this context, the others at the smallest level.
_LONG_CONTEXT = 7000
#: Host work before each timed repeat: in a live run the GPU waits while the host
#: schedules the next step.
IDLE_GAP_S = 0.002
_GRID_NODES = (2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 2560, 3072)
_GRID_NODES += (4096, 5120, 6144, 7168)
#: Steps of at least this many tokens are also measured with 8 to ``_MANY_CHUNKS``
#: prefill chunks (a burst of short prompts packs a step with them).
_MANY_CHUNKS_FROM, _MANY_CHUNKS = 512, 16


@attrs.frozen
class GridLimits:
    """What the measured engine can hold.

    Attributes:
        max_num_batched_tokens: the token budget of a step (the eager grid's last node).
        num_slots: conv-state and KV slots, slot 0 (NULL) included.
        max_len: KV positions per slot (a row's context plus its query).
        num_groups: layer groups (one slot row each).
    """

    max_num_batched_tokens: int
    num_slots: int
    max_len: int
    num_groups: int = 1


def token_grid(limits: GridLimits) -> tuple[int, ...]:
    """The eager grid's nodes: powers of two and halves up to the token budget, which is one."""
    budget = limits.max_num_batched_tokens
    return tuple(sorted({*(n for n in _GRID_NODES if n < budget), budget}))


@attrs.define
class _Builder:
    """Makes valid batches: distinct slots, contexts that fit the KV cache."""

    config: PlannerConfig
    limits: GridLimits
    rng: np.random.Generator

    def context(self, mean: int, rows: int, q: int) -> np.ndarray:
        """``[rows], int64`` contexts around ``mean`` (at least 1), each leaving room for ``q``."""
        top = max(1, self.limits.max_len - q)
        drawn = self.rng.integers(max(1, mean // 2), max(2, mean * 3 // 2), rows)
        return np.clip(drawn, 1, top)

    def batch(self, q: list[int], computed: list[int], drafts: list[int]) -> StepBatch | None:
        """The batch of these rows, or ``None`` where the engine cannot hold it."""
        rows = len(q)
        if rows == 0 or rows >= self.limits.num_slots or rows > self.config.max_num_seqs:
            return None
        if max(c + n for c, n in zip(computed, q, strict=True)) > self.limits.max_len:
            return None
        slots = self.rng.permutation(np.arange(1, self.limits.num_slots))[:rows]
        return StepBatch(
            query_lens=np.asarray(q, np.int32),
            num_computed_tokens=np.asarray(computed, np.int32),
            slots=np.tile(slots.astype(np.int32), (self.limits.num_groups, 1)),
            num_draft_tokens=np.asarray(drafts, np.int32),
            num_accepted_tokens=np.ones(rows, np.int32),
        )

    def uniform(self, rows: int, mean_context: int) -> StepBatch | None:
        """``rows`` spec rows of ``Q`` tokens (decode rows when ``Q == 1``)."""
        q = self.config.query_len_max
        drafts = [q - 1 if q > 1 else -1] * rows
        computed = self.context(mean_context, rows, q).tolist()
        return self.batch([q] * rows, computed, drafts)

    def skewed(self, rows: int) -> StepBatch | None:
        """``rows`` spec rows at the smallest context level but one at a long context."""
        batch = self.uniform(rows, CONTEXT_LEVELS[0])
        if batch is None:
            return None
        computed = batch.num_computed_tokens.copy()
        computed[0] = min(_LONG_CONTEXT, self.limits.max_len - self.config.query_len_max)
        drafts = batch.num_draft_tokens.tolist()
        return self.batch(batch.query_lens.tolist(), computed.tolist(), drafts)

    def eager(
        self, tokens: int, spec_rows: int, prefill_context: int, prefills: int = 1
    ) -> StepBatch | None:
        """``spec_rows`` spec rows beside ``prefills`` prefill chunks, ``tokens`` in all."""
        q = self.config.query_len_max
        if q == 1:
            spec_rows = 0
        chunk = tokens - spec_rows * q
        if chunk < 2 * prefills:
            return None
        cuts = np.sort(self.rng.choice(np.arange(1, chunk // 2), prefills - 1, replace=False))
        chunks = np.diff(np.concatenate([[0], 2 * cuts, [chunk]])).tolist()
        # Spec rows beside a prefill at any context up to the long one: live steps mix them.
        top = max(2, min(_LONG_CONTEXT, self.limits.max_len - q))
        spec_context = self.rng.integers(1, top, spec_rows).tolist()
        prefill_contexts = [prefill_context, *self.context(512, prefills - 1, 0).tolist()]
        return self.batch(
            [q] * spec_rows + chunks,
            [*spec_context, *prefill_contexts],
            [q - 1] * spec_rows + [-1] * prefills,
        )


def profile_batches(config: PlannerConfig, limits: GridLimits, seed: int = 0) -> list[StepBatch]:
    """Every batch of the grid (see the module docstring), in measuring order."""
    build = _Builder(config, limits, np.random.default_rng(seed))
    batches: list[StepBatch | None] = []
    if config.graph_mode != "none":
        previous = 0
        for size in config.row_sizes:
            batches += [build.uniform(size, level) for level in CONTEXT_LEVELS]
            batches.append(build.skewed(size))
            if size - previous > 1:
                batches.append(build.uniform(previous + 1, CONTEXT_LEVELS[1]))
            previous = size
    nodes = token_grid(limits)
    cap = min(config.max_num_seqs, limits.num_slots) - 1
    for low, high in zip(nodes, (*nodes[1:], None), strict=True):
        spec_rows = int(build.rng.integers(1, max(2, min(cap, low // 8) + 1)))
        batches.append(build.eager(low, 0, 0))
        batches.append(build.eager(low, 0, int(build.rng.integers(1, 4096))))
        batches.append(build.eager(low, spec_rows, int(build.rng.integers(0, 2048))))
        if high is not None and high - low > 1:
            between = int(build.rng.integers(low + 1, high))
            batches.append(build.eager(between, spec_rows, int(build.rng.integers(0, 2048))))
        if low >= 16:  # several prefill chunks in one step
            prefills = int(build.rng.integers(2, 5))
            batches.append(
                build.eager(low, spec_rows // 2, int(build.rng.integers(0, 2048)), prefills)
            )
        if low >= _MANY_CHUNKS_FROM and cap >= 16:  # a burst of short prompts
            prefills = int(build.rng.integers(8, min(_MANY_CHUNKS, cap // 2) + 1))
            batches.append(
                build.eager(low, spec_rows // 2, int(build.rng.integers(0, 2048)), prefills)
            )
        if config.graph_mode == "mixed" and 8 <= low <= config.sizes[-1]:
            batches += _mixed_points(build, low, cap)
    return [batch for batch in batches if batch is not None]


def _mixed_points(build: _Builder, tokens: int, cap: int) -> list[StepBatch | None]:
    """Steps a mixed graph of ``tokens`` tokens serves in a live run: decode-like rows
    filling most of it beside a short chunk, and half of it beside a chunk with context."""
    q = max(build.config.query_len_max, 1)
    full = min(cap, max(1, (tokens - 2) // q))
    return [
        build.eager(tokens, full, int(build.rng.integers(0, 1024))),
        build.eager(tokens, max(1, full // 2), int(build.rng.integers(1024, 6144))),
    ]


#: ``run(plan, token_ids [T] int64, sample_index [S] int64)`` -> ``(wall_s, gpu_s or None,
#: host_s)``: the live engine's timed step.
TimedRun = Callable[[ExecutionPlan, np.ndarray, np.ndarray], tuple[float, float | None, float]]


def _rebuilt(batch: StepBatch) -> StepBatch:
    """A fresh batch of the same arrays: an engine builds (and validates) one every step."""
    return StepBatch(
        query_lens=batch.query_lens.copy(),
        num_computed_tokens=batch.num_computed_tokens.copy(),
        slots=batch.slots.copy(),
        num_draft_tokens=batch.num_draft_tokens.copy(),
        num_accepted_tokens=batch.num_accepted_tokens.copy(),
    )


#: Untimed runs of each shape before its timed ones (compilations, graph capture).
WARMUP_RUNS = 2


def measure(
    batches: Sequence[StepBatch],
    planner: Planner,
    run: TimedRun,
    samples: Callable[[StepBatch], np.ndarray],
    *,
    vocab_size: int,
    repeats: int = 5,
    warmup: int = WARMUP_RUNS,
    seed: int = 0,
    idle_gap_s: float = IDLE_GAP_S,
    progress: CountProgress | None = None,
) -> list[ProfilePoint]:
    """Median wall time of each batch's step as a live run measures it -- the batch built
    and compiled, then ``run`` -- with its GPU and host parts; ``samples(batch)`` gives the
    tokens the engine samples.

    Each batch runs ``warmup`` times first (its compilations and graph capture), then the
    timed repeats go round the batches, each round in a new order (:func:`_round_order`):
    in a live run a step follows steps of about its own weight, never itself, so neither
    a GPU heated by one shape run back to back nor a light step measured just after a
    heavy one is what a live step meets. Before each timed step the host works for
    ``idle_gap_s`` while the GPU idles, as a live host schedules.

    An eager step's every run is of a token count run before by no other (its last
    prefill chunk a few tokens longer or shorter, :func:`fresh_variants`): a live eager
    step almost always has a new token count, and the host's first launch of a shape
    costs more than its next ones (several ms a step, measured on an H200 host), which
    a repeated shape would hide. A point keeps the batch's own shape.
    ``progress`` hears of every run: ``len(batches) * (warmup + repeats)`` in all.
    """
    rng = np.random.default_rng(seed)
    runs = warmup + repeats
    tick = progress.advance if progress is not None else lambda: None
    plans = [planner.compile(batch) for batch in batches]
    reach, seen = _Reach.of(batches), set[int]()
    variants = [fresh_variants(plan, planner, runs, reach, seen) for plan in plans]
    inputs = [
        [(rng.integers(0, vocab_size, b.num_tokens, dtype=np.int64), samples(b)) for b in row]
        for row in variants
    ]
    # A step's weight: its warm-up time, or without warm-up its token count.
    weights = np.array([plan.num_tokens for plan in plans], np.float64)
    for index, (row, row_inputs) in enumerate(zip(variants, inputs, strict=True)):
        for attempt in range(warmup):
            wall_s, _, _ = run(planner.compile(_rebuilt(row[attempt])), *row_inputs[attempt])
            weights[index] = wall_s
            tick()
    timings: list[list[tuple[float, float | None, float]]] = [[] for _ in batches]
    for repeat in range(warmup, runs):
        for index in _round_order(weights, repeat, rng).tolist():
            ids, sampled = inputs[index][repeat]
            _host_work(idle_gap_s)
            start = time.perf_counter()
            plan = planner.compile(_rebuilt(variants[index][repeat]))
            planning_s = time.perf_counter() - start
            wall_s, gpu_s, host_s = run(plan, ids, sampled)
            timings[index].append((planning_s + wall_s, gpu_s, planning_s + host_s))
            tick()
    return [_point(plan, rows) for plan, rows in zip(plans, timings, strict=True) if rows]


@attrs.frozen
class _Reach:
    """What a variant may not pass: the grid's largest step and longest row (its token
    budget and KV positions)."""

    tokens: int
    row_end: int

    @classmethod
    def of(cls, batches: Sequence[StepBatch]) -> _Reach:
        ends = [int((b.num_computed_tokens + b.query_lens).max()) for b in batches if b.num_rows]
        return cls(max((b.num_tokens for b in batches), default=0), max(ends, default=0))


def _round_order(weights: np.ndarray, repeat: int, rng: np.random.Generator) -> np.ndarray:
    """One round's order: by the warm-up's time, jittered by up to 25% and turned round
    every other round, so a step follows steps of about its own weight (live, a batch
    changes little from one step to the next) but never the same ones."""
    order = np.argsort(weights * rng.uniform(0.8, 1.25, weights.size), kind="stable")
    return order[::-1] if repeat % 2 else order


def fresh_variants(
    plan: ExecutionPlan, planner: Planner, count: int, reach: _Reach, seen: set[int]
) -> list[StepBatch]:
    """``count`` batches to run for ``plan``'s batch: itself ``count`` times for a graph
    step; for an eager one, copies whose last prefill chunk is ``+1, -1, +2, -2, ...``
    tokens longer (only shorter where longer passes ``reach``), each still an eager step
    of a token count not in ``seen`` (which takes it). Where too few such copies lie
    near, the batch itself stands in for the rest."""
    batch = plan.batch
    if plan.graph is not None:
        return [batch] * count
    prefill = np.flatnonzero(batch.num_draft_tokens < 0)
    if prefill.size == 0:
        return [batch] * count
    last = int(prefill[-1])
    variants: list[StepBatch] = []
    for step in range(1, 8 * count + 1):
        delta = (step + 1) // 2 * (1 if step % 2 else -1)
        if batch.num_tokens + delta in seen:
            continue
        variant = _shifted(batch, last, delta, planner, reach)
        if variant is not None:
            variants.append(variant)
            seen.add(variant.num_tokens)
        if len(variants) == count:
            return variants
    return variants + [batch] * (count - len(variants))


def _shifted(
    batch: StepBatch, row: int, delta: int, planner: Planner, reach: _Reach
) -> StepBatch | None:
    """``batch`` with row ``row``'s chunk ``delta`` tokens longer, if that is an eager
    step of ``planner`` within ``reach``."""
    query = batch.query_lens.copy()
    query[row] += delta
    end = int(batch.num_computed_tokens[row]) + int(query[row])
    if query[row] < 2 or batch.num_tokens + delta > reach.tokens or end > reach.row_end:
        return None
    try:
        shifted = attrs.evolve(batch, query_lens=query)
        plan = planner.compile(shifted)
    except PlanError:
        return None
    return shifted if plan.graph is None else None


def _point(plan: ExecutionPlan, timings: list[tuple[float, float | None, float]]) -> ProfilePoint:
    walls, gpus, hosts = zip(*timings, strict=True)
    gpu = None if gpus[0] is None else float(np.median(gpus)) * 1e6  # type: ignore[arg-type]
    point = ProfilePoint(step_shape(plan), float(np.median(walls)) * 1e6, gpu)
    return attrs.evolve(point, host_us=float(np.median(hosts)) * 1e6)


def _host_work(seconds: float) -> None:
    """Keep the host busy for ``seconds`` with small allocations and array operations, as
    a scheduler between two steps does (the GPU idles meanwhile)."""
    deadline = time.perf_counter() + seconds
    scratch: dict[int, list[int]] = {}
    while time.perf_counter() < deadline:
        values = np.arange(64) * 3
        scratch[len(scratch) % 97] = values[values % 2 == 0].tolist()


def graph_batches(config: PlannerConfig, num_groups: int) -> list[tuple[str, int, StepBatch]]:
    """``(kind, size, batch)`` of one step per CUDA graph ``config`` can capture: a uniform
    graph of each row size (spec rows, decode rows when ``Q == 1``) and, in graph mode
    ``mixed``, a mixed graph of each size of two tokens or more (one prefill chunk)."""
    if config.graph_mode == "none":
        return []
    q = config.query_len_max
    found = []
    for size in config.row_sizes:
        slots = np.arange(1, size + 1, dtype=np.int32)
        batch = StepBatch(
            query_lens=np.full(size, q, np.int32),
            num_computed_tokens=np.ones(size, np.int32),
            slots=np.tile(slots, (num_groups, 1)),
            num_draft_tokens=np.full(size, q - 1 if q > 1 else -1, np.int32),
            num_accepted_tokens=np.ones(size, np.int32),
        )
        found.append(("spec" if q > 1 else "decode", int(size), batch))
    if config.graph_mode == "mixed":
        for size in (s for s in config.sizes if s >= 2):
            batch = StepBatch(
                query_lens=np.array([size], np.int32),
                num_computed_tokens=np.zeros(1, np.int32),
                slots=np.ones((num_groups, 1), np.int32),
                num_draft_tokens=np.array([-1], np.int32),
                num_accepted_tokens=np.ones(1, np.int32),
            )
            found.append(("mixed", int(size), batch))
    return found


def graph_memory(
    batches: Sequence[tuple[str, int, StepBatch]],
    planner: Planner,
    capture: Callable[[ExecutionPlan], None],
    free_bytes: Callable[[], int],
) -> dict[tuple[str, int], float]:
    """MiB of device memory each graph's capture takes (``free_bytes`` before less after
    ``capture``), by ``(kind, size)``, captured in the order given (ascending sizes: the
    graphs share the engine's pool, as in serving, and the first capture also holds the
    engine's one-time graph buffers, which every list pays)."""
    memory: dict[tuple[str, int], float] = {}
    for kind, size, batch in batches:
        plan = planner.compile(batch)
        if plan.graph is None or plan.graph.kind != kind:
            continue  # the planner gives this shape another graph: not this kind's
        before = free_bytes()
        capture(plan)
        memory[kind, size] = max(0.0, (before - free_bytes()) / 2**20)
    return memory
