"""Planner configuration: speculation depth, graph mode and graph sizes."""

from __future__ import annotations

import bisect

import attrs
import numpy as np

from .errors import PlanError

#: ``none``: every step runs eagerly. ``full``: the seed's rule, CUDA graphs only
#: for uniform batches (pure spec, pure decode). ``mixed``: a graph for any batch
#: that fits a (tokens, rows) bucket, since the kernels read the plan from buffers.
GRAPH_MODES = ("none", "full", "mixed")
#: The largest graph size a config takes (tokens; a spec graph of this many rows holds
#: ``Q`` times as many): the config allocates an index ramp as long as its largest graph.
MAX_GRAPH_SIZE = 2**20
#: The most live rows a config takes (``max_num_seqs``): the ramp covers every row index.
MAX_NUM_SEQS = 2**20
_RAMP_MIN = 8192


def default_graph_sizes(max_num_seqs: int, num_spec_tokens: int) -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes (token counts).

    ``[1, 2, 4] + 8..255 step 8 + 256..max step 16`` with
    ``max = min(max_num_seqs * Q * 2, 512)`` and ``Q = num_spec_tokens + 1``.
    """
    largest = min(max_num_seqs * (num_spec_tokens + 1) * 2, 512)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)]
    return tuple(s for s in sizes if s <= largest)


def _is_integer(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _sizes_converter(value: object) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise PlanError("graph_sizes", None, f"must be a list of integers, got {value!r}")
    sizes = list(value)  # type: ignore[call-overload]
    for size in sizes:  # whole floats pass, as StepBatch's arrays take them
        whole = isinstance(size, (float, np.floating)) and float(size).is_integer()
        if not (_is_integer(size) or whole):
            raise PlanError("graph_sizes", None, f"must be integers, got {size!r}")
    return tuple(sorted({int(v) for v in sizes}))


def _check_integers(config: PlannerConfig) -> None:
    for name in ("num_spec_tokens", "max_num_seqs", "prefill_tile_tokens"):
        value = getattr(config, name)
        if not _is_integer(value):
            raise PlanError(name, None, f"must be an integer, got {value!r}")


@attrs.frozen
class PlannerConfig:
    """How plans are made.

    Attributes:
        num_spec_tokens: drafts per spec request; ``Q = num_spec_tokens + 1``.
        graph_mode: one of :data:`GRAPH_MODES`.
        graph_sizes: capture sizes in tokens (spec graphs use each size as a row
            count, with ``size * Q`` tokens), each ``1 .. MAX_GRAPH_SIZE`` (2**20).
            ``None`` picks :func:`default_graph_sizes`. Which graph a step replays:
            :mod:`.buckets`.
        max_num_seqs: the most live rows a step may have, ``1 .. MAX_NUM_SEQS`` (2**20).
        prefill_tile_tokens: tokens per prefill work tile of the kernels; a
            power of two at least the convolution's reach ``(K - 1) * D``.
    """

    num_spec_tokens: int = 0
    graph_mode: str = "full"
    graph_sizes: tuple[int, ...] | None = attrs.field(default=None, converter=_sizes_converter)
    max_num_seqs: int = 256
    prefill_tile_tokens: int = 64
    #: The graph sizes usable as row counts (``<= max_num_seqs``); derived.
    row_sizes: tuple[int, ...] = attrs.field(init=False, eq=False, repr=False)
    #: ``[N], int32`` read-only ``0, 1, ..., N - 1``, long enough for any graph's tokens,
    #: any live row index and most eager steps: plans slice their identity maps from it
    #: (``compile.ramp_to`` makes a longer one where a step needs it); derived.
    index_ramp: np.ndarray = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        _check_integers(self)
        if self.num_spec_tokens < 0 or self.num_spec_tokens > 7:
            raise PlanError("num_spec_tokens", None, f"must be in 0..7, got {self.num_spec_tokens}")
        if self.graph_mode not in GRAPH_MODES:
            raise PlanError(
                "graph_mode", None, f"must be one of {GRAPH_MODES}, got {self.graph_mode!r}"
            )
        if not 1 <= self.max_num_seqs <= MAX_NUM_SEQS:
            raise PlanError(
                "max_num_seqs", None, f"must be in 1..{MAX_NUM_SEQS}, got {self.max_num_seqs}"
            )
        tile = self.prefill_tile_tokens
        if tile < 8 or tile & (tile - 1):
            raise PlanError("prefill_tile_tokens", None, f"must be a power of two >= 8, got {tile}")
        if self.graph_sizes is None:
            sizes = default_graph_sizes(self.max_num_seqs, self.num_spec_tokens)
            object.__setattr__(self, "graph_sizes", sizes)
        elif not self.graph_sizes or self.graph_sizes[0] < 1:
            raise PlanError("graph_sizes", None, "must be positive integers, at least one")
        elif self.graph_sizes[-1] > MAX_GRAPH_SIZE:
            raise PlanError(
                "graph_sizes",
                None,
                f"must be at most {MAX_GRAPH_SIZE} tokens, got {self.graph_sizes[-1]}",
            )
        rows = self.sizes[: bisect.bisect_right(self.sizes, self.max_num_seqs)]
        object.__setattr__(self, "row_sizes", rows)
        longest = max(_RAMP_MIN, self.sizes[-1] * self.query_len_max, self.max_num_seqs)
        ramp = np.arange(longest, dtype=np.int32)
        ramp.flags.writeable = False
        object.__setattr__(self, "index_ramp", ramp)

    @property
    def query_len_max(self) -> int:
        """``Q``: the longest spec query (last accepted token plus drafts)."""
        return self.num_spec_tokens + 1

    def smallest_size(self, need: int, *, rows: bool = False) -> int | None:
        """The smallest graph size ``>= need`` (of :attr:`row_sizes` with ``rows``), or ``None``."""
        sizes = self.row_sizes if rows else self.sizes
        index = bisect.bisect_left(sizes, need)
        return sizes[index] if index < len(sizes) else None

    @property
    def sizes(self) -> tuple[int, ...]:
        """The graph sizes, never ``None``."""
        assert self.graph_sizes is not None
        return self.graph_sizes
