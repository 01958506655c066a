"""Launch A: the row programs, one per (spec or decode row, channel block), and their launcher."""

# Triton types kernel arguments at launch, not through annotations.
# ruff: noqa: ANN001

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from .device import (
    _add_silu_rows,
    _await_previous_kernel,
    _channel_stride,
    _live,
    _load_history,
    _load_residuals,
    _load_taps,
    _past,
    _program_place,
    _store_silu_rows,
    _tokens,
    _write_window,
)
from .grid import _grid, _launch_options, _power_of_two_at_least

if TYPE_CHECKING:
    from .launch import LaunchShape
    from .tuning import Blocks

_ROW_OFFSETS = ("query_start_at", "token_start_at", "kind_at", "offset_at", "reads_at", "slot_at")


@triton.jit
def _update_row(
    x_ptr, x_stride, residual_ptr, residual_stride, weight_ptr, weight_chan, weight_tap,
    first_token, q, window_ptr, past_ptr, s_chan, s_win, state_end, has_slot, chan, chan_ok,
    TAPS: tl.constexpr, DILATION: tl.constexpr, ROWS: tl.constexpr, WINDOW_BLOCK: tl.constexpr,
    WINDOW_TILE: tl.constexpr, BLOCK_C: tl.constexpr, FAST: tl.constexpr,
):  # fmt: skip
    """One spec or decode row of ``q <= ROWS`` tokens: its outputs, then its new window.

    Compact window-contiguous pools take :func:`_update_row_window` instead."""
    reach: tl.constexpr = (TAPS - 1) * DILATION
    history = _load_history(
        x_ptr, x_stride, first_token, q, past_ptr, s_chan, s_win, state_end, 0, chan,
        chan_ok, reach, reach + ROWS, True, False,
    )  # fmt: skip
    taps = _load_taps(weight_ptr, weight_chan, weight_tap, chan, chan_ok, TAPS)
    # The new window S[:, i] = h[1 + i], i < L + q - 1 (decode: q = 1, so L entries).
    keep = (reach + q - 1) * has_slot
    past, tokens = _window_sources(
        x_ptr, x_stride, first_token, past_ptr, s_chan, s_win, state_end, keep, chan, chan_ok,
        reach, WINDOW_BLOCK, WINDOW_TILE,
    )  # fmt: skip
    _add_silu_rows(
        residual_ptr, residual_stride, first_token, q, chan, chan_ok, history, taps,
        ROWS, TAPS, DILATION, BLOCK_C, FAST,
    )  # fmt: skip
    _store_window(
        window_ptr, s_chan, s_win, keep, chan, chan_ok, history, past, tokens, reach, ROWS,
        WINDOW_BLOCK, WINDOW_TILE,
    )  # fmt: skip


@triton.jit
def _window_sources(
    x_ptr, x_stride, first_token, past_ptr, s_chan, s_win, state_end, keep, chan, chan_ok,
    REACH: tl.constexpr, WINDOW_BLOCK: tl.constexpr, WINDOW_TILE: tl.constexpr,
):  # fmt: skip
    """``(past, tokens)``: the new window's ``[WINDOW_BLOCK, BLOCK_C]`` sources where the
    row stores it as one tile (WINDOW_TILE); where entry by entry, placeholders that
    :func:`_store_window` never reads (a Triton function cannot return ``None``).

    Window-contiguous state: one tile, each channel's window stored as one contiguous run;
    entry-by-entry stores would write 2 of every 2W bytes. Its loads hit the lines the
    history just brought in."""
    past = chan_ok
    tokens = chan_ok
    if WINDOW_TILE:
        i = tl.arange(0, WINDOW_BLOCK)[:, None]
        kept = (i < keep) & chan_ok[None, :]
        past = _past(past_ptr, s_chan, s_win, state_end, i + 1, chan, kept)
        tokens = _tokens(x_ptr, x_stride, first_token, i + 1, chan, kept, REACH)
    return past, tokens


@triton.jit
def _store_window(
    window_ptr, s_chan, s_win, keep, chan, chan_ok, history, past, tokens, REACH: tl.constexpr,
    ROWS: tl.constexpr, WINDOW_BLOCK: tl.constexpr, WINDOW_TILE: tl.constexpr,
):  # fmt: skip
    """The row's new window ``S[:, i] = h[1 + i]``, ``i < keep``: from
    :func:`_window_sources`' tiles, or entry by entry from ``history``."""
    # The stores' register layout may differ from the loads': every thread must have
    # read the old window before any thread overwrites it.
    tl.debug_barrier()
    if WINDOW_TILE:
        i = tl.arange(0, WINDOW_BLOCK)[:, None]
        kept = (i < keep) & chan_ok[None, :]
        _write_window(window_ptr, s_chan, s_win, i, chan, kept, i + 1, past, tokens, REACH)
    else:
        for i in tl.static_range(REACH + ROWS - 1):
            ptrs = window_ptr + chan * s_chan + i * s_win
            tl.store(ptrs, history[i + 1], mask=_live(chan_ok, i, keep))


@triton.jit
def _column(tile, c: tl.constexpr, BLOCK_C: tl.constexpr, LEVELS: tl.constexpr):
    """Column ``c`` of a ``[BLOCK_C, 2**LEVELS]`` tile as a ``[BLOCK_C]`` vector.

    Halving splits that follow ``c``'s bits (equal splits of other columns are
    shared after CSE); the compiler moves the tile once through shared memory so
    each thread holds whole rows, then every split is a register rename."""
    part = tile
    for level in tl.static_range(LEVELS):
        even, odd = tl.split(tl.reshape(part, [BLOCK_C, (1 << LEVELS) >> (level + 1), 2]))
        part = odd if (c >> level) & 1 else even
    return tl.reshape(part, [BLOCK_C])


@triton.jit
def _tile_of(columns, BLOCK_C: tl.constexpr, LEVELS: tl.constexpr):
    """The ``[BLOCK_C, 2**LEVELS]`` tile whose column ``c`` is ``columns[c]``: the
    splits of :func:`_column` undone, deepest level first."""
    parts = ()
    for c in tl.static_range(1 << LEVELS):
        parts = parts + (tl.reshape(columns[c], [BLOCK_C, 1]),)  # noqa: RUF005
    for depth in tl.static_range(LEVELS, 0, -1):
        joined = ()
        # parts[low] and parts[low + 2**(depth - 1)] differ in bit depth - 1 only
        for low in tl.static_range(1 << (depth - 1)):
            pair = tl.join(parts[low], parts[low + (1 << (depth - 1))])
            pair = tl.reshape(pair, [BLOCK_C, (1 << LEVELS) >> (depth - 1)])
            joined = joined + (pair,)  # noqa: RUF005
        parts = joined
    return parts[0]


@triton.jit
def _update_row_window(
    x_ptr, x_stride, residual_ptr, residual_stride, weight_ptr, weight_chan, weight_tap,
    first_token, q, window_ptr, offset, state_end, has_slot, chan, chan_ok,
    TAPS: tl.constexpr, DILATION: tl.constexpr, ROWS: tl.constexpr, QUERY_MAX: tl.constexpr,
    WINDOW: tl.constexpr, LEVELS: tl.constexpr, BLOCK_C: tl.constexpr, FAST: tl.constexpr,
):  # fmt: skip
    """:func:`_update_row` for a compact ``[slot, C, W]`` pool (``W = WINDOW``): each
    window moves as one aligned ``[BLOCK_C, 2**LEVELS]`` tile of 8-byte vectors.

    Loading the entries at the row's offset ``o`` instead made every access 2 bytes
    at a 2W-byte stride (``o`` varies per row, so no alignment is known), which left
    the kernel bound by L1 wavefronts. Here the row's entries are picked out of the
    whole window's columns by a select over ``o``'s Q values, and the new window is
    put back together in registers and stored whole: entries past ``keep`` get their
    own values back, so the store mask has a static bound and stays vectorized."""
    reach: tl.constexpr = (TAPS - 1) * DILATION
    # Every load is issued before the old window's columns, which wait for its trip
    # through shared memory: loads issued after them would start a second memory round
    # trip. The new window is stored before the outputs are computed, freeing both
    # windows' registers for the math.
    tokens = _load_history(
        x_ptr, x_stride, first_token, q, window_ptr, 1, 1, state_end, reach, chan, chan_ok,
        reach, ROWS, False, True,
    )  # fmt: skip
    taps = _load_taps(weight_ptr, weight_chan, weight_tap, chan, chan_ok, TAPS)
    rows = residual_ptr + first_token.to(tl.int64) * residual_stride + chan
    residuals = _load_residuals(rows, residual_stride, q, chan_ok, ROWS)
    old = _load_whole_window(window_ptr, has_slot, chan, chan_ok, WINDOW, LEVELS)
    _finish_row_window(
        old, tokens, residuals, taps, rows, residual_stride, q, window_ptr, offset, state_end,
        has_slot, chan, chan_ok, TAPS, DILATION, ROWS, QUERY_MAX, WINDOW, LEVELS, BLOCK_C, FAST,
    )  # fmt: skip


@triton.jit
def _whole_window_place(
    window_ptr, has_slot, chan, chan_ok, WINDOW: tl.constexpr, LEVELS: tl.constexpr
):
    """``(pointers, mask)`` of the ``[BLOCK_C, 2**LEVELS]`` tile of the row's windows; the
    mask leaves slot 0 untouched."""
    j = tl.arange(0, 1 << LEVELS)[None, :]
    tile_ptrs = window_ptr + chan[:, None] * WINDOW + j
    whole = (j < WINDOW) & chan_ok[:, None] & (j * 0 + has_slot > 0)  # slot 0 untouched
    return tile_ptrs, whole


@triton.jit
def _load_whole_window(
    window_ptr, has_slot, chan, chan_ok, WINDOW: tl.constexpr, LEVELS: tl.constexpr
):
    """The old windows of the row's channels as one ``[BLOCK_C, 2**LEVELS]`` tile."""
    tile_ptrs, whole = _whole_window_place(window_ptr, has_slot, chan, chan_ok, WINDOW, LEVELS)
    return tl.load(tile_ptrs, mask=whole, other=0.0)


@triton.jit
def _finish_row_window(
    old, tokens, residuals, taps, rows, residual_stride, q, window_ptr, offset, state_end,
    has_slot, chan, chan_ok, TAPS: tl.constexpr, DILATION: tl.constexpr, ROWS: tl.constexpr,
    QUERY_MAX: tl.constexpr, WINDOW: tl.constexpr, LEVELS: tl.constexpr,
    BLOCK_C: tl.constexpr, FAST: tl.constexpr,
):  # fmt: skip
    """The rest of :func:`_update_row_window` once its loads are in: the row's history out
    of the old tile's columns, the new window stored whole, then the outputs (``ROWS``
    of them; ``tokens`` and ``residuals`` may hold more, unused)."""
    reach: tl.constexpr = (TAPS - 1) * DILATION
    columns = ()
    for c in tl.static_range(1 << LEVELS):
        columns = columns + (_column(old, c, BLOCK_C, LEVELS),)  # noqa: RUF005
    at = chan * 0 + offset  # o as a vector: a scalar bool in a select breaks the interpreter
    reads = _live(chan_ok, 0, state_end)
    history = ()
    for p in tl.static_range(reach):  # h[p] = S[o + p], or 0 where the row reads no state
        entry = columns[p]
        for o in tl.static_range(1, QUERY_MAX):
            if p + o < WINDOW:
                entry = tl.where(at == o, columns[p + o], entry)
        history = history + (tl.where(reads, entry, 0.0),)  # noqa: RUF005
    history = history + tokens
    # The new window S[:, i] = h[1 + i] for i < keep = L + q - 1, its old value after.
    keep = reach + q - 1
    fresh = ()
    for i in tl.static_range(1 << LEVELS):
        value = columns[i]
        if i + 1 < reach + ROWS:
            value = tl.where(_live(chan_ok, i, keep), history[i + 1], value)
        fresh = fresh + (value,)  # noqa: RUF005
    new = _tile_of(fresh, BLOCK_C, LEVELS)
    tile_ptrs, whole = _whole_window_place(window_ptr, has_slot, chan, chan_ok, WINDOW, LEVELS)
    tl.debug_barrier()  # every thread has read the old window
    tl.store(tile_ptrs, new, mask=whole)
    _store_silu_rows(
        rows, residual_stride, q, chan_ok, history, taps, residuals,
        rows.dtype.element_ty, ROWS, TAPS, DILATION, BLOCK_C, FAST,
    )  # fmt: skip


# Plan offsets change with every layout (graph bucket): specializing on their
# divisibility would compile a kernel per bucket for nothing.
@triton.jit(do_not_specialize=_ROW_OFFSETS)
def _short_conv_rows(
    plan_ptr,
    x_ptr,
    residual_ptr,
    state_ptr,
    weight_ptr,
    query_start_at,
    token_start_at,
    kind_at,
    offset_at,
    reads_at,
    slot_at,
    channels,
    x_stride,
    residual_stride,
    state_slot,
    state_chan,
    state_win,
    weight_chan,
    weight_tap,
    TAPS: tl.constexpr,
    DILATION: tl.constexpr,
    QUERY_MAX: tl.constexpr,
    ROW_TOKENS_MAX: tl.constexpr,
    WINDOW_BLOCK: tl.constexpr,
    WINDOW_TILE: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNEL_UNIT: tl.constexpr,
    WINDOW_UNIT: tl.constexpr,
    WHOLE_WINDOW: tl.constexpr,
    CHANNELS_FIRST: tl.constexpr,
    FAST: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Launch A: one program per (row, channel block) of the spec and decode rows."""
    _await_previous_kernel(DEPENDENT)
    row, chan0 = _program_place(channels, BLOCK_C, CHANNELS_FIRST)
    # Every plan field first, before any branch: one memory round trip, not two.
    kind = tl.load(plan_ptr + kind_at + row)
    slot = tl.load(plan_ptr + slot_at + row)
    first = tl.load(plan_ptr + query_start_at + row)
    q = tl.load(plan_ptr + query_start_at + row + 1) - first
    first_token = tl.load(plan_ptr + token_start_at + row)
    reads = tl.load(plan_ptr + reads_at + row)
    offset = tl.load(plan_ptr + offset_at + row)
    # Prefill rows are launch B's, padding rows nobody's; a decode row on the NULL slot adds 0.
    if (kind > 1) | ((kind == 1) & (slot == 0)):
        return
    reach: tl.constexpr = (TAPS - 1) * DILATION
    # A unit stride as a literal lets Triton coalesce and vectorize along that dimension.
    s_chan = _channel_stride(state_chan, CHANNEL_UNIT, WHOLE_WINDOW)
    s_win = 1 if WINDOW_UNIT else state_win
    chan = chan0 + tl.arange(0, BLOCK_C)
    chan_ok = chan < channels
    has_slot = tl.minimum(slot, 1)  # integer flags, not scalar bools: see _past
    state_end = reach * tl.minimum(reads, 1) * has_slot
    window_ptr = state_ptr + slot.to(tl.int64) * state_slot
    past_ptr = window_ptr + offset * s_win
    # Decode rows (and spec rows without drafts) compile apart: q = 1 needs a quarter
    # of the math and loads of a q = Q row. A launch whose rows are all decodes
    # (ROW_TOKENS_MAX = 1) knows q when compiling, so only that path compiles: without
    # the Q-token path's registers, more of its programs fit on an SM.
    if ROW_TOKENS_MAX == 1:
        q = 1
    if WHOLE_WINDOW:
        levels: tl.constexpr = (WHOLE_WINDOW - 1).bit_length()
        if q == 1:
            _update_row_window(
                x_ptr, x_stride, residual_ptr, residual_stride, weight_ptr, weight_chan,
                weight_tap, first_token, q, window_ptr, offset, state_end, has_slot, chan,
                chan_ok, TAPS, DILATION, 1, QUERY_MAX, WHOLE_WINDOW, levels, BLOCK_C, FAST,
            )  # fmt: skip
        else:
            _update_row_window(
                x_ptr, x_stride, residual_ptr, residual_stride, weight_ptr, weight_chan,
                weight_tap, first_token, q, window_ptr, offset, state_end, has_slot, chan,
                chan_ok, TAPS, DILATION, QUERY_MAX, QUERY_MAX, WHOLE_WINDOW, levels, BLOCK_C,
                FAST,
            )  # fmt: skip
    elif q == 1:
        _update_row(
            x_ptr, x_stride, residual_ptr, residual_stride, weight_ptr, weight_chan, weight_tap,
            first_token, q, window_ptr, past_ptr, s_chan, s_win, state_end, has_slot, chan,
            chan_ok, TAPS, DILATION, 1, WINDOW_BLOCK, WINDOW_TILE, BLOCK_C, FAST,
        )  # fmt: skip
    else:
        _update_row(
            x_ptr, x_stride, residual_ptr, residual_stride, weight_ptr, weight_chan, weight_tap,
            first_token, q, window_ptr, past_ptr, s_chan, s_win, state_end, has_slot, chan,
            chan_ok, TAPS, DILATION, QUERY_MAX, WINDOW_BLOCK, WINDOW_TILE, BLOCK_C, FAST,
        )  # fmt: skip


def _launch_rows(
    shape: LaunchShape,
    blocks: Blocks,
    offsets: tuple[int, ...],
    buffers: tuple,
    sizes: tuple,
    static: dict,
    multiprocessors: int,
) -> None:
    del multiprocessors  # one program per (row, channel block)
    reach = (static["TAPS"] - 1) * static["DILATION"]
    _short_conv_rows[
        _grid(shape.rows_grid, -(-sizes[0] // blocks.rows_channels), blocks.rows_channels_first)
    ](
        *buffers,
        *offsets,
        *sizes,
        **static,
        QUERY_MAX=shape.query_len_max,
        ROW_TOKENS_MAX=shape.row_tokens_max,
        WINDOW_BLOCK=_power_of_two_at_least(reach + shape.query_len_max),
        WINDOW_TILE=blocks.rows_window_tile,
        BLOCK_C=blocks.rows_channels,
        CHANNELS_FIRST=blocks.rows_channels_first,
        num_warps=blocks.rows_warps,
        **_launch_options(static, 0),
    )
