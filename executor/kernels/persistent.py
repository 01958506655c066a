"""Launch A as persistent programs: each loops over rows of one channel block, loading the
next row while it computes the current one (``Blocks.rows_resident``), and its launcher.

The one-program-per-row launch (:mod:`.rows`) spends each program's first memory round
trip on its plan fields and only the second on the row's data, and every row program
loads the taps again. Here a program keeps its channel block (taps loaded once) and walks
the rows ``r, r + P, r + 2P, ...`` (``P`` programs per channel block), holding the plan
fields two rows ahead and, with PREFETCH, the history and residuals one row ahead: row
``r + P``'s loads are issued before row ``r``'s stores, so a program always has a row's
bytes in flight. Rows of one launch never share a slot (slot 0 aside, which nothing reads
or writes) nor a token, so those early loads never see a store of the rows before them.
A program goes idle at its first row that is not a spec or decode row: launch A's rows
come first in the plan, so that is the first prefill or padding row, and from there on
its iterations load nothing (every mask off), so a graph bucket's padded rows cost a
program one plan read and a few idle iterations, not a program each.
"""

# Triton types kernel arguments at launch, not through annotations.
# ruff: noqa: ANN001

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from .device import (
    _await_previous_kernel,
    _channel_stride,
    _load_history,
    _load_residuals,
    _load_taps,
    _opaque,
    _store_silu_rows,
)
from .grid import _launch_options, _looping_items, _power_of_two_at_least, _stride_alignment
from .rows import (
    _ROW_OFFSETS,
    _finish_row_window,
    _load_whole_window,
    _store_window,
    _window_sources,
)

if TYPE_CHECKING:
    from .launch import LaunchShape
    from .tuning import Blocks


@triton.jit
def _row_fields(plan_ptr, offsets, row, row_count, ROW_TOKENS_MAX: tl.constexpr):
    """``(kind, slot, q, first_token, reads, offset)`` of row ``row``; rows from
    ``row_count`` on read as padding. ``q`` is 0 where the row has no work here (a
    prefill or padding row, or a decode row on the NULL slot, which adds 0). ``offsets``:
    the plan fields' offsets in ``rows._ROW_OFFSETS`` order."""
    query_start_at, token_start_at, kind_at, offset_at, reads_at, slot_at = offsets
    inside = row < row_count
    kind = tl.load(plan_ptr + kind_at + row, mask=inside, other=3)
    slot = tl.load(plan_ptr + slot_at + row, mask=inside, other=0)
    first = tl.load(plan_ptr + query_start_at + row, mask=inside, other=0)
    q = tl.load(plan_ptr + query_start_at + row + 1, mask=inside, other=0) - first
    first_token = tl.load(plan_ptr + token_start_at + row, mask=inside, other=0)
    reads = tl.load(plan_ptr + reads_at + row, mask=inside, other=0)
    offset = tl.load(plan_ptr + offset_at + row, mask=inside, other=0)
    if ROW_TOKENS_MAX == 1:  # a decode-only launch: q is 1, known when compiling
        q = 1
    # Integer flags, not scalar bools (see device._past): spec rows work on any slot.
    works = tl.where(kind == 0, 1, tl.where(kind == 1, tl.minimum(slot, 1), 0))
    return kind, slot, q * works, first_token, reads, offset


@triton.jit
def _idle_unless(fields, alive):
    """``fields`` (:func:`_row_fields`) as a row without work (``q`` 0) unless ``alive`` (1)."""
    kind, slot, q, first_token, reads, offset = fields
    return kind, slot, q * alive, first_token, reads, offset


@triton.jit
def _row_loads(
    memory, fields, chan, chan_ok, REACH: tl.constexpr, ROWS: tl.constexpr,
    WHOLE_WINDOW: tl.constexpr, LEVELS: tl.constexpr,
):  # fmt: skip
    """Every load of a row but its taps, for up to ``ROWS`` tokens (masked to its ``q``;
    a row without work loads nothing): ``(history, residuals)``, or ``(tokens,
    residuals, old window tile)`` for a compact window-contiguous pool (``rows``'
    whole-window path). ``memory``: the operands as the kernel holds them
    (:func:`_short_conv_rows_persistent`)."""
    x_ptr, x_stride, residual_ptr, residual_stride, state_ptr, state_slot, s_chan, s_win = memory
    _kind, slot, q, first_token, reads, offset = fields
    has_slot = tl.minimum(slot, 1) * tl.minimum(q, 1)
    state_end = REACH * tl.minimum(reads, 1) * has_slot
    window_ptr = state_ptr + slot.to(tl.int64) * state_slot
    rows = residual_ptr + first_token.to(tl.int64) * residual_stride + chan
    if WHOLE_WINDOW:
        tokens = _load_history(
            x_ptr, x_stride, first_token, q, window_ptr, 1, 1, state_end, REACH, chan,
            chan_ok, REACH, ROWS, False, True,
        )  # fmt: skip
        residuals = _load_residuals(rows, residual_stride, q, chan_ok, ROWS)
        old = _load_whole_window(window_ptr, has_slot, chan, chan_ok, WHOLE_WINDOW, LEVELS)
        data = (tokens, residuals, old)
    else:
        history = _load_history(
            x_ptr, x_stride, first_token, q, window_ptr + offset * s_win, s_chan, s_win,
            state_end, 0, chan, chan_ok, REACH, REACH + ROWS, True, False,
        )  # fmt: skip
        data = (history, _load_residuals(rows, residual_stride, q, chan_ok, ROWS))
    return data


@triton.jit
def _row_outputs(
    data, fields, taps, memory, chan, chan_ok, TAPS: tl.constexpr, DILATION: tl.constexpr,
    ROWS: tl.constexpr, QUERY_MAX: tl.constexpr, WINDOW_BLOCK: tl.constexpr,
    WINDOW_TILE: tl.constexpr, WHOLE_WINDOW: tl.constexpr, LEVELS: tl.constexpr,
    BLOCK_C: tl.constexpr, FAST: tl.constexpr,
):  # fmt: skip
    """A row's outputs and new window from its loaded ``data`` (:func:`_row_loads`), as
    ``ROWS`` tokens (``data`` may hold more, unused)."""
    reach: tl.constexpr = (TAPS - 1) * DILATION
    x_ptr, x_stride, residual_ptr, residual_stride, state_ptr, state_slot, s_chan, s_win = memory
    _kind, slot, q, first_token, reads, offset = fields
    has_slot = tl.minimum(slot, 1)
    state_end = reach * tl.minimum(reads, 1) * has_slot
    window_ptr = state_ptr + slot.to(tl.int64) * state_slot
    rows = residual_ptr + first_token.to(tl.int64) * residual_stride + chan
    if WHOLE_WINDOW:
        tokens, residuals, old = data
        _finish_row_window(
            old, tokens, residuals, taps, rows, residual_stride, q, window_ptr, offset,
            state_end, has_slot, chan, chan_ok, TAPS, DILATION, ROWS, QUERY_MAX, WHOLE_WINDOW,
            LEVELS, BLOCK_C, FAST,
        )  # fmt: skip
    else:
        history, residuals = data
        past_ptr = window_ptr + offset * s_win
        keep = (reach + q - 1) * has_slot
        past, tokens = _window_sources(
            x_ptr, x_stride, first_token, past_ptr, s_chan, s_win, state_end, keep, chan,
            chan_ok, reach, WINDOW_BLOCK, WINDOW_TILE,
        )  # fmt: skip
        _store_silu_rows(
            rows, residual_stride, q, chan_ok, history, taps, residuals,
            residual_ptr.dtype.element_ty, ROWS, TAPS, DILATION, BLOCK_C, FAST,
        )  # fmt: skip
        _store_window(
            window_ptr, s_chan, s_win, keep, chan, chan_ok, history, past, tokens, reach, ROWS,
            WINDOW_BLOCK, WINDOW_TILE,
        )  # fmt: skip


@triton.jit
def _row_work(
    data, fields, taps, memory, chan, chan_ok, TAPS: tl.constexpr, DILATION: tl.constexpr,
    QUERY_MAX: tl.constexpr, ROW_TOKENS_MAX: tl.constexpr, WINDOW_BLOCK: tl.constexpr,
    WINDOW_TILE: tl.constexpr, WHOLE_WINDOW: tl.constexpr, LEVELS: tl.constexpr,
    BLOCK_C: tl.constexpr, FAST: tl.constexpr,
):  # fmt: skip
    """:func:`_row_outputs` where the row has work; rows of one token (decode rows, spec
    rows without drafts) compile apart, as in ``rows._short_conv_rows``."""
    q = fields[2]
    if q == 1:
        _row_outputs(
            data, fields, taps, memory, chan, chan_ok, TAPS, DILATION, 1, QUERY_MAX,
            WINDOW_BLOCK, WINDOW_TILE, WHOLE_WINDOW, LEVELS, BLOCK_C, FAST,
        )  # fmt: skip
    elif q > 1:
        _row_outputs(
            data, fields, taps, memory, chan, chan_ok, TAPS, DILATION, ROW_TOKENS_MAX,
            QUERY_MAX, WINDOW_BLOCK, WINDOW_TILE, WHOLE_WINDOW, LEVELS, BLOCK_C, FAST,
        )  # fmt: skip


@triton.jit(do_not_specialize=(*_ROW_OFFSETS, "row_count"))
def _short_conv_rows_persistent(
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
    row_count,
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
    PREFETCH: tl.constexpr,
    ALIGN: tl.constexpr,
    FAST: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Launch A on a grid ``(P, channel blocks)``: program ``(p, b)`` runs rows ``p, p + P,
    ...`` below ``row_count`` over channel block ``b``, idle from its first row that is not
    a spec or decode row on (the module docstring). ALIGN (16 or 1) divides the token strides
    and the state's window stride."""
    _await_previous_kernel(DEPENDENT)
    reach: tl.constexpr = (TAPS - 1) * DILATION
    levels: tl.constexpr = (WHOLE_WINDOW - 1).bit_length() if WHOLE_WINDOW else 0
    first_row = tl.program_id(0)
    stride = tl.num_programs(0)
    offsets = (query_start_at, token_start_at, kind_at, offset_at, reads_at, slot_at)
    fields = _row_fields(plan_ptr, offsets, first_row, row_count, ROW_TOKENS_MAX)
    later_fields = _row_fields(plan_ptr, offsets, first_row + stride, row_count, ROW_TOKENS_MAX)
    s_chan = _channel_stride(state_chan, CHANNEL_UNIT, WHOLE_WINDOW)
    s_win = 1 if WINDOW_UNIT else state_win
    chan = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    chan_ok = chan < channels
    taps = _load_taps(weight_ptr, weight_chan, weight_tap, chan, chan_ok, TAPS)  # once
    memory = (x_ptr, x_stride, residual_ptr, residual_stride, state_ptr, state_slot, s_chan, s_win)
    data = _row_loads(memory, fields, chan, chan_ok, reach, ROW_TOKENS_MAX, WHOLE_WINDOW, levels)
    # A counted loop that goes idle, not a while loop that stops: Triton 3.6 cannot
    # compile a while loop carrying tensors (TritonGPURemoveLayoutConversions asserts).
    # From the first row that is not launch A's on, ``alive`` 0 masks every load and
    # store: the rest of the program's rows read and write nothing (the module docstring).
    alive = 1
    for row in range(first_row, row_count, stride):
        alive *= tl.where(fields[0] <= 1, 1, 0)  # an integer flag: see _row_fields
        limit = row_count * alive
        fields = _idle_unless(fields, alive)
        later_fields = _idle_unless(later_fields, alive)
        later = row + stride
        # Strides made anew per row: else the compiler hoists each history row's address
        # arithmetic out of the loop and holds it in registers through it.
        x_rows = _opaque(x_stride, ALIGN, FAST)
        residual_rows = _opaque(residual_stride, ALIGN, FAST)
        entries = s_win if WINDOW_UNIT else _opaque(state_win, ALIGN, FAST)
        memory = (
            x_ptr,
            x_rows,
            residual_ptr,
            residual_rows,
            state_ptr,
            state_slot,
            s_chan,
            entries,
        )
        if PREFETCH:  # the next row's loads go out before this row's stores
            after_fields = _row_fields(plan_ptr, offsets, later + stride, limit, ROW_TOKENS_MAX)
            later_data = _row_loads(
                memory, later_fields, chan, chan_ok, reach, ROW_TOKENS_MAX, WHOLE_WINDOW, levels
            )
        _row_work(
            data, fields, taps, memory, chan, chan_ok, TAPS, DILATION, QUERY_MAX,
            ROW_TOKENS_MAX, WINDOW_BLOCK, WINDOW_TILE, WHOLE_WINDOW, levels, BLOCK_C, FAST,
        )  # fmt: skip
        if not PREFETCH:  # one row at a time: the next row's loads after this row's stores
            after_fields = _row_fields(plan_ptr, offsets, later + stride, limit, ROW_TOKENS_MAX)
            later_data = _row_loads(
                memory, later_fields, chan, chan_ok, reach, ROW_TOKENS_MAX, WHOLE_WINDOW, levels
            )
        data = later_data
        fields = later_fields
        later_fields = after_fields


def _launch_rows_persistent(
    shape: LaunchShape,
    blocks: Blocks,
    offsets: tuple[int, ...],
    buffers: tuple,
    sizes: tuple,
    static: dict,
    multiprocessors: int,
) -> None:
    reach = (static["TAPS"] - 1) * static["DILATION"]
    channel_blocks = -(-sizes[0] // blocks.rows_channels)
    programs = _looping_items(
        shape.rows_grid, channel_blocks, blocks.rows_resident, multiprocessors
    )
    _short_conv_rows_persistent[(programs, channel_blocks)](
        *buffers,
        *offsets,
        shape.rows_grid,
        *sizes,
        **static,
        QUERY_MAX=shape.query_len_max,
        ROW_TOKENS_MAX=shape.row_tokens_max,
        WINDOW_BLOCK=_power_of_two_at_least(reach + shape.query_len_max),
        WINDOW_TILE=blocks.rows_window_tile,
        BLOCK_C=blocks.rows_channels,
        PREFETCH=blocks.rows_prefetch,
        ALIGN=_stride_alignment(sizes[1:3] + (() if static["WINDOW_UNIT"] else sizes[5:6])),
        num_warps=blocks.rows_warps,
        **_launch_options(static, 0),
    )
