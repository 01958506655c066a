"""``Planner``: ``compile_plan`` for a stream of steps, with a packer of its own."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from .batch import StepBatch, host_ints, host_step_batch
from .buckets import choose_graph, may_replay
from .compile import check_limits, compile_plan
from .config import PlannerConfig
from .layout import PlanLayout
from .native import NativeBuildError, load_packer
from .plan import SUMMARY, ExecutionPlan, GraphKey, PlanShape, plan_summary

#: Graph choices kept (a few small objects each); all are let go when this many are kept.
_MAX_GRAPHS = 4096
_UNSEEN = object()
#: A plan's (graph, layout, layout.size, tokens, rows, tiles); graph ``None``: eager.
_Shape = tuple[GraphKey | None, PlanLayout, int, int, int, int]
_INT32 = "i"  # numpy's cheapest spelling of int32 (C int)
_COUNT_TYPES = (int, type(None))
# PlanShape from one tuple by tuple.__new__ straight (a third of what its __new__ costs).
_new_shape = functools.partial(tuple.__new__, PlanShape)
_NO_LIMIT = 2**62  # no token limit for the packer (no padded token count given)
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
        self._layouts: dict[tuple[int, int, int, int], PlanLayout] = {}
        # shape_of_rows' answers by what the native census counted and the layer groups:
        # a repeated shape is the very PlanShape handed out before
        self._shapes: dict[tuple[object, ...], PlanShape] = {}
        self._packer = _packer(native)
        # What the native path reads every step, kept out of the config's properties.
        self._graph_mode = config.graph_mode
        self._query_len_max = config.query_len_max
        self._tile = config.prefill_tile_tokens
        # Bit k: a step whose kinds present are k (1 spec, 2 decode, 4 prefill) runs eagerly
        # whatever the sizes (may_replay's rule, read per combination).
        self._eager_kinds = sum(
            1 << kinds
            for kinds in range(8)
            if not may_replay(self._graph_mode, kinds & 1, kinds >> 1 & 1, kinds >> 2)
        )

    @property
    def native(self) -> bool:
        """Whether plans are packed by the compiled packer (else by numpy)."""
        return self._packer is not None

    @property
    def host_bytes(self) -> Callable[..., tuple[bytes, bytes | None, int] | None]:
        """The compiled packer's ``host_bytes(query_start, num_draft_tokens, num_reqs,
        last)``: what a host step's plan is a pure function of besides its counts, in one
        call, ``(query_start[:num_reqs + 1] as bytes, num_draft_tokens[:num_reqs] as bytes
        or None without drafts, query_start[num_reqs] - query_start[0])``, and ``last`` (an
        earlier answer, or None) itself where that is its value: no copy then. ``None``
        for anything but 1-D C-contiguous int32 or int64 arrays (or :func:`host_ints`
        tuples) long enough (the caller reads those itself). Without the compiled packer,
        a function that always says ``None``."""
        packer = self._packer
        return _no_host_bytes if packer is None else packer.host_bytes

    def compile(self, batch: StepBatch) -> ExecutionPlan:
        """The plan of ``batch``: the same value as ``compile_plan(batch, self.config)``.

        Natively, one C call fills the buffer (two for an eager step with prefills:
        its layout needs their tile count first).
        """
        packer = self._packer
        if packer is None:
            return compile_plan(batch, self.config)
        spec, decode, prefill, _ = counts = batch.kind_counts
        if spec + decode + prefill > self.config.max_num_seqs:
            check_limits(batch, self.config)  # raises compile_plan's error
        slots = batch.slots
        packed = self._pack_checked(
            packer,
            counts,
            batch.num_padded_tokens,
            batch.query_lens,
            batch.num_computed_tokens,
            slots,
            batch.num_accepted_tokens,
            batch.query_start,
            batch.kinds,
        )
        if packed is None:  # a spec row breaks the limits: compile_plan's error, word for word
            check_limits(batch, self.config)
            raise AssertionError("the packer refused a batch compile_plan accepts")
        graph, layout, buffer, found = packed
        buffer.setflags(write=False)
        # Positional, in ExecutionPlan's field order (a test holds it there): keywords make
        # this call, the dearest line left here, measurably slower (bench/results/history/).
        return ExecutionPlan(
            batch,
            self.config,
            *found,
            graph,
            layout,
            buffer,
        )

    def shape_of_rows(
        self,
        query_lens: np.ndarray,
        num_computed_tokens: np.ndarray,
        slots: np.ndarray,
        num_draft_tokens: np.ndarray,
        num_accepted_tokens: np.ndarray,
        *,
        rows: int | None = None,
    ) -> PlanShape:
        """``compile(StepBatch(query_lens, num_computed_tokens, slots, num_draft_tokens,
        num_accepted_tokens)).shape``, the same value, with the batch checked as
        ``check_batch`` checks it and counted as ``pack`` counts it, in one native call
        (``shape_counts``), but neither the batch, the plan nor its bytes made: what a
        simulator that only times a step reads of its plan.

        Args:
            query_lens, num_computed_tokens, num_draft_tokens, num_accepted_tokens:
                ``[R], int32`` as :class:`StepBatch` takes them.
            slots: ``[R]`` or ``[G, R]``, int32.
            rows: the batch is the first ``rows`` rows of each array (of ``slots``' last
                axis), which may hold more (a scheduler's arrays, no views made);
                ``None``: all of them.

        Anything else (other dtypes, a batch the checks refuse, no compiled packer) goes
        through ``compile(StepBatch(...))``, which raises what it raises there.
        """
        packer = self._packer
        if packer is not None and type(slots) is np.ndarray and slots.ndim in (1, 2):
            grouped = slots if slots.ndim == 2 else slots[None]
            try:  # check_batch's checks and pack's counts in one call, no bytes packed
                counted = packer.shape_counts(
                    query_lens,
                    num_computed_tokens,
                    num_draft_tokens,
                    num_accepted_tokens,
                    grouped,
                    False,
                    self._query_len_max,
                    self._tile,
                    rows,
                )
            except (TypeError, ValueError, AttributeError, BufferError):
                counted = None
            shape = self._kept_shape(counted, grouped.shape[0])
            if shape is not None:
                return shape
        if rows is not None:
            query_lens, num_computed_tokens = query_lens[:rows], num_computed_tokens[:rows]
            num_draft_tokens, num_accepted_tokens = (
                num_draft_tokens[:rows],
                num_accepted_tokens[:rows],
            )
            slots = slots[..., :rows]
        batch = StepBatch(
            query_lens, num_computed_tokens, slots, num_draft_tokens, num_accepted_tokens
        )
        return self.compile(batch).shape

    def rows_shapes(
        self,
        query_lens: np.ndarray,
        num_computed_tokens: np.ndarray,
        slots: np.ndarray,
        num_draft_tokens: np.ndarray,
        num_accepted_tokens: np.ndarray,
    ) -> Callable[[int], PlanShape]:
        """``shape_of(rows)``, which is ``shape_of_rows(query_lens, ..., rows=rows)``, with
        the arrays' buffers taken once (natively): what a loop that plans one scheduler's
        rows step after step calls. The arrays must stay the ones it reads: written in
        place, never resized. Arguments as :meth:`shape_of_rows` takes them."""
        arrays = (query_lens, num_computed_tokens, slots, num_draft_tokens, num_accepted_tokens)
        bound, groups = None, 1
        if self._packer is not None and type(slots) is np.ndarray and slots.ndim in (1, 2):
            grouped = slots if slots.ndim == 2 else slots[None]
            groups = grouped.shape[0]
            try:
                bound = self._packer.BoundRows(
                    query_lens, num_computed_tokens, num_draft_tokens, num_accepted_tokens, grouped
                )
            except (TypeError, ValueError, BufferError):
                bound = None
        query_len_max, tile, shape_of_rows = self._query_len_max, self._tile, self.shape_of_rows
        counts = None if bound is None else bound.counts

        def shape_of(rows: int) -> PlanShape:
            shape = None
            if counts is not None:
                try:
                    shape = self._kept_shape(counts(False, query_len_max, tile, rows), groups)
                except (TypeError, ValueError):
                    shape = None
            return shape if shape is not None else shape_of_rows(*arrays, rows=rows)

        return shape_of

    def _kept_shape(
        self, counted: tuple[tuple[int, ...], tuple[int, ...], int] | None, groups: int
    ) -> PlanShape | None:
        """The shape of a batch ``shape_counts`` counted (``None``: it did not), kept or
        made (:meth:`_counted_shape`)."""
        if counted is None:
            return None
        shape = self._shapes.get((counted, groups))
        return shape if shape is not None else self._counted_shape(counted, groups)

    def _counted_shape(
        self, counted: tuple[tuple[int, ...], tuple[int, ...], int], groups: int
    ) -> PlanShape | None:
        """The shape of a batch ``shape_counts`` counted (``counted``: its answer), kept
        for the next batch it counts alike; ``None`` where ``compile`` must say why not
        (more rows than the config allows, a layout too small for ``pack``)."""
        counts, found, num_tokens = counted
        live, tiles = found[0] + found[1] + found[2], found[7]
        if live > self.config.max_num_seqs:
            return None
        graph, layout, _, tokens, rows, room = self._shape(counts, num_tokens, None, groups, tiles)
        if live > rows or num_tokens > tokens or tiles > room:
            return None
        if len(self._shapes) >= _MAX_GRAPHS:
            self._shapes.clear()
        shape = _new_shape((self.config, graph, layout, sum(counts), None, *found))
        self._shapes[(counted, groups)] = shape
        return shape

    def _pack_checked(
        self,
        packer: ModuleType,
        counts: tuple[int, int, int, int],
        num_padded_tokens: int | None,
        query_lens: np.ndarray,
        num_computed_tokens: np.ndarray,
        slots: np.ndarray,
        num_accepted_tokens: np.ndarray,
        query_start: np.ndarray,
        kinds: np.ndarray,
    ) -> tuple[GraphKey | None, PlanLayout, np.ndarray, tuple[int, ...]] | None:
        """The compiled packer's plan of a checked batch (its arrays as StepBatch holds
        them; ``counts`` its rows per kind): ``(graph, layout, packed buffer, the plan's
        counts)``, or ``None`` where a spec row breaks the config's limits."""
        num_tokens = query_start.item(-1)
        graph, layout, size, tokens, rows, tiles = self._shape(
            counts,
            num_tokens,
            num_padded_tokens,
            len(slots),
            lambda: packer.prefill_tiles(query_lens, kinds, self._tile),
        )
        packed = np.empty(size, _INT32)
        found = packer.pack(
            packed,
            query_start,
            num_computed_tokens,
            num_accepted_tokens,
            slots,
            kinds,
            tokens,
            rows,
            tiles,
            len(slots),
            self._query_len_max,
            self._tile,
        )
        return None if found is None else (graph, layout, packed, found)

    def pack_host_step(
        self,
        out: np.ndarray,
        query_start: np.ndarray,
        num_draft_tokens: np.ndarray | None,
        num_reqs: int,
        *,
        num_padded_tokens: int | None = None,
        num_groups: int = 1,
        summary: np.ndarray | None = None,
    ) -> PlanShape:
        """Pack the plan of :func:`host_step_batch`'s step (known on the host by its query
        starts and drafts alone) into ``out[:size]`` and say its shape, making neither the
        batch nor the plan: the bytes are ``compile(host_step_batch(...)).packed``, the
        shape its ``.shape``. Natively one C call for a step that runs eagerly, two (the
        census, then the pack in its graph's layout) for one that may replay a graph.

        Args:
            out: ``[>= size], int32``, writable; ``ValueError`` (nothing written) where it
                is shorter than the plan.
            query_start, num_draft_tokens, num_reqs, num_padded_tokens, num_groups: as
                :func:`host_step_batch` takes them (int32 arrays and tuples natively).
            summary: ``[>= len(SUMMARY)], int32``, writable, sharing no memory with
                ``out``: receives the plan's :data:`~.plan.SUMMARY` words (its counts and
                where each field lies), written by the packer itself; ``None``: none.

        Raises :class:`~.errors.PlanError` as ``compile(host_step_batch(...))`` does.
        """
        packer = self._packer
        if packer is not None and type(num_padded_tokens) in _COUNT_TYPES:
            # The compiled packer, in this frame (a build counts microseconds): eager steps
            # in one call; None (or an error) where a check fails: StepBatch's path says.
            groups, query_len_max, tile = num_groups, self._query_len_max, self._tile
            try:
                census = packer.pack_host_eager(
                    out, query_start, num_draft_tokens, num_reqs, groups, query_len_max, tile,
                    self._eager_kinds, self.config.max_num_seqs,
                    _NO_LIMIT if num_padded_tokens is None else num_padded_tokens, summary,
                )  # fmt: skip
            except (TypeError, ValueError):
                census = None
            counts = graph = None
            if census is not None and len(census) == 8:  # packed eagerly, in its own layout
                counts = census  # PlanShape's counts, in its order
                spec, decode, prefill, spec_tokens, decode_tokens, prefill_tokens, _, tiles = counts
                tokens = spec_tokens + decode_tokens + prefill_tokens
                key = (tokens, spec + decode + prefill, tiles, groups)
                layout = self._layouts.get(key) or self._layout(*key)
            elif census is not None:
                graph, layout, counts = self._pack_in_graph_layout(
                    packer, census, out, query_start, num_draft_tokens, num_reqs,
                    num_padded_tokens, groups, summary,
                )  # fmt: skip
            if counts is not None:
                shape = (self.config, graph, layout, num_reqs, num_padded_tokens, *counts)
                return _new_shape(shape)
        # Anything else, or a step the checks refuse: StepBatch's errors, word for word.
        return self._pack_by_batch(
            out, query_start, num_draft_tokens, num_reqs, num_padded_tokens, num_groups, summary
        )

    def _pack_in_graph_layout(
        self,
        packer: ModuleType,
        census: tuple[int, ...],
        out: np.ndarray,
        query_start: np.ndarray,
        drafts: np.ndarray | None,
        num_reqs: int,
        num_padded_tokens: int | None,
        groups: int,
        summary: np.ndarray | None,
    ) -> tuple[GraphKey | None, PlanLayout, tuple[int, ...] | None]:
        """:meth:`pack_host_step`'s second native call, for a step of this census that may
        replay a graph: ``(graph, layout, the plan's counts)`` (counts None: refused)."""
        spec, decode, prefill, num_tokens, live_tiles = census
        counts = (spec, decode, prefill, num_reqs - spec - decode - prefill)
        graph, layout, size, *sizes = self._shape(
            counts, num_tokens, num_padded_tokens, groups, live_tiles
        )
        _check_room(out, size)
        found = packer.pack_host(
            out[:size], query_start, drafts, num_reqs, *sizes, groups, self._query_len_max,
            self._tile, summary,
        )  # fmt: skip
        return graph, layout, found

    def _pack_by_batch(
        self,
        out: np.ndarray,
        query_start: np.ndarray,
        num_draft_tokens: np.ndarray | None,
        num_reqs: int,
        num_padded_tokens: int | None,
        num_groups: int,
        summary: np.ndarray | None,
    ) -> PlanShape:
        """:meth:`pack_host_step` through :func:`host_step_batch` and :meth:`compile`."""
        query_start, num_draft_tokens = host_ints(query_start), host_ints(num_draft_tokens)
        if summary is not None:
            _check_summary(summary, out, query_start, num_draft_tokens)
        plan = self.compile(
            host_step_batch(
                query_start,
                num_draft_tokens,
                num_reqs,
                num_padded_tokens=num_padded_tokens,
                num_groups=num_groups,
            )
        )
        _check_room(out, plan.layout.size)
        if summary is not None:
            summary[: len(SUMMARY)] = plan_summary(plan.shape)
        out[: plan.layout.size] = plan.packed
        return plan.shape

    def _layout(self, num_tokens: int, rows: int, tiles: int, groups: int) -> PlanLayout:
        """``PlanLayout(num_tokens, rows, tiles, groups)``, one instance per sizes kept (an
        attrs instance costs a host step more than a dict lookup)."""
        key = (num_tokens, rows, tiles, groups)
        layout = self._layouts.get(key)
        if layout is None:
            if len(self._layouts) >= _MAX_GRAPHS:
                self._layouts.clear()
            layout = self._layouts[key] = PlanLayout(num_tokens, rows, tiles, groups)
        return layout

    def _shape(
        self,
        counts: tuple[int, int, int, int],
        num_tokens: int,
        num_padded_tokens: int | None,
        groups: int,
        tiles_of: Callable[[], int] | int,
    ) -> _Shape:
        """The plan's graph, layout and buffer sizes for a step of these kind counts:
        a graph shape as kept, an eager one sized by this step's prefill tiles
        (``tiles_of``: their count, or what counts them)."""
        spec, decode, prefill, _ = counts
        if may_replay(self._graph_mode, spec, decode, prefill):
            key = (counts, num_tokens, num_padded_tokens, groups)
            shape = self._graphs.get(key, _UNSEEN)
            if shape is _UNSEEN:
                need = max(num_tokens, num_padded_tokens or 0)
                shape = self._choose(key, (spec, decode, prefill), need, groups)
            if shape is not None:
                return shape  # type: ignore[return-value]
        tiles = 0 if not prefill else tiles_of if type(tiles_of) is int else tiles_of()
        live = spec + decode + prefill
        layout = self._layout(num_tokens, live, tiles, groups)
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


def _no_host_bytes(query_start: Any, num_draft_tokens: Any, num_reqs: int, last: Any) -> None:
    """:attr:`Planner.host_bytes` without the compiled packer: the caller reads the arrays."""
    del query_start, num_draft_tokens, num_reqs, last


def _check_room(out: np.ndarray, size: int) -> None:
    if out.shape[0] < size:
        raise ValueError(f"out: {out.shape[0]} entries, the plan needs {size}")


def _check_summary(summary: np.ndarray, *others: np.ndarray | None) -> None:
    """The packer's checks of ``summary`` (long enough; no byte within the extent of the
    plan's buffer or the step's arrays), for the numpy path, before any work."""
    if summary.shape[0] < len(SUMMARY):
        raise ValueError("summary: too short")
    if any(other is not None and np.may_share_memory(summary, other) for other in others):
        raise ValueError("summary: shares memory with the plan or the step's arrays")


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
