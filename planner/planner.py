"""``Planner``: ``compile_plan`` for a stream of steps, with a packer of its own."""

from __future__ import annotations

import warnings
from types import ModuleType

import numpy as np

from .batch import StepBatch
from .buckets import choose_graph, may_replay
from .compile import check_limits, compile_plan
from .config import PlannerConfig
from .layout import PlanLayout
from .native import NativeBuildError, load_packer
from .plan import ExecutionPlan, GraphKey

#: Graph choices kept (a few small objects each); all are let go when this many are kept.
_MAX_GRAPHS = 4096
_UNSEEN = object()
#: A plan's (graph, layout, layout.size, tokens, rows, tiles); graph ``None``: eager.
_Shape = tuple[GraphKey | None, PlanLayout, int, int, int, int]
_INT32 = "i"  # numpy's cheapest spelling of int32 (C int)
_NUMPY_COST = "about 3x the host time per plan of the compiled packer"


class Planner:
    """Compiles steps for one config; ``compile(batch)`` equals ``compile_plan(batch, config)``.

    A planner owns its packer: the compiled one (the C extension that ``pip install``
    builds, :mod:`.native`), which fills a plan's whole buffer in one call, or else
    ``compile_plan``'s numpy code, the specification of the bytes. An engine's steps
    repeat their shape, so with the compiled packer the planner keeps the graph chosen
    for each shape (rows per kind, tokens, padded tokens, layer groups; eager choices
    too), and a repeated shape skips the bucket rule. Instance state only; one planner
    per engine thread.

    Args:
        config: the planner configuration.
        native: ``None`` packs with the compiled packer where it is installed (else
            with numpy, with one warning saying why); ``True`` requires it (raises
            :class:`NativeBuildError`); ``False`` packs with numpy.
    """

    def __init__(self, config: PlannerConfig, *, native: bool | None = None) -> None:
        self.config = config
        # A plan's shape, or None where the shape runs eagerly.
        self._graphs: dict[tuple[object, ...], _Shape | None] = {}
        self._packer = _packer(native)
        # What the native path reads every step, kept out of the config's properties.
        self._graph_mode = config.graph_mode
        self._query_len_max = config.query_len_max
        self._tile = config.prefill_tile_tokens

    @property
    def native(self) -> bool:
        """Whether plans are packed by the compiled packer (else by numpy)."""
        return self._packer is not None

    def compile(self, batch: StepBatch) -> ExecutionPlan:
        """The plan of ``batch``: the same value as ``compile_plan(batch, self.config)``.

        Natively, one C call fills the buffer (two for an eager step with prefills:
        its layout needs their tile count first).
        """
        packer = self._packer
        if packer is None:
            return compile_plan(batch, self.config)
        spec, decode, prefill, _ = batch.kind_counts
        if spec + decode + prefill > self.config.max_num_seqs:
            check_limits(batch, self.config)  # raises compile_plan's error
        graph, layout, size, tokens, rows, tiles = self._shape(batch, packer)
        packed = np.empty(size, _INT32)
        found = packer.pack(
            packed,
            batch.query_start,
            batch.num_computed_tokens,
            batch.num_accepted_tokens,
            batch.slots,
            batch.kinds,
            tokens,
            rows,
            tiles,
            len(batch.slots),
            self._query_len_max,
            self._tile,
        )
        if found is None:  # a spec row breaks the limits: compile_plan's error, word for word
            check_limits(batch, self.config)
            raise AssertionError("the packer refused a batch compile_plan accepts")
        num_tiles, longest_prefill, spec_tokens = found
        packed.setflags(write=False)
        num_tokens = batch.query_start.item(-1)
        # Positional, in ExecutionPlan's field order (a test holds it there): keywords make
        # this call, the dearest line left here, measurably slower (bench/RESULTS.md).
        return ExecutionPlan(
            batch,
            self.config,
            spec,
            decode,
            prefill,
            spec_tokens,
            decode,  # decode rows have one token each
            num_tokens - spec_tokens - decode,
            longest_prefill,
            num_tiles,
            graph,
            layout,
            packed,
        )

    def _shape(self, batch: StepBatch, packer: ModuleType) -> _Shape:
        """The plan's graph, layout and buffer sizes: a graph shape as kept, an eager one
        sized by this step (its tiles counted by the packer)."""
        counts = batch.kind_counts
        spec, decode, prefill, _ = counts
        num_tokens, groups = batch.query_start.item(-1), len(batch.slots)
        if may_replay(self._graph_mode, spec, decode, prefill):
            key = (counts, num_tokens, batch.num_padded_tokens, groups)
            shape = self._graphs.get(key, _UNSEEN)
            if shape is _UNSEEN:
                need = max(num_tokens, batch.num_padded_tokens or 0)
                shape = self._choose(key, (spec, decode, prefill), need, groups)
            if shape is not None:
                return shape  # type: ignore[return-value]
        tiles = packer.prefill_tiles(batch.query_lens, batch.kinds, self._tile) if prefill else 0
        live = spec + decode + prefill
        layout = PlanLayout(num_tokens, live, tiles, groups)
        return None, layout, layout.size, num_tokens, live, tiles

    def _choose(
        self, key: tuple[object, ...], live: tuple[int, int, int], tokens: int, groups: int
    ) -> _Shape | None:
        """A first-seen shape: the bucket rule's choice for ``live`` rows per kind and a
        graph of at least ``tokens`` tokens, kept under ``key`` (``None`` for eager)."""
        graph = choose_graph(self.config, *live, tokens)
        found = None
        if graph is not None:
            layout = graph.layout(groups)
            sizes = (layout.num_tokens, layout.num_rows, layout.num_tiles)
            found = (graph, layout, layout.size, *sizes)
        if len(self._graphs) >= _MAX_GRAPHS:
            self._graphs.clear()
        self._graphs[key] = found
        return found


def _packer(native: bool | None) -> ModuleType | None:
    """The compiled packer, or ``None`` for numpy packing (see :class:`Planner`)."""
    if native is False:
        return None
    try:
        return load_packer()
    except NativeBuildError as error:
        if native:
            raise
        warnings.warn(
            f"stepplan.planner.Planner packs plans with numpy ({_NUMPY_COST}): {error}",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
