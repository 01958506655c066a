"""``compile_plan``: one step's request set to one execution plan (SPEC §3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .batch import DECODE, PADDING, PREFILL, SPEC, StepBatch
from .config import PlannerConfig
from .errors import PlanError
from .layout import FIELDS, PlanLayout
from .plan import ExecutionPlan, GraphKey

if TYPE_CHECKING:
    from .planner import Planner


def _read_only(values: object, shape: tuple[int, ...] = ()) -> np.ndarray:
    array = np.array(values, dtype=np.int32).reshape(shape)
    array.flags.writeable = False
    return array


_ZERO, _ONE = _read_only(0), _read_only(1)
# Padding of the six [R] fields from row_token_start to row_request, as one column.
_ROW_PADS = _read_only([pad for _, size, pad in FIELDS if size == "R"], (6, 1))
_TILE_PADS = _read_only([pad for name, _, pad in FIELDS if name.startswith("tile_")], (2, 1))
_LOOP_TILES_UP_TO_ROWS = 8


def ramp_to(ramp: np.ndarray, stop: int, step: int = 1) -> np.ndarray:
    """``0, step, ... < stop`` as int32: a view of the config's ``ramp`` (``[N], int32``,
    ``0..N-1``) where it reaches ``stop``, else made afresh (an eager step's tokens
    are not bounded by the config)."""
    if stop <= ramp.shape[0]:
        return ramp[:stop:step]
    return np.arange(0, stop, step, dtype=np.int32)


def compile_plan(batch: StepBatch, config: PlannerConfig) -> ExecutionPlan:
    """Compile one step into an :class:`ExecutionPlan`. Pure: equal inputs give equal plans.

    Raises :class:`PlanError` where the batch breaks the config's limits
    (drafts beyond ``num_spec_tokens``, accepted counts outside ``1..Q``,
    more live rows than ``max_num_seqs``).
    """
    return _compile(batch, config, in_engine_order=_rows_in_group_order(batch))


def _rows_in_group_order(batch: StepBatch) -> bool:
    """Whether the engine's rows already run ``[spec | decode | prefill | padding]``.

    Then the live rows are the first ones in the engine's order and every
    gather of the general path is a plain prefix (vLLM puts decode-like rows
    before prefills, so most steps without speculation come this way).
    Group by group: once the earlier groups hold all rows of their kinds, a
    group's range is all of its kind exactly when no row in it is of a later
    kind, so one ``argmax`` per group decides (and the first mismatch stops).
    """
    kinds, stop = batch.kinds, 0
    if batch.num_rows in batch.kind_counts:
        return True
    for kind, count in enumerate(batch.kind_counts[:PADDING]):
        if count:
            part = kinds[stop : stop + count]
            if part.item(part.argmax()) != kind:
                return False
            stop += count
    return True


def _compile(
    batch: StepBatch,
    config: PlannerConfig,
    *,
    in_engine_order: bool,
    shapes: Planner | None = None,
) -> ExecutionPlan:
    """``compile_plan`` with the row order given; ``in_engine_order=False`` (sorting the
    rows by kind) gives the same plan for any batch, and is what the tests compare with.
    ``shapes`` lends its kept graph choices, layouts and graph-plan templates (same values)."""
    num_spec, num_decode, num_prefill, _ = batch.kind_counts
    _check_limits(batch, config)
    live = num_spec + num_decode + num_prefill
    order = None if in_engine_order else batch.kinds.argsort(kind="stable")[:live]
    lens = batch.query_lens[:live] if order is None else batch.query_lens.take(order)
    prefill_lens = lens[num_spec + num_decode :]
    num_tiles = _count_tiles(prefill_lens, config.prefill_tile_tokens)
    num_tokens = batch.num_tokens  # padding rows have no tokens
    groups = batch.num_groups
    if shapes is None:
        bucket = _choose_graph(batch, config, num_tokens)
        graph, layout = graph_and_layout(bucket, num_tokens, live, num_tiles, groups)
        template = None
    else:
        graph, layout = shapes.graph_and_layout(batch, num_tokens, num_tiles)
        counts = (num_spec, num_decode, num_prefill)
        template = None if graph is None else shapes.template(layout, counts, order is None)
    packed = _pack(batch, config, order, lens, layout, prefill_lens, num_tiles, template)
    spec_tokens = num_tokens if num_spec == live else int(packed[layout.num_tokens + num_spec])
    return ExecutionPlan(
        batch=batch,
        config=config,
        num_spec_rows=num_spec,
        num_decode_rows=num_decode,
        num_prefill_rows=num_prefill,
        num_spec_tokens=spec_tokens,
        num_decode_tokens=num_decode,
        num_prefill_tokens=num_tokens - spec_tokens - num_decode,
        max_prefill_query_len=int(prefill_lens[prefill_lens.argmax()]) if num_prefill else 0,
        num_tiles=num_tiles,
        graph=graph,
        layout=layout,
        packed=packed,
    )


def _count_tiles(prefill_lens: np.ndarray, tile: int) -> int:
    """Prefill work tiles of ``tile`` tokens the rows of ``prefill_lens`` need."""
    if prefill_lens.shape[0] <= _LOOP_TILES_UP_TO_ROWS:  # a few rows: plain ints are cheaper
        if not prefill_lens.shape[0]:
            return 0
        return sum([(q + tile - 1) // tile for q in prefill_lens.tolist()])
    return int(((prefill_lens + (tile - 1)) // tile).sum())


def _check_limits(batch: StepBatch, config: PlannerConfig) -> None:
    num_spec, num_decode, num_prefill, _ = batch.kind_counts
    if num_spec:
        drafts = batch.num_draft_tokens
        row = int(drafts.argmax())
        if drafts.item(row) > config.num_spec_tokens:
            raise PlanError(
                "num_draft_tokens",
                row,
                f"{drafts[row]} drafts, num_spec_tokens is {config.num_spec_tokens}",
            )
    live = num_spec + num_decode + num_prefill
    if live > config.max_num_seqs:
        row = int(np.flatnonzero(batch.kinds != PADDING)[config.max_num_seqs])
        raise PlanError(
            "query_lens", row, f"{live} live rows exceed max_num_seqs = {config.max_num_seqs}"
        )


def _choose_graph(
    batch: StepBatch, config: PlannerConfig, num_tokens: int
) -> tuple[str, int, int, int] | None:
    """The smallest bucket that fits as ``(kind, tokens, rows, tiles)``, or ``None``
    (eager) where none does."""
    num_spec, num_decode, num_prefill, _ = batch.kind_counts
    live = num_spec + num_decode + num_prefill
    if config.graph_mode == "none" or live == 0:
        return None
    need_tokens = max(num_tokens, batch.num_padded_tokens or 0)
    if num_spec == live or num_decode == live:
        per_row = config.query_len_max if num_spec else 1
        rows = config.smallest_size(max(live, -(-need_tokens // per_row)), rows=True)
        if rows is not None:
            return ("spec" if num_spec else "decode", rows * per_row, rows, 0)
    if config.graph_mode != "mixed":
        return None
    tokens = config.smallest_size(need_tokens)
    rows = config.smallest_size(live, rows=True)
    if tokens is None or rows is None:
        return None
    return ("mixed", tokens, rows, _tile_capacity(tokens, rows, config))


def graph_and_layout(
    bucket: tuple[str, int, int, int] | None,
    num_tokens: int,
    live: int,
    num_tiles: int,
    groups: int,
) -> tuple[GraphKey | None, PlanLayout]:
    """The graph of ``bucket`` (``None``: eager) and the plan's buffer layout."""
    if bucket is None:
        return None, PlanLayout(num_tokens, live, num_tiles, groups)
    kind, tokens, rows, tiles = bucket
    return GraphKey(kind, tokens, rows, tiles), PlanLayout(tokens, rows, tiles, groups)


def _tile_capacity(tokens: int, rows: int, config: PlannerConfig) -> int:
    """Prefill tiles any batch of a mixed bucket can need.

    Prefill rows have q >= 2, so a bucket holds at most ``min(rows, tokens / 2)``
    of them, and ``sum(ceil(q / tile)) <= prefill rows + tokens / tile``.
    """
    return min(rows, tokens // 2) + tokens // config.prefill_tile_tokens


def layout_capacity(
    config: PlannerConfig, num_tokens: int, num_rows: int, num_groups: int
) -> PlanLayout:
    """A layout at least as large, field by field, as that of any plan (graph or
    eager) of at most ``num_tokens`` tokens and ``num_rows`` live rows."""
    return PlanLayout(
        num_tokens, num_rows, _tile_capacity(num_tokens, num_rows, config), num_groups
    )


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


def _pack(
    batch: StepBatch,
    config: PlannerConfig,
    order: np.ndarray | None,
    lens: np.ndarray,
    layout: PlanLayout,
    prefill_lens: np.ndarray,
    num_tiles: int,
    template: np.ndarray | None = None,
) -> np.ndarray:
    """Write one plan's fields into a fresh int32 buffer, laid out as ``layout`` says.

    Rows arrive in group order, so each group is a contiguous range and most
    fields are filled per range, each straight into its slice of the buffer;
    entries past the live part get their field's padding value
    (``layout.FIELDS``). ``order`` maps group-ordered rows to engine rows;
    ``None`` when they coincide (then every gather is a prefix view).
    ``template`` (a graph plan's whole buffer as :meth:`Planner.template` keeps
    it; copied, never written) holds what :func:`shape_rows` writes and the
    token map's -1 padding; ``None`` writes those entries here.
    """
    tokens, rows, groups = layout.num_tokens, layout.num_rows, layout.num_groups
    at_tiles = tokens + (7 + groups) * rows + 1
    num_tokens = batch.num_tokens
    if template is not None:
        packed = template.copy()
        section = packed[tokens:at_tiles]
    else:
        packed = np.empty(at_tiles + 2 * layout.num_tiles, dtype=np.int32)
        section = packed[tokens:at_tiles]
        counts = batch.kind_counts[:PADDING]
        shape_rows(section, rows, groups, counts, order is None, config.index_ramp)
        if num_tokens < tokens:
            packed[num_tokens:tokens] = -1
    if order is None:
        _engine_order_tokens(packed, batch, lens.shape[0], tokens, rows, config.index_ramp)
    else:
        _regrouped_tokens(packed, batch, order, lens, tokens, rows, config.index_ramp)
    _step_rows(section, batch, order, rows, groups, config.query_len_max)
    if layout.num_tiles:
        tile_fields = packed[at_tiles:].reshape(2, layout.num_tiles)
        tile = config.prefill_tile_tokens
        _tile_fields(tile_fields, prefill_lens, lens.shape[0], num_tiles, tile, config.index_ramp)
    packed.flags.writeable = False
    return packed


def shape_rows(
    section: np.ndarray,
    rows: int,
    groups: int,
    counts: tuple[int, int, int],
    in_engine_order: bool,
    ramp: np.ndarray,
) -> None:
    """The row section's entries that only the plan's shape decides.

    ``section`` is ``[R + 1 + 6 R + G R], int32``, row_query_start to row_slot;
    ``counts`` are the live rows per group. Writes the leading query start,
    every row kind, the constant parts of state offsets, has-state flags and
    accepted counts, the requests when rows keep the engine's order, and every
    padding entry (the leading query start only for regrouped rows);
    :func:`_step_rows` and the token writers write the rest.
    """
    spec, decode, prefill = counts
    live = spec + decode + prefill
    if not in_engine_order:  # the engine-order token writer copies the leading 0 itself
        section[0] = 0
    kind, offset, reads = 2 * rows + 1, 3 * rows + 1, 4 * rows + 1
    accepted, request = 5 * rows + 1, 6 * rows + 1
    if live < rows:
        section[rows + 1 : 7 * rows + 1].reshape(6, rows)[:, live:] = _ROW_PADS
        section[7 * rows + 1 :].reshape(groups, rows)[:, live:] = 0
    if spec:
        section[kind : kind + spec] = SPEC
        section[reads : reads + spec] = 1  # spec rows read their state
    if spec < live:
        if decode:
            section[kind + spec : kind + spec + decode] = DECODE
        if prefill:
            section[kind + spec + decode : kind + live] = PREFILL
        section[offset + spec : offset + live] = 0
        section[accepted + spec : accepted + live] = 1
    if in_engine_order:
        section[request : request + live] = ramp_to(ramp, live)


def _engine_order_tokens(
    packed: np.ndarray, batch: StepBatch, live: int, tokens: int, rows: int, ramp: np.ndarray
) -> None:
    """Token map, query starts and token starts when group order is engine order."""
    num_tokens, starts = batch.num_tokens, batch.query_start
    packed[tokens : tokens + live + 1] = starts[: live + 1]
    at = tokens + rows + 1  # row_token_start
    packed[at : at + live] = starts[:live]
    packed[:num_tokens] = ramp_to(ramp, num_tokens)


def _regrouped_tokens(
    packed: np.ndarray,
    batch: StepBatch,
    order: np.ndarray,
    lens: np.ndarray,
    tokens: int,
    rows: int,
    ramp: np.ndarray,
) -> None:
    """Token map, query starts, token starts and requests of rows taken in ``order``."""
    num_tokens, live = batch.num_tokens, order.shape[0]
    query_start = packed[tokens : tokens + live + 1]
    np.add.accumulate(lens, 0, None, query_start[1:])
    starts = batch.query_start.take(order)
    at = tokens + rows + 1  # row_token_start
    packed[at : at + live] = starts
    shifts = (starts - query_start[:live]).repeat(lens)
    np.add(shifts, ramp_to(ramp, num_tokens), packed[:num_tokens])
    at += 5 * rows  # row_request
    packed[at : at + live] = order


def _step_rows(
    section: np.ndarray,
    batch: StepBatch,
    order: np.ndarray | None,
    rows: int,
    groups: int,
    query_len_max: int,
) -> None:
    """The row section's per-step entries the token writers leave: query starts of
    padding rows, spec rows' state offsets and accepted counts, the other rows'
    has-state flags, and the slots. ``section`` as in :func:`shape_rows`."""
    spec, decode, prefill, _ = batch.kind_counts
    live = spec + decode + prefill
    if live < rows:  # zero-length padding rows: query starts repeat the total
        section[live + 1 : rows + 1] = batch.num_tokens
    if spec:
        counts = batch.num_accepted_tokens
        counts = counts[:spec] if order is None else counts.take(order[:spec])
        offsets = section[3 * rows + 1 : 3 * rows + 1 + spec]
        np.subtract(counts, _ONE, offsets)
        # One unsigned test checks 1 <= accepted <= Q (accepted - 1 wraps below 1).
        unsigned = offsets.view(np.uint32)
        if unsigned.item(unsigned.argmax()) >= query_len_max:
            _raise_accepted(batch, query_len_max)
        section[5 * rows + 1 : 5 * rows + 1 + spec] = counts
    if spec < live:
        computed = batch.num_computed_tokens
        computed = computed[spec:live] if order is None else computed.take(order[spec:])
        section[4 * rows + 1 + spec : 4 * rows + 1 + live] = computed > _ZERO
    slots = batch.slots
    if order is not None:
        slots = slots.take(order, axis=1)
    elif live < slots.shape[1]:
        slots = slots[:, :live]
    if live == rows:
        section[7 * rows + 1 :] = slots.reshape(-1)
    else:
        section[7 * rows + 1 :].reshape(groups, rows)[:, :live] = slots


def _raise_accepted(batch: StepBatch, query_len_max: int) -> None:
    accepted = batch.num_accepted_tokens
    bad = (batch.kinds == SPEC) & ((accepted < 1) | (accepted > query_len_max))
    row = int(np.argmax(bad))
    raise PlanError(
        "num_accepted_tokens", row, f"{accepted[row]} is outside 1..Q = 1..{query_len_max}"
    )


def _tile_fields(
    fields: np.ndarray,
    prefill_lens: np.ndarray,
    live: int,
    num_tiles: int,
    tile: int,
    ramp: np.ndarray,
) -> None:
    """``tile_row`` and ``tile_start`` (``fields`` is ``[2, P]``): which group-ordered row
    each prefill work tile covers and its first token; -1 and 0 past the live tiles.

    Steps rarely carry more than a few prefill rows; two slice writes per row
    cost less than the six numpy calls of the vectorized form, which is kept
    for many rows only.
    """
    first_prefill = live - prefill_lens.shape[0]
    if prefill_lens.shape[0] <= _LOOP_TILES_UP_TO_ROWS:
        start = 0
        for row, q in enumerate(prefill_lens.tolist(), first_prefill):
            stop = start + (q + tile - 1) // tile
            fields[0, start:stop] = row
            fields[1, start:stop] = ramp_to(ramp, (stop - start) * tile, tile)
            start = stop
    else:
        tiles_per_row = (prefill_lens + (tile - 1)) // tile
        prefill_rows = np.arange(first_prefill, live, dtype=np.int32)
        fields[0, :num_tiles] = prefill_rows.repeat(tiles_per_row)
        first_tile = np.add.accumulate(tiles_per_row) - tiles_per_row
        tile_index = np.arange(num_tiles, dtype=np.int32) - first_tile.repeat(tiles_per_row)
        fields[1, :num_tiles] = tile_index * tile
    if num_tiles < fields.shape[1]:
        fields[:, num_tiles:] = _TILE_PADS
