"""The bucket rule: which CUDA graph a step replays, for one step or for many at once.

A config's graph sizes (:attr:`PlannerConfig.sizes`) serve two axes: as token counts,
and, those ``<= max_num_seqs`` (:attr:`PlannerConfig.row_sizes`), as row counts. A step
is described by its live rows per kind (spec, decode, prefill) and the tokens its graph
must hold: its live tokens, or the engine's padded token count where that is larger.

* In graph mode ``none``, and for a step without live rows, the step runs eagerly.
* A *uniform* step (every live row spec, or every live row decode) has a demand of
  ``need = max(rows, ceil(tokens / u))`` units, ``u = Q`` tokens per spec row and ``1``
  per decode row. It takes the smallest row size ``s >= need`` and replays a ``spec``
  (or ``decode``) graph of ``s`` rows, ``s * u`` tokens and no prefill tiles.
* In graph mode ``mixed``, every other step, and a uniform one that no row size fits,
  takes the smallest size ``>= tokens`` for its tokens and the smallest row size
  ``>= rows`` for its rows: a ``mixed`` graph, with room for the most prefill tiles a
  step of that many tokens and rows can need (:func:`tile_capacity`).
* Every other step runs eagerly: in mode ``full`` the non-uniform ones, in any mode
  the ones no size fits.

:func:`choose_graph` is the rule for one step (what ``compile_plan`` and ``Planner``
ask); :func:`choose_graphs` the same rule over arrays of steps (what the simulator's
bucket analysis and the graph-size optimizer ask). A test holds the two equal.
"""

from __future__ import annotations

import attrs
import numpy as np

from .config import PlannerConfig
from .layout import PlanLayout
from .plan import GraphKey

#: Graph kinds; :attr:`GraphChoices.kind` codes them ``1 + index``, with 0 for eager.
GRAPH_KINDS = ("spec", "decode", "mixed")
EAGER, SPEC_GRAPH, DECODE_GRAPH, MIXED_GRAPH = 0, 1, 2, 3


def may_replay(graph_mode: str, spec: int, decode: int, prefill: int) -> bool:
    """Whether some size list could give a step of these live rows per kind a graph: the
    rule's first test, which needs no sizes."""
    live = spec + decode + prefill
    if graph_mode == "mixed":
        return live > 0
    return graph_mode == "full" and live > 0 and live in (spec, decode)


def tile_capacity(tokens: int, rows: int, tile_tokens: int) -> int:
    """Prefill tiles of ``tile_tokens`` tokens any step of ``tokens`` tokens and ``rows``
    rows can need (ints, or int arrays of one shape: then an array).

    Prefill rows have ``q >= 2``, so such a step holds at most ``min(rows, tokens / 2)``
    of them, and ``sum(ceil(q / tile)) <= prefill rows + tokens / tile``.
    """
    if isinstance(tokens, np.ndarray):  # the vectorized rule's; plain ints stay ints
        return np.minimum(rows, tokens // 2) + tokens // tile_tokens  # type: ignore[return-value]
    return min(rows, tokens // 2) + tokens // tile_tokens


def choose_graph(
    config: PlannerConfig, spec: int, decode: int, prefill: int, tokens: int
) -> GraphKey | None:
    """The graph a step of ``spec``, ``decode`` and ``prefill`` live rows replays when its
    graph must hold ``tokens`` tokens; ``None``: it runs eagerly (see the module
    docstring)."""
    mode = config.graph_mode
    if not may_replay(mode, spec, decode, prefill):
        return None
    live = spec + decode + prefill
    if live in (spec, decode):
        per_row = config.query_len_max if spec else 1
        rows = config.smallest_size(max(live, -(-tokens // per_row)), rows=True)
        if rows is not None:
            return GraphKey("spec" if spec else "decode", rows * per_row, rows, 0)
    if mode != "mixed":
        return None
    graph_tokens = config.smallest_size(tokens)
    rows = config.smallest_size(live, rows=True)
    if graph_tokens is None or rows is None:
        return None
    tiles = tile_capacity(graph_tokens, rows, config.prefill_tile_tokens)
    return GraphKey("mixed", graph_tokens, rows, tiles)


def uniform_demand(
    spec_rows: np.ndarray,
    decode_rows: np.ndarray,
    prefill_rows: np.ndarray,
    tokens: np.ndarray,
    query_len_max: int,
) -> tuple[np.ndarray, np.ndarray]:
    """``(per_unit, need)`` of every step: a uniform step's tokens per unit of size (``Q``
    spec, ``1`` decode) and the size it needs; both 0 for other steps. Arguments are
    ``[S]`` integer arrays of live rows per kind and the tokens each graph must hold;
    results ``[S], int64``."""
    spec, decode, prefill, tokens = (
        np.asarray(a, dtype=np.int64) for a in (spec_rows, decode_rows, prefill_rows, tokens)
    )
    live = spec + decode + prefill
    pure_spec = (spec == live) & (live > 0)
    pure_decode = (decode == live) & (live > 0)
    per_unit = np.where(pure_spec, query_len_max, np.where(pure_decode, 1, 0))
    need = np.maximum(live, -(-tokens // np.maximum(per_unit, 1)))
    return per_unit, np.where(per_unit > 0, need, 0)


def smallest_at_least(sizes: np.ndarray, need: np.ndarray) -> np.ndarray:
    """``[S], int64``: the smallest of ``sizes`` (``[N]``, ascending) that is ``>= need``
    (``[S]``), or 0 where none is."""
    sizes, need = np.asarray(sizes, dtype=np.int64), np.asarray(need, dtype=np.int64)
    if sizes.size == 0:
        return np.zeros_like(need)
    index = np.searchsorted(sizes, need, side="left")
    return np.where(index < sizes.size, sizes[np.minimum(index, sizes.size - 1)], 0)


@attrs.frozen(eq=False)
class GraphChoices:
    """The graph of every step, as :func:`choose_graphs` chooses them.

    Attributes:
        kind: ``[S], int8``: 0 eager, else ``1 +`` the index in :data:`GRAPH_KINDS`.
        num_tokens: ``[S], int64`` token capacity of the step's graph; 0 when eager.
        num_rows: ``[S], int64`` row capacity; 0 when eager.
        num_tiles: ``[S], int64`` prefill tile capacity (0 but for mixed graphs).
    """

    kind: np.ndarray
    num_tokens: np.ndarray
    num_rows: np.ndarray
    num_tiles: np.ndarray

    def key(self, step: int) -> GraphKey | None:
        """Step ``step``'s graph as :func:`choose_graph` gives it."""
        kind = int(self.kind[step])
        if kind == EAGER:
            return None
        sizes = (self.num_tokens[step], self.num_rows[step], self.num_tiles[step])
        return GraphKey(GRAPH_KINDS[kind - 1], *(int(size) for size in sizes))


def choose_graphs(
    config: PlannerConfig,
    spec_rows: np.ndarray,
    decode_rows: np.ndarray,
    prefill_rows: np.ndarray,
    tokens: np.ndarray,
) -> GraphChoices:
    """:func:`choose_graph` over ``[S]`` integer arrays of steps at once: live rows per
    kind and the tokens each graph must hold."""
    spec, decode, prefill, tokens = (
        np.asarray(a, dtype=np.int64) for a in (spec_rows, decode_rows, prefill_rows, tokens)
    )
    live = spec + decode + prefill
    kind = np.zeros(live.shape, dtype=np.int8)
    graph_tokens, graph_rows = np.zeros_like(live), np.zeros_like(live)
    if config.graph_mode != "none":
        per_unit, need = uniform_demand(spec, decode, prefill, tokens, config.query_len_max)
        uniform = np.where(per_unit > 0, smallest_at_least(config.row_sizes, need), 0)
        hit = uniform > 0
        kind[hit] = np.where(spec == live, SPEC_GRAPH, DECODE_GRAPH)[hit]
        graph_rows[hit] = uniform[hit]
        graph_tokens[hit] = uniform[hit] * per_unit[hit]
        if config.graph_mode == "mixed":
            mixed_tokens = smallest_at_least(config.sizes, tokens)
            mixed_rows = smallest_at_least(config.row_sizes, live)
            mixed = ~hit & (live > 0) & (mixed_tokens > 0) & (mixed_rows > 0)
            kind[mixed] = MIXED_GRAPH
            graph_tokens[mixed], graph_rows[mixed] = mixed_tokens[mixed], mixed_rows[mixed]
    tiles = tile_capacity(graph_tokens, graph_rows, config.prefill_tile_tokens)
    tiles = np.where(kind == MIXED_GRAPH, tiles, 0)
    arrays = [kind, graph_tokens, graph_rows, tiles]
    for array in arrays:
        array.flags.writeable = False
    return GraphChoices(*arrays)


def layout_capacity(
    config: PlannerConfig, num_tokens: int, num_rows: int, num_groups: int
) -> PlanLayout:
    """A layout at least as large, field by field, as that of any plan (graph or
    eager) of at most ``num_tokens`` tokens and ``num_rows`` live rows."""
    tiles = tile_capacity(num_tokens, num_rows, config.prefill_tile_tokens)
    return PlanLayout(num_tokens, num_rows, tiles, num_groups)


def largest_graph_layout(config: PlannerConfig, num_groups: int) -> PlanLayout | None:
    """A layout at least as large, field by field, as that of any graph plan of ``config``.

    What an executor sizes its persistent plan buffer by; ``None`` when the
    config captures no graphs.
    """
    sizes, rows = config.sizes, config.row_sizes
    if config.graph_mode == "none" or not rows:
        return None
    spec_tokens = rows[-1] * config.query_len_max
    if config.graph_mode == "full":
        return PlanLayout(spec_tokens, rows[-1], 0, num_groups)
    return layout_capacity(config, max(spec_tokens, sizes[-1]), rows[-1], num_groups)
