"""``Planner``: ``compile_plan`` for a stream of steps, keeping what repeats between them."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from types import ModuleType

import numpy as np

from .batch import PADDING, StepBatch
from .compile import (
    _check_limits,
    _choose_graph,
    _compile,
    _raise_accepted,
    _rows_in_group_order,
    graph_and_layout,
    shape_rows,
)
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

    An engine's steps repeat their shape: the same graph bucket, and often the
    same rows per group. The planner keeps its graph choices (eager ones too,
    so a repeated eager shape skips the bucket search). It packs each plan with
    the compiled packer (:mod:`.native`, ``plan_packer.c``): one C call fills
    the whole buffer. Without it (``native=False``, or no C compiler), it packs
    with compile_plan's numpy code, and keeps for the last ``max_templates``
    graph shapes (layout, live rows per group, whether rows come in engine
    order) the whole buffer as far as that shape alone decides it
    (:func:`shape_rows`), so a graph step copies it in one write and fills
    only its own entries. Templates are read-only and only ever copied: plans
    never share memory with them. Instance state only; one planner per engine
    thread.

    Args:
        config: the planner configuration.
        max_templates: graph-shape templates the numpy packer keeps.
        native: ``None`` packs natively when the packer builds (else numpy, with
            a warning saying why); ``True`` requires it (raises
            :class:`NativeBuildError`); ``False`` packs with numpy.
    """

    def __init__(
        self, config: PlannerConfig, max_templates: int = 8, native: bool | None = None
    ) -> None:
        if max_templates < 1:
            raise ValueError(f"max_templates must be positive, got {max_templates}")
        self.config = config
        self.max_templates = max_templates
        # A graph plan's shape, or None where the shape runs eagerly.
        self._graphs: dict[tuple[object, ...], _Shape | None] = {}
        self._templates: OrderedDict[tuple[object, ...], np.ndarray] = OrderedDict()
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
            order = _rows_in_group_order(batch)
            return _compile(batch, self.config, in_engine_order=order, shapes=self)
        spec, decode, prefill, _ = batch.kind_counts
        if spec + decode + prefill > self.config.max_num_seqs:
            _check_limits(batch, self.config)  # raises compile_plan's error
        graph, layout, size, tokens, rows, tiles = self._native_shape(batch, packer)
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
            _check_limits(batch, self.config)
            _raise_accepted(batch, self._query_len_max)
            raise AssertionError("the packer refused a batch compile_plan accepts")
        num_tiles, longest_prefill, spec_tokens = found
        packed.setflags(write=False)
        num_tokens = batch.query_start.item(-1)
        # Positional, in ExecutionPlan's field order (a test holds it there): keywords cost
        # a third more of this call, the dearest line left here.
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

    def _native_shape(self, batch: StepBatch, packer: ModuleType) -> _Shape:
        """The plan's graph, layout and buffer sizes: a graph shape as kept, an eager one
        sized by this step (its tiles counted by the packer)."""
        counts = batch.kind_counts
        spec, decode, prefill, _ = counts
        live = spec + decode + prefill
        num_tokens, groups = batch.query_start.item(-1), len(batch.slots)
        if self._graph_mode == "mixed" or (
            self._graph_mode == "full" and live and live in (spec, decode)
        ):
            key = (counts, num_tokens, batch.num_padded_tokens, groups)
            shape = self._graphs.get(key, _UNSEEN)
            if shape is _UNSEEN:
                shape = self._choose(batch, key, num_tokens)
            if shape is not None:
                return shape  # type: ignore[return-value]
        tiles = packer.prefill_tiles(batch.query_lens, batch.kinds, self._tile) if prefill else 0
        layout = PlanLayout(num_tokens, live, tiles, groups)
        return None, layout, layout.size, num_tokens, live, tiles

    def graph_and_layout(
        self, batch: StepBatch, num_tokens: int, num_tiles: int
    ) -> tuple[GraphKey | None, PlanLayout]:
        """The plan's graph and layout as ``compile_plan`` chooses them; the choice is
        kept per (rows per kind, tokens, padded tokens, layer groups), an eager
        layout (sized by this step's tiles) is made afresh."""
        found = self._graph_choice(batch, num_tokens)
        if found is not None:
            return found[0], found[1]
        live = sum(batch.kind_counts[:PADDING])
        return graph_and_layout(None, num_tokens, live, num_tiles, batch.num_groups)

    def _graph_choice(self, batch: StepBatch, num_tokens: int) -> _Shape | None:
        """A graph plan's shape (:data:`_Shape`), ``None`` for an eager one:
        ``compile_plan``'s choice, kept."""
        key = (batch.kind_counts, num_tokens, batch.num_padded_tokens, batch.num_groups)
        found = self._graphs.get(key, _UNSEEN)
        if found is _UNSEEN:
            return self._choose(batch, key, num_tokens)
        return found  # type: ignore[return-value]

    def _choose(self, batch: StepBatch, key: tuple[object, ...], num_tokens: int) -> _Shape | None:
        """A first-seen shape: ``compile_plan``'s choice, kept (``None`` for eager)."""
        bucket = _choose_graph(batch, self.config, num_tokens)
        found = None
        if bucket is not None:  # a bucket's layout needs neither live rows nor tiles
            graph, layout = graph_and_layout(bucket, num_tokens, 0, 0, batch.num_groups)
            sizes = (layout.num_tokens, layout.num_rows, layout.num_tiles)
            found = (graph, layout, layout.size, *sizes)
        if len(self._graphs) >= _MAX_GRAPHS:
            self._graphs.clear()
        self._graphs[key] = found
        return found

    def template(
        self, layout: PlanLayout, counts: tuple[int, int, int], in_engine_order: bool
    ) -> np.ndarray:
        """``[layout.size], int32`` read-only: a graph plan's buffer as far as its shape
        decides it (:func:`shape_rows`), the token map at -1; entries a step writes
        are 0 here."""
        key = (layout, counts, in_engine_order)
        templates = self._templates
        template = templates.get(key)
        if template is not None:
            templates.move_to_end(key)
            return template
        tokens, rows, groups = layout.num_tokens, layout.num_rows, layout.num_groups
        template = np.zeros(layout.size, dtype=np.int32)
        template[:tokens] = -1
        section = template[tokens : tokens + (7 + groups) * rows + 1]
        shape_rows(section, rows, groups, counts, in_engine_order, self.config.index_ramp)
        template.flags.writeable = False
        templates[key] = template
        if len(templates) > self.max_templates:
            templates.popitem(last=False)
        return template


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
            f"stepplan.planner.Planner packs plans with numpy ({_NUMPY_COST}): the compiled "
            f"packer is unavailable: {error}",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
