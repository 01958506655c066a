"""``compile_plan``: one step's request set to one execution plan (SPEC §3)."""

from __future__ import annotations

import numpy as np

from .batch import DECODE, PADDING, PREFILL, SPEC, StepBatch
from .config import PlannerConfig
from .errors import PlanError
from .layout import FIELDS, PlanLayout
from .plan import ExecutionPlan, GraphKey


def _read_only(values: object, shape: tuple[int, ...] = ()) -> np.ndarray:
    array = np.array(values, dtype=np.int32).reshape(shape)
    array.flags.writeable = False
    return array


_ZERO, _ONE = _read_only(0), _read_only(1)
# Padding of the six [R] fields from row_token_start to row_request, as one column.
_ROW_PADS = _read_only([pad for _, size, pad in FIELDS if size == "R"], (6, 1))
_TILE_PADS = _read_only([pad for name, _, pad in FIELDS if name.startswith("tile_")], (2, 1))
_LOOP_TILES_UP_TO_ROWS = 8


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


def _compile(batch: StepBatch, config: PlannerConfig, *, in_engine_order: bool) -> ExecutionPlan:
    """``compile_plan`` with the row order given; ``in_engine_order=False`` (sorting the
    rows by kind) gives the same plan for any batch, and is what the tests compare with."""
    num_spec, num_decode, num_prefill, _ = batch.kind_counts
    _check_limits(batch, config)
    live = num_spec + num_decode + num_prefill
    order = None if in_engine_order else batch.kinds.argsort(kind="stable")[:live]
    lens = batch.query_lens[:live] if order is None else batch.query_lens.take(order)
    prefill_lens = lens[num_spec + num_decode :]
    num_tiles = _count_tiles(prefill_lens, config.prefill_tile_tokens)
    num_tokens = batch.num_tokens  # padding rows have no tokens
    graph = _choose_graph(batch, config, num_tokens)
    if graph is None:
        layout = PlanLayout(num_tokens, live, num_tiles, batch.num_groups)
    else:
        layout = PlanLayout(graph.num_tokens, graph.num_rows, graph.num_tiles, batch.num_groups)
    packed = _pack(batch, config, order, lens, layout, prefill_lens, num_tiles)
    spec_tokens = num_tokens if num_spec == live else int(packed[layout.num_tokens + num_spec])
    return ExecutionPlan(
        batch,
        config,
        num_spec,
        num_decode,
        num_prefill,
        spec_tokens,
        num_decode,
        num_tokens - spec_tokens - num_decode,
        int(prefill_lens[prefill_lens.argmax()]) if num_prefill else 0,
        num_tiles,
        graph,
        layout,
        packed,
    )


def _count_tiles(prefill_lens: np.ndarray, tile: int) -> int:
    """Prefill work tiles of ``tile`` tokens the rows of ``prefill_lens`` need."""
    if prefill_lens.shape[0] <= _LOOP_TILES_UP_TO_ROWS:  # a few rows: plain ints are cheaper
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


def _choose_graph(batch: StepBatch, config: PlannerConfig, num_tokens: int) -> GraphKey | None:
    """The smallest bucket that fits, or ``None`` (eager) where none does."""
    num_spec, num_decode, num_prefill, _ = batch.kind_counts
    live = num_spec + num_decode + num_prefill
    if config.graph_mode == "none" or live == 0:
        return None
    need_tokens = max(num_tokens, batch.num_padded_tokens or 0)
    if num_spec == live or num_decode == live:
        per_row = config.query_len_max if num_spec else 1
        rows = config.smallest_size(max(live, -(-need_tokens // per_row)), rows=True)
        if rows is not None:
            return GraphKey("spec" if num_spec else "decode", rows * per_row, rows, 0)
    if config.graph_mode != "mixed":
        return None
    tokens = config.smallest_size(need_tokens)
    rows = config.smallest_size(live, rows=True)
    if tokens is None or rows is None:
        return None
    return GraphKey("mixed", tokens, rows, _tile_capacity(tokens, rows, config))


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
) -> np.ndarray:
    """Write one plan's fields into a fresh int32 buffer, laid out as ``layout`` says.

    Rows arrive in group order, so each group is a contiguous range and most
    fields are filled per range, each straight into its slice of the buffer;
    entries past the live part get their field's padding value
    (``layout.FIELDS``). ``order`` maps group-ordered rows to engine rows;
    ``None`` when they coincide (then every gather is a prefix view).
    """
    tokens, rows, groups = layout.num_tokens, layout.num_rows, layout.num_groups
    at_rows = tokens + rows + 1  # row_token_start, then the other [R] fields
    at_slots = at_rows + 6 * rows
    at_tiles = at_slots + groups * rows
    packed = np.empty(at_tiles + 2 * layout.num_tiles, dtype=np.int32)
    live = lens.shape[0]
    if order is None:
        _engine_order_tokens(packed, batch, live, tokens, rows, config.index_ramp)
    else:
        _regrouped_tokens(packed, batch, order, lens, tokens, rows, config.index_ramp)
    _row_fields(packed, batch, order, at_rows, rows, config.query_len_max)
    _slot_field(packed[at_slots:at_tiles], batch.slots, order, live, groups, rows)
    if layout.num_tiles:
        tile_fields = packed[at_tiles:].reshape(2, layout.num_tiles)
        tile = config.prefill_tile_tokens
        _tile_fields(tile_fields, prefill_lens, live, num_tiles, tile, config.index_ramp)
    num_tokens = batch.num_tokens
    if num_tokens < tokens:
        packed[num_tokens:tokens] = -1
    if live < rows:  # zero-length padding rows: query starts repeat the total
        packed[tokens + live + 1 : at_rows] = num_tokens
        packed[at_rows:at_slots].reshape(6, rows)[:, live:] = _ROW_PADS
    packed.flags.writeable = False
    return packed


def _engine_order_tokens(
    packed: np.ndarray, batch: StepBatch, live: int, tokens: int, rows: int, ramp: np.ndarray
) -> None:
    """Token map, query starts, token starts and requests when group order is engine order."""
    num_tokens, starts = batch.num_tokens, batch.query_start
    packed[tokens : tokens + live + 1] = starts[: live + 1]
    at = tokens + rows + 1  # row_token_start
    packed[at : at + live] = starts[:live]
    if num_tokens > ramp.shape[0]:
        ramp = np.arange(num_tokens, dtype=np.int32)
    packed[:num_tokens] = ramp[:num_tokens]
    at += 5 * rows  # row_request
    packed[at : at + live] = ramp[:live]


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
    query_start[0] = 0
    np.add.accumulate(lens, 0, None, query_start[1:])
    starts = batch.query_start.take(order)
    at = tokens + rows + 1  # row_token_start
    packed[at : at + live] = starts
    shifts = (starts - query_start[:live]).repeat(lens)
    if num_tokens > ramp.shape[0]:
        ramp = np.arange(num_tokens, dtype=np.int32)
    np.add(shifts, ramp[:num_tokens], packed[:num_tokens])
    at += 5 * rows  # row_request
    packed[at : at + live] = order


def _row_fields(
    packed: np.ndarray,
    batch: StepBatch,
    order: np.ndarray | None,
    at: int,
    rows: int,
    query_len_max: int,
) -> None:
    """Per-row kind, state offset, has-state flag and accepted count, group by group.

    ``at`` is row_token_start's offset; the four fields follow it, ``rows`` apart.
    """
    spec, decode, prefill, _ = batch.kind_counts
    live = spec + decode + prefill
    kind, offset, reads, accepted = at + rows, at + 2 * rows, at + 3 * rows, at + 4 * rows
    if spec:
        counts = batch.num_accepted_tokens
        counts = counts[:spec] if order is None else counts.take(order[:spec])
        offsets = counts - _ONE
        # One unsigned test checks 1 <= accepted <= Q (accepted - 1 wraps below 1).
        unsigned = offsets.view(np.uint32)
        if unsigned.item(unsigned.argmax()) >= query_len_max:
            _raise_accepted(batch, query_len_max)
        packed[kind : kind + spec] = SPEC
        packed[offset : offset + spec] = offsets
        packed[reads : reads + spec] = 1
        packed[accepted : accepted + spec] = counts
    if spec < live:
        packed[kind + spec : kind + spec + decode] = DECODE
        packed[kind + spec + decode : kind + live] = PREFILL
        packed[offset + spec : offset + live] = 0
        computed = batch.num_computed_tokens
        computed = computed[spec:live] if order is None else computed.take(order[spec:])
        packed[reads + spec : reads + live] = computed > _ZERO
        packed[accepted + spec : accepted + live] = 1


def _raise_accepted(batch: StepBatch, query_len_max: int) -> None:
    accepted = batch.num_accepted_tokens
    bad = (batch.kinds == SPEC) & ((accepted < 1) | (accepted > query_len_max))
    row = int(np.argmax(bad))
    raise PlanError(
        "num_accepted_tokens", row, f"{accepted[row]} is outside 1..Q = 1..{query_len_max}"
    )


def _slot_field(
    field: np.ndarray,
    slots: np.ndarray,
    order: np.ndarray | None,
    live: int,
    groups: int,
    rows: int,
) -> None:
    """``row_slot``: ``[G, R]`` (``field`` is its flat slice), padded with the NULL slot."""
    if order is not None:
        slots = slots.take(order, axis=1)
    elif live < slots.shape[1]:
        slots = slots[:, :live]
    if live == rows:
        field[:] = slots.reshape(-1)
        return
    field = field.reshape(groups, rows)
    field[:, :live] = slots
    field[:, live:] = 0


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
            span = (stop - start) * tile
            starts = ramp[:span:tile] if span <= ramp.shape[0] else range(0, span, tile)
            fields[1, start:stop] = starts
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
