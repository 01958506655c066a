"""Step shapes and the fit of their measured times: what the cost model predicts from an
engine profile (:mod:`stepplan.sim.timing.engine_profile`).

**What a step's time depends on** (:class:`StepShape`): whether it replays a CUDA graph and
which (a graph's dense work is fixed by its bucket), its live tokens and rows per kind, the
prefill work tiles, the context its decode-like rows read (``context_tokens``: the KV
entries spec and decode rows attend over) and the query-key pairs of its prefill rows
(``prefill_pairs``). Time is the engine's whole step as the runner sees it: the plan, the
host-side metadata and upload, the GPU work and the read-back of the sampled tokens.

**The fit** (:class:`EngineFit`) is three linear models, weighted so that least squares
minimises *relative* error (the figure of merit is the per-step MAPE):

- uniform graph steps (spec, decode): one base time per bucket, a slope in
  ``context_tokens`` per bucket measured at three or more contexts (attention's cost per
  KV entry falls as a bucket's rows grow: few rows leave the GPU part idle) and a shared
  one for the others, a slope in ``max_context`` per bucket whose own points tell it
  apart from context (how long one long row keeps the GPU depends on how many rows
  share it) and a shared one for the others, plus shared slopes in ``prefill_pairs``
  and live rows;
- eager steps: a piecewise-linear function of the live tokens over the profile's token grid
  (hat functions at its nodes), plus slopes in ``context_tokens``, ``prefill_pairs``, rows
  per kind, tiles, decode-like rows times tokens (attention's launch grid covers every
  row for the step's longest query), ``max_context`` and ``prefill_context``;
- mixed graphs (graph mode ``mixed``): the same form over the *bucket's* tokens (its dense
  work is the bucket's), with the bucket's rows and rows times tokens in place of the
  live ones for attention's grid.

Coverage: ``docs/profile_format.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs
import numpy as np

#: A bucket measured at this many distinct contexts or more gets a context slope of its own.
_OWN_SLOPE_CONTEXTS = 3
#: Slopes extrapolate to at most this multiple of the largest measured feature.
_EXTRAPOLATION = 2.0


@attrs.frozen
class StepShape:
    """What an engine step's time depends on (see the module docstring).

    Attributes:
        graph: ``(kind, tokens, rows, tiles)`` of the CUDA graph replayed, ``None`` eager.
        rows: live rows per kind, ``(spec, decode, prefill)``.
        tokens: live tokens per kind, in that order.
        tiles: live prefill work tiles.
        context_tokens: ``sum(num_computed)`` over spec and decode rows.
        prefill_pairs: ``sum(q * (num_computed + (q + 1) / 2))`` over prefill rows.
        max_context: the longest context of a spec or decode row (attention's longest
            row: a few long rows leave most of the GPU idle while they finish).
        prefill_context: the longest key range of a prefill row (its context plus its
            chunk), for the same reason.
    """

    graph: tuple[str, int, int, int] | None
    rows: tuple[int, int, int]
    tokens: tuple[int, int, int]
    tiles: int
    context_tokens: int
    prefill_pairs: float
    max_context: int = 0
    prefill_context: int = 0

    @property
    def num_tokens(self) -> int:
        """Live tokens."""
        return sum(self.tokens)

    @property
    def num_rows(self) -> int:
        """Live rows."""
        return sum(self.rows)

    def to_json(self) -> dict[str, Any]:
        """The shape as the profile's ``points`` entries hold it."""
        return {
            "graph": None if self.graph is None else list(self.graph),
            "rows": list(self.rows),
            "tokens": list(self.tokens),
            "tiles": self.tiles,
            "context_tokens": self.context_tokens,
            "prefill_pairs": self.prefill_pairs,
            "max_context": self.max_context,
            "prefill_context": self.prefill_context,
        }


def step_shape(plan: Any) -> StepShape:
    """The :class:`StepShape` of an ``ExecutionPlan`` (its batch gives the contexts)."""
    batch = plan.batch
    kinds, q = batch.kinds, batch.query_lens.astype(np.float64)
    computed = batch.num_computed_tokens.astype(np.int64)
    prefill = kinds == 2
    decoding = kinds <= 1
    pairs = float(q[prefill] @ (computed[prefill] + (q[prefill] + 1.0) * 0.5))
    contexts = computed[decoding]
    graph = plan.graph
    key = None if graph is None else (graph.kind, graph.num_tokens, graph.num_rows, graph.num_tiles)
    return StepShape(
        graph=key,
        rows=(plan.num_spec_rows, plan.num_decode_rows, plan.num_prefill_rows),
        tokens=(plan.num_spec_decode_tokens, plan.num_decode_tokens, plan.num_prefill_tokens),
        tiles=plan.num_tiles,
        context_tokens=int(contexts.sum()),
        prefill_pairs=pairs,
        max_context=int(contexts.max()) if contexts.size else 0,
        prefill_context=int((computed[prefill] + q[prefill]).max()) if prefill.any() else 0,
    )


@attrs.frozen
class ProfilePoint:
    """One measured step shape: median wall, GPU and host time over the profile's repeats
    (host: building and planning the step, and the runner's work until its GPU work is
    launched)."""

    shape: StepShape
    wall_us: float
    gpu_us: float | None = None
    host_us: float | None = None


def _graph_features(shape: StepShape) -> list[float]:
    return [
        float(shape.context_tokens),
        shape.prefill_pairs,
        float(shape.num_rows),
        float(shape.max_context),
    ]


def _hats(nodes: np.ndarray, tokens: float) -> np.ndarray:
    """``[len(nodes)]`` weights of the piecewise-linear basis at ``tokens`` (inside the grid)."""
    weights = np.zeros(nodes.size)
    index = int(np.searchsorted(nodes, tokens, side="right")) - 1
    index = min(max(index, 0), nodes.size - 1)
    if index == nodes.size - 1:
        weights[index] = 1.0
        return weights
    low, high = nodes[index], nodes[index + 1]
    share = (tokens - low) / (high - low)
    weights[index], weights[index + 1] = 1.0 - share, share
    return weights


def _eager_features(shape: StepShape) -> list[float]:
    # Decode-like rows times tokens: attention's grid spans every row for the longest query.
    decoding = shape.rows[0] + shape.rows[1]
    return [
        float(shape.context_tokens),
        shape.prefill_pairs,
        *(float(r) for r in shape.rows),
        float(shape.tiles),
        float(decoding * shape.num_tokens),
        float(shape.max_context),
        float(shape.prefill_context),
    ]


def _mixed_features(shape: StepShape) -> list[float]:
    # A mixed graph runs its bucket's rows, and attention's grid spans them all for the
    # bucket's token count (the longest query it can hold).
    assert shape.graph is not None
    _, tokens, rows, _ = shape.graph
    return [
        float(shape.context_tokens),
        shape.prefill_pairs,
        *(float(r) for r in shape.rows),
        float(shape.tiles),
        float(rows * tokens),
        float(shape.max_context),
        float(rows),
        float(shape.prefill_context),
    ]


def _weighted_fit(design: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Least squares of relative error: rows scaled by ``1 / measured``."""
    scale = 1.0 / measured
    solution, *_ = np.linalg.lstsq(design * scale[:, None], measured * scale, rcond=None)
    return solution


@attrs.frozen(eq=False)
class _Span:
    """What a fit's measured rows determine: a prediction with a part along the directions
    they leave free (their design's null space) is the solver's choice, not a measurement's.
    A column no measured row touches is free by itself; it is kept apart, so a fit whose
    other columns are all determined checks a row without linear algebra.

    Attributes:
        unmeasured: ``[U], int64`` the design columns that are zero in every measured row.
        measured: ``[M], int64`` the others.
        free: ``[M, k], float64`` a basis of the free directions over ``measured`` in units
            of each column's scale, divided by that scale (a design row multiplies it as
            it is).
        units: ``[M], float64`` one over each measured column's scale.
    """

    unmeasured: np.ndarray
    measured: np.ndarray
    free: np.ndarray
    units: np.ndarray

    @classmethod
    def of(cls, design: np.ndarray, scale: np.ndarray) -> _Span:
        """The span of ``design``'s rows, its columns measured in ``scale``."""
        touched = np.abs(design).max(axis=0, initial=0.0) > 0
        unmeasured, measured = np.flatnonzero(~touched), np.flatnonzero(touched)
        scale = scale[measured]
        _, values, rows = np.linalg.svd(design[:, measured] / scale, full_matrices=True)
        cut = values.max(initial=0.0) * max(design.shape) * np.finfo(float).eps
        free = rows[int((values > cut).sum()) :].T
        unmeasured.flags.writeable = measured.flags.writeable = False
        return cls(unmeasured, measured, _frozen(free / scale[:, None]), _frozen(1.0 / scale))

    def covers(self, vector: np.ndarray) -> bool:
        """Whether ``vector`` (a design row) is a combination of the measured rows."""
        if vector[self.unmeasured].any():
            return False
        if not self.free.shape[1]:
            return True
        checked = vector[self.measured]
        along = np.abs(checked @ self.free).max()
        return bool(along <= 1e-6 * max(np.abs(checked * self.units).max(), 1.0))


def _token_span(design: np.ndarray, nodes: int, limits: np.ndarray) -> _Span:
    """A token model's span: hats in their own units, features in their largest measured
    value (one where never measured: that column is unmeasured anyway)."""
    return _Span.of(design, np.concatenate([np.ones(nodes), np.where(limits > 0, limits, 1.0)]))


@attrs.frozen(eq=False)
class TokenModel:
    """A step time piecewise linear in a token count (hat functions at ``nodes``) plus
    slopes in other features: the model of eager steps (their live tokens) and of mixed
    graphs (their bucket's tokens).

    Attributes:
        nodes: ``[N], float64`` the token grid (empty: nothing measured).
        node_us: ``[N], float64`` the base time at each node.
        slopes: ``[F], float64`` µs per unit of each feature.
        limits: ``[F], float64`` the largest measured value of each feature.
        span: what the measured steps determine over the ``N + F`` design columns.
    """

    nodes: np.ndarray
    node_us: np.ndarray
    slopes: np.ndarray
    limits: np.ndarray
    span: _Span

    @classmethod
    def fit(
        cls,
        tokens: Sequence[float],
        features: Sequence[Sequence[float]],
        wall_us: Sequence[float],
        nodes: Sequence[float],
        width: int,
    ) -> TokenModel:
        """The least-relative-error model of measured steps (none: an empty model)."""
        if not wall_us:
            empty = _frozen(np.zeros(0))
            zeros = _frozen(np.zeros(width))
            return cls(empty, empty, zeros, zeros, _token_span(np.zeros((0, width)), 0, zeros))
        grid = np.asarray(sorted(set(nodes)), dtype=np.float64)
        design = np.array(
            [[*_hats(grid, t), *f] for t, f in zip(tokens, features, strict=True)], np.float64
        )
        solution = _weighted_fit(design, np.asarray(wall_us, np.float64))
        limits = _frozen(design[:, grid.size :].max(axis=0))
        return cls(
            _frozen(grid),
            _frozen(solution[: grid.size]),
            _frozen(solution[grid.size :]),
            limits,
            _token_span(design, grid.size, limits),
        )

    def predict_us(self, tokens: float, features: Sequence[float]) -> float | None:
        """The time at ``tokens`` and ``features``; ``None`` outside the grid, where a
        feature passes :data:`_EXTRAPOLATION` times its largest measured value, or where
        the measurements do not determine the step's time."""
        if not self.nodes.size or not self.nodes[0] <= tokens <= self.nodes[-1]:
            return None
        values = np.asarray(features, np.float64)
        if (values > self.limits * _EXTRAPOLATION).any():
            return None
        hats = _hats(self.nodes, tokens)
        if not self.span.covers(np.concatenate([hats, values])):
            return None
        return float(hats @ self.node_us + values @ self.slopes)


@attrs.frozen(eq=False)
class EngineFit:
    """The fitted step-time models of one profile (see the module docstring).

    Attributes:
        buckets: uniform graph key -> its base time (µs).
        context_us: uniform graph key -> µs per context token (its own or the shared).
        long_row_us: uniform graph key -> µs per token of ``max_context`` (its own or
            the shared).
        graph_slopes: ``[2]`` µs per unit of ``prefill_pairs`` and of live rows.
        graph_limits: the largest measured value of each of :func:`_graph_features`' four.
        eager: eager steps over their live tokens.
        mixed: mixed graphs over their bucket's tokens.
    """

    buckets: Mapping[tuple[str, int, int, int], float]
    context_us: Mapping[tuple[str, int, int, int], float]
    long_row_us: Mapping[tuple[str, int, int, int], float]
    graph_slopes: np.ndarray
    graph_limits: np.ndarray
    eager: TokenModel
    mixed: TokenModel

    def predict_us(self, shape: StepShape) -> float | None:
        """The step's predicted time in µs, or ``None`` where the profile does not cover it."""
        if shape.graph is None:
            return self.eager.predict_us(shape.num_tokens, _eager_features(shape))
        if shape.graph[0] == "mixed":
            return self.mixed.predict_us(shape.graph[1], _mixed_features(shape))
        base = self.buckets.get(shape.graph)
        features = np.asarray(_graph_features(shape))
        if base is None or (features > self.graph_limits * _EXTRAPOLATION).any():
            return None
        context = float(features[0]) * self.context_us[shape.graph]
        long_row = float(features[3]) * self.long_row_us[shape.graph]
        return base + context + long_row + float(features[1:3] @ self.graph_slopes)


def _tells_apart(design: np.ndarray) -> bool:
    """Whether ``design``'s columns (one bucket's points) are linearly independent."""
    scaled = design / np.maximum(np.abs(design).max(axis=0), 1.0)
    return bool(np.linalg.matrix_rank(scaled) == design.shape[1])


def _fit_buckets(points: Sequence[ProfilePoint]) -> tuple[dict, dict, dict, np.ndarray, np.ndarray]:
    """``base, context_us, long_row_us, slopes, limits``: a base per bucket; a context
    slope per bucket measured at :data:`_OWN_SLOPE_CONTEXTS` contexts or more, and a
    ``max_context`` slope per such bucket whose points tell it from context (shared
    slopes for the others); shared slopes in pairs and rows; each feature's maximum."""
    if not points:
        return {}, {}, {}, np.zeros(2), np.zeros(4)
    keys = sorted({p.shape.graph for p in points})  # type: ignore[type-var]
    index = {key: i for i, key in enumerate(keys)}
    features = np.array([_graph_features(p.shape) for p in points])
    graphs = [p.shape.graph for p in points]
    own_context, own_long = [], []
    for key in keys:
        mine = features[[g == key for g in graphs]]
        if len(set(mine[:, 0])) >= _OWN_SLOPE_CONTEXTS:
            own_context.append(key)
            ones = np.ones((len(mine), 1))
            if _tells_apart(np.hstack([ones, mine[:, [0, 3]]])):
                own_long.append(key)
    # Columns: bases, own context slopes, own long-row slopes, then the shared context,
    # pairs, rows and long-row slopes.
    context_column = {key: len(keys) + i for i, key in enumerate(own_context)}
    long_column = {key: len(keys) + len(own_context) + i for i, key in enumerate(own_long)}
    shared = len(keys) + len(own_context) + len(own_long)
    design = np.zeros((len(points), shared + 4))
    for row, key in enumerate(graphs):
        design[row, index[key]] = 1.0  # type: ignore[index]
        design[row, context_column.get(key, shared)] = features[row, 0]
        design[row, shared + 1 : shared + 3] = features[row, 1:3]
        design[row, long_column.get(key, shared + 3)] = features[row, 3]
    solution = _weighted_fit(design, np.array([p.wall_us for p in points]))
    base = {key: float(solution[i]) for key, i in index.items()}
    context_us = {key: float(solution[context_column.get(key, shared)]) for key in keys}
    long_row_us = {key: float(solution[long_column.get(key, shared + 3)]) for key in keys}
    slopes = solution[shared + 1 : shared + 3]
    return base, context_us, long_row_us, slopes, features.max(axis=0)


def fit_points(points: Sequence[ProfilePoint], token_grid: Sequence[int]) -> EngineFit:
    """Fit :class:`EngineFit` to measured points (pure: equal points give an equal fit)."""
    uniform = [p for p in points if p.shape.graph is not None and p.shape.graph[0] != "mixed"]
    mixed = [p for p in points if p.shape.graph is not None and p.shape.graph[0] == "mixed"]
    eager = [p for p in points if p.shape.graph is None]
    base, context_us, long_row_us, slopes, limits = _fit_buckets(uniform)
    # The mixed model's grid: the token grid within the buckets measured, and their ends.
    sizes = [p.shape.graph[1] for p in mixed]  # type: ignore[index]
    mixed_nodes = [n for n in token_grid if sizes and min(sizes) <= n <= max(sizes)]
    mixed_nodes += [min(sizes), max(sizes)] if sizes else []
    return EngineFit(
        buckets=MappingProxyType(base),
        context_us=MappingProxyType(context_us),
        long_row_us=MappingProxyType(long_row_us),
        graph_slopes=_frozen(slopes),
        graph_limits=_frozen(limits),
        eager=TokenModel.fit(
            [p.shape.num_tokens for p in eager],
            [_eager_features(p.shape) for p in eager],
            [p.wall_us for p in eager],
            token_grid,
            width=9,
        ),
        mixed=TokenModel.fit(
            sizes,
            [_mixed_features(p.shape) for p in mixed],
            [p.wall_us for p in mixed],
            mixed_nodes,
            width=10,
        ),
    )


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.array(array, dtype=np.float64)
    array.flags.writeable = False
    return array
