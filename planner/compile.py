"""``compile_plan``: one step's request set to one execution plan (SPEC §3).

Its numpy packer is the specification of a plan's bytes: the compiled packer (``csrc/``,
which :class:`~.planner.Planner` uses) fills the same buffer byte for byte.
"""

from __future__ import annotations

import numpy as np

from .batch import DECODE, PADDING, PREFILL, SPEC, StepBatch
from .buckets import choose_graph
from .config import PlannerConfig
from .errors import PlanError
from .layout import FIELD_INDEX, FIELDS, PAD_VALUES, PlanLayout
from .plan import ExecutionPlan


def _read_only(values: object, shape: tuple[int, ...] = ()) -> np.ndarray:
    array = np.array(values, dtype=np.int32).reshape(shape)
    array.flags.writeable = False
    return array


_ZERO, _ONE = _read_only(0), _read_only(1)
# Positions of the fields in PlanLayout.starts().
(_TOKEN_MAP, _QUERY_START, _TOKEN_START, _KIND, _STATE_OFFSET, _READS_STATE, _ACCEPTED) = (
    FIELD_INDEX[name]
    for name in (
        "token_map",
        "row_query_start",
        "row_token_start",
        "row_kind",
        "row_state_offset",
        "row_reads_state",
        "row_num_accepted",
    )
)
_REQUEST, _SLOT, _TILE_ROW, _TILE_START = (
    FIELD_INDEX[name] for name in ("row_request", "row_slot", "tile_row", "tile_start")
)
_TOKEN_PAD, _SLOT_PAD = PAD_VALUES[_TOKEN_MAP], PAD_VALUES[_SLOT]
# The [R] fields lie side by side, row_token_start to row_request: padded as one block.
_ROW_BLOCK = [index for index, (_, size, _) in enumerate(FIELDS) if size == "R"]
assert list(range(_TOKEN_START, _SLOT)) == _ROW_BLOCK, "the [R] fields must be contiguous"
_ROW_PADS = _read_only([PAD_VALUES[index] for index in _ROW_BLOCK], (len(_ROW_BLOCK), 1))
_TILE_PADS = _read_only([PAD_VALUES[_TILE_ROW], PAD_VALUES[_TILE_START]], (2, 1))
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
    (:func:`check_limits`).
    """
    return _compile(batch, config, in_engine_order=_rows_in_group_order(batch))


def check_limits(batch: StepBatch, config: PlannerConfig) -> None:
    """Raise ``compile_plan``'s :class:`PlanError` where ``batch`` breaks ``config``'s
    limits, checked in this order: drafts beyond ``num_spec_tokens``, more live rows
    than ``max_num_seqs``, accepted counts of spec rows outside ``1..Q``."""
    _check_drafts_and_rows(batch, config)
    accepted = batch.num_accepted_tokens[batch.kinds == SPEC]
    if accepted.size and (accepted.min() < 1 or accepted.max() > config.query_len_max):
        _raise_accepted(batch, config.query_len_max)


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
    _check_drafts_and_rows(batch, config)
    live = num_spec + num_decode + num_prefill
    order = None if in_engine_order else batch.kinds.argsort(kind="stable")[:live]
    lens = batch.query_lens[:live] if order is None else batch.query_lens.take(order)
    prefill_lens = lens[num_spec + num_decode :]
    num_tiles = _count_tiles(prefill_lens, config.prefill_tile_tokens)
    num_tokens = batch.num_tokens  # padding rows have no tokens
    need = max(num_tokens, batch.num_padded_tokens or 0)
    graph = choose_graph(config, num_spec, num_decode, num_prefill, need)
    groups = batch.num_groups
    if graph is None:
        layout = PlanLayout(num_tokens, live, num_tiles, groups)
    else:
        layout = graph.layout(groups)
    at = layout.starts()
    packed = _pack(batch, config, order, lens, layout, at, prefill_lens, num_tiles)
    spec_tokens = num_tokens if num_spec == live else int(packed[at[_QUERY_START] + num_spec])
    return ExecutionPlan(
        batch=batch,
        config=config,
        num_spec_rows=num_spec,
        num_decode_rows=num_decode,
        num_prefill_rows=num_prefill,
        num_spec_decode_tokens=spec_tokens,
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


def _check_drafts_and_rows(batch: StepBatch, config: PlannerConfig) -> None:
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


def _pack(
    batch: StepBatch,
    config: PlannerConfig,
    order: np.ndarray | None,
    lens: np.ndarray,
    layout: PlanLayout,
    at: tuple[int, ...],
    prefill_lens: np.ndarray,
    num_tiles: int,
) -> np.ndarray:
    """Write one plan's fields into a fresh int32 buffer, laid out as ``layout`` says
    (``at`` is its :meth:`~.PlanLayout.starts`).

    Rows arrive in group order, so each group is a contiguous range and most
    fields are filled per range, each straight into its slice of the buffer;
    entries past the live part get their field's padding value
    (``layout.FIELDS``). ``order`` maps group-ordered rows to engine rows;
    ``None`` when they coincide (then every gather is a prefix view).
    """
    rows, groups = layout.num_rows, layout.num_groups
    packed = np.empty(at[-1], dtype=np.int32)
    counts = batch.kind_counts[:PADDING]
    _shape_rows(packed, at, rows, groups, counts, order is None, config.index_ramp)
    num_tokens, token_map = batch.num_tokens, at[_TOKEN_MAP]
    if num_tokens < layout.num_tokens:
        packed[token_map + num_tokens : token_map + layout.num_tokens] = _TOKEN_PAD
    if order is None:
        _engine_order_tokens(packed, at, batch, lens.shape[0], config.index_ramp)
    else:
        _regrouped_tokens(packed, at, batch, order, lens, config.index_ramp)
    _step_rows(packed, at, batch, order, rows, config.query_len_max)
    if layout.num_tiles:
        tile_fields = packed[at[_TILE_ROW] : at[_TILE_START + 1]].reshape(2, layout.num_tiles)
        tile = config.prefill_tile_tokens
        _tile_fields(tile_fields, prefill_lens, lens.shape[0], num_tiles, tile, config.index_ramp)
    packed.flags.writeable = False
    return packed


def _shape_rows(
    packed: np.ndarray,
    at: tuple[int, ...],
    rows: int,
    groups: int,
    counts: tuple[int, int, int],
    in_engine_order: bool,
    ramp: np.ndarray,
) -> None:
    """The row fields' entries that only the plan's shape decides.

    ``counts`` are the live rows per group. Writes the leading query start,
    every row kind, the constant parts of state offsets, has-state flags and
    accepted counts, the requests when rows keep the engine's order, and every
    padding entry (the leading query start only for regrouped rows);
    :func:`_step_rows` and the token writers write the rest.
    """
    spec, decode, prefill = counts
    live = spec + decode + prefill
    if not in_engine_order:  # the engine-order token writer copies the leading 0 itself
        packed[at[_QUERY_START]] = 0
    kind, offset, reads = at[_KIND], at[_STATE_OFFSET], at[_READS_STATE]
    accepted, request = at[_ACCEPTED], at[_REQUEST]
    if live < rows:
        block = packed[at[_TOKEN_START] : at[_SLOT]].reshape(len(_ROW_BLOCK), rows)
        block[:, live:] = _ROW_PADS
        packed[at[_SLOT] : at[_TILE_ROW]].reshape(groups, rows)[:, live:] = _SLOT_PAD
    if spec:
        packed[kind : kind + spec] = SPEC
        packed[reads : reads + spec] = 1  # spec rows read their state
    if spec < live:
        if decode:
            packed[kind + spec : kind + spec + decode] = DECODE
        if prefill:
            packed[kind + spec + decode : kind + live] = PREFILL
        packed[offset + spec : offset + live] = 0
        packed[accepted + spec : accepted + live] = 1
    if in_engine_order:
        packed[request : request + live] = ramp_to(ramp, live)


def _engine_order_tokens(
    packed: np.ndarray, at: tuple[int, ...], batch: StepBatch, live: int, ramp: np.ndarray
) -> None:
    """Token map, query starts and token starts when group order is engine order."""
    num_tokens, starts = batch.num_tokens, batch.query_start
    query_start, token_start, token_map = at[_QUERY_START], at[_TOKEN_START], at[_TOKEN_MAP]
    packed[query_start : query_start + live + 1] = starts[: live + 1]
    packed[token_start : token_start + live] = starts[:live]
    packed[token_map : token_map + num_tokens] = ramp_to(ramp, num_tokens)


def _regrouped_tokens(
    packed: np.ndarray,
    at: tuple[int, ...],
    batch: StepBatch,
    order: np.ndarray,
    lens: np.ndarray,
    ramp: np.ndarray,
) -> None:
    """Token map, query starts, token starts and requests of rows taken in ``order``."""
    num_tokens, live = batch.num_tokens, order.shape[0]
    query_start = packed[at[_QUERY_START] : at[_QUERY_START] + live + 1]
    np.add.accumulate(lens, 0, None, query_start[1:])
    starts = batch.query_start.take(order)
    packed[at[_TOKEN_START] : at[_TOKEN_START] + live] = starts
    shifts = (starts - query_start[:live]).repeat(lens)
    token_map = packed[at[_TOKEN_MAP] : at[_TOKEN_MAP] + num_tokens]
    np.add(shifts, ramp_to(ramp, num_tokens), token_map)
    packed[at[_REQUEST] : at[_REQUEST] + live] = order


def _step_rows(
    packed: np.ndarray,
    at: tuple[int, ...],
    batch: StepBatch,
    order: np.ndarray | None,
    rows: int,
    query_len_max: int,
) -> None:
    """The row fields' per-step entries the token writers leave: query starts of
    padding rows, spec rows' state offsets and accepted counts, the other rows'
    has-state flags, and the slots."""
    spec, decode, prefill, _ = batch.kind_counts
    live = spec + decode + prefill
    if live < rows:  # zero-length padding rows: query starts repeat the total
        packed[at[_QUERY_START] + live + 1 : at[_TOKEN_START]] = batch.num_tokens
    if spec:
        counts = batch.num_accepted_tokens
        counts = counts[:spec] if order is None else counts.take(order[:spec])
        offsets = packed[at[_STATE_OFFSET] : at[_STATE_OFFSET] + spec]
        np.subtract(counts, _ONE, offsets)
        # One unsigned test checks 1 <= accepted <= Q (accepted - 1 wraps below 1).
        unsigned = offsets.view(np.uint32)
        if unsigned.item(unsigned.argmax()) >= query_len_max:
            _raise_accepted(batch, query_len_max)
        packed[at[_ACCEPTED] : at[_ACCEPTED] + spec] = counts
    if spec < live:
        computed = batch.num_computed_tokens
        computed = computed[spec:live] if order is None else computed.take(order[spec:])
        packed[at[_READS_STATE] + spec : at[_READS_STATE] + live] = computed > _ZERO
    slots = batch.slots
    if order is not None:
        slots = slots.take(order, axis=1)
    elif live < slots.shape[1]:
        slots = slots[:, :live]
    slot_field = packed[at[_SLOT] : at[_TILE_ROW]]
    if live == rows:
        slot_field[:] = slots.reshape(-1)
    else:
        slot_field.reshape(slots.shape[0], rows)[:, :live] = slots


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
