"""Launch B: the tile programs, one per (chunk of a prefill tile, channel block), and their
launcher."""

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
    _load_history,
    _load_taps,
    _opaque,
    _past,
    _program_place,
    _tokens,
    _write_window,
)
from .grid import (
    _grid,
    _launch_options,
    _looping_items,
    _power_of_two_at_least,
    _stride_alignment,
)

if TYPE_CHECKING:
    from .launch import LaunchShape
    from .tuning import Blocks

_TILE_OFFSETS = (
    "query_start_at",
    "token_start_at",
    "reads_at",
    "slot_at",
    "tile_row_at",
    "tile_start_at",
)


@triton.jit
def _update_chunk(
    x_ptr, x_stride, residual_ptr, residual_stride, weight_ptr, weight_chan, weight_tap,
    first_token, q, start, window_ptr, s_chan, s_win, state_end, chan, chan_ok,
    TAPS: tl.constexpr, DILATION: tl.constexpr, SUB: tl.constexpr, BLOCK_C: tl.constexpr,
    STATE: tl.constexpr, FAST: tl.constexpr,
):  # fmt: skip
    """Outputs ``start .. start + SUB - 1`` of one prefill row (those below ``q``)."""
    reach: tl.constexpr = (TAPS - 1) * DILATION
    history = _load_history(
        x_ptr, x_stride, first_token, q, window_ptr, s_chan, s_win, state_end, start, chan,
        chan_ok, reach, reach + SUB, STATE, True,
    )  # fmt: skip
    taps = _load_taps(weight_ptr, weight_chan, weight_tap, chan, chan_ok, TAPS)
    _add_silu_rows(
        residual_ptr, residual_stride, first_token + start, q - start, chan, chan_ok, history,
        taps, SUB, TAPS, DILATION, BLOCK_C, FAST,
    )  # fmt: skip


@triton.jit
def _tile_work(
    plan_ptr, x_ptr, residual_ptr, state_ptr, weight_ptr, query_start_at, token_start_at,
    reads_at, slot_at, row, start, slot, channels, x_stride, residual_stride, state_slot,
    state_chan, state_win, weight_chan, weight_tap, chan0,
    TAPS: tl.constexpr, DILATION: tl.constexpr, SUB: tl.constexpr, REACH_BLOCK: tl.constexpr,
    BLOCK_C: tl.constexpr, CHANNEL_UNIT: tl.constexpr, WINDOW_UNIT: tl.constexpr,
    WHOLE_WINDOW: tl.constexpr, FAST: tl.constexpr,
):  # fmt: skip
    """One chunk of a live prefill tile (``row >= 0``, ``slot`` its row's): its outputs,
    and where it is the request's first chunk, the final state."""
    first = tl.load(plan_ptr + query_start_at + row)
    q = tl.load(plan_ptr + query_start_at + row + 1) - first
    first_token = tl.load(plan_ptr + token_start_at + row)
    reads = tl.load(plan_ptr + reads_at + row)
    # The NULL slot adds 0 and keeps no state; a chunk past the request's end has no work.
    if (slot != 0) & (start < q):
        reach: tl.constexpr = (TAPS - 1) * DILATION
        s_chan = _channel_stride(state_chan, CHANNEL_UNIT, WHOLE_WINDOW)
        s_win = 1 if WINDOW_UNIT else state_win
        chan = chan0 + tl.arange(0, BLOCK_C)
        chan_ok = chan < channels
        state_end = reach * tl.minimum(reads, 1)
        window_ptr = state_ptr + slot.to(tl.int64) * state_slot  # prefill offset o is 0
        if start < reach:  # a chunk whose history starts in the state
            _update_chunk(
                x_ptr, x_stride, residual_ptr, residual_stride, weight_ptr, weight_chan,
                weight_tap, first_token, q, start, window_ptr, s_chan, s_win, state_end, chan,
                chan_ok, TAPS, DILATION, SUB, BLOCK_C, True, FAST,
            )  # fmt: skip
        else:  # tokens only: compiled without the state loads and selects
            _update_chunk(
                x_ptr, x_stride, residual_ptr, residual_stride, weight_ptr, weight_chan,
                weight_tap, first_token, q, start, window_ptr, s_chan, s_win, state_end, chan,
                chan_ok, TAPS, DILATION, SUB, BLOCK_C, False, FAST,
            )  # fmt: skip
        # Only chunk 0 reads old state, so it alone writes the final state
        # S[:, i] = h[q + i], i < L: no other program reads this slot.
        if start == 0:
            i = tl.arange(0, REACH_BLOCK)[:, None]
            keep = (i < reach) & chan_ok[None, :]
            past = _past(window_ptr, s_chan, s_win, state_end, q + i, chan, keep)
            tokens = _tokens(x_ptr, x_stride, first_token, q + i, chan, keep, reach)
            tl.debug_barrier()  # the chunk's reads of the old window come first
            _write_window(window_ptr, s_chan, s_win, i, chan, keep, q + i, past, tokens, reach)


@triton.jit(do_not_specialize=(*_TILE_OFFSETS, "item_count"))
def _short_conv_tiles(
    plan_ptr,
    x_ptr,
    residual_ptr,
    state_ptr,
    weight_ptr,
    query_start_at,
    token_start_at,
    reads_at,
    slot_at,
    tile_row_at,
    tile_start_at,
    item_count,
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
    TILE: tl.constexpr,
    SUB: tl.constexpr,
    REACH_BLOCK: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHANNEL_UNIT: tl.constexpr,
    WINDOW_UNIT: tl.constexpr,
    WHOLE_WINDOW: tl.constexpr,
    CHANNELS_FIRST: tl.constexpr,
    LOOP: tl.constexpr,
    ALIGN: tl.constexpr,
    FAST: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Launch B: SUB-token chunks of prefill tiles, over a channel block each.

    Without LOOP, one program per (chunk, channel block). One chunk per program, not a
    loop over the tile's chunks: a loop's next loads may alias its residual store, so each
    chunk would wait a memory round trip for the last; separate programs keep those round
    trips in flight together. A chunk loads its SUB + L history rows once (the L before it
    come from the previous chunk's rows, mostly from L2). SUB >= L, so only a request's
    first chunk reads old state.

    With LOOP (a graph's launch, sized to its bucket's tile capacity): fewer programs than
    items, each taking the items ``item, item + stride, ...`` (``stride``: the programs on
    the item axis) until the first padding tile; the live tiles come first, so a program
    past them reads one plan word and ends, and the bucket's padding costs at most the
    grid's one read each, not one program per padded chunk and block. ``item_count``
    bounds the items (the tile capacity times the chunks per tile); ALIGN divides the
    token strides (16 or 1).
    """
    _await_previous_kernel(DEPENDENT)
    item, chan0 = _program_place(channels, BLOCK_C, CHANNELS_FIRST)
    chunks: tl.constexpr = TILE // SUB
    row = tl.load(plan_ptr + tile_row_at + item // chunks)
    start = tl.load(plan_ptr + tile_start_at + item // chunks) + (item % chunks) * SUB
    if LOOP:
        stride = tl.num_programs(1 if CHANNELS_FIRST else 0)
        while row >= 0:
            # The next item's plan words first: their round trip overlaps this item's work.
            later = item + stride
            inside = later < item_count
            next_row = tl.load(plan_ptr + tile_row_at + later // chunks, mask=inside, other=-1)
            next_start = tl.load(plan_ptr + tile_start_at + later // chunks, mask=inside, other=0)
            slot = tl.load(plan_ptr + slot_at + row)
            # Made anew per item: else the compiler hoists each history row's address
            # arithmetic out of the loop and holds it in registers through it (spills).
            x_rows = _opaque(x_stride, ALIGN, FAST)
            residual_rows = _opaque(residual_stride, ALIGN, FAST)
            _tile_work(
                plan_ptr, x_ptr, residual_ptr, state_ptr, weight_ptr, query_start_at,
                token_start_at, reads_at, slot_at, row, start, slot, channels, x_rows,
                residual_rows, state_slot, state_chan, state_win, weight_chan, weight_tap,
                _opaque(chan0, BLOCK_C, FAST), TAPS, DILATION, SUB, REACH_BLOCK, BLOCK_C,
                CHANNEL_UNIT, WINDOW_UNIT, WHOLE_WINDOW, FAST,
            )  # fmt: skip
            item = later
            row = next_row
            start = next_start + (later % chunks) * SUB
    else:
        if row < 0:
            return  # a padding tile of a graph plan
        slot = tl.load(plan_ptr + slot_at + row)
        _tile_work(
            plan_ptr, x_ptr, residual_ptr, state_ptr, weight_ptr, query_start_at,
            token_start_at, reads_at, slot_at, row, start, slot, channels, x_stride,
            residual_stride, state_slot, state_chan, state_win, weight_chan, weight_tap,
            chan0, TAPS, DILATION, SUB, REACH_BLOCK, BLOCK_C, CHANNEL_UNIT, WINDOW_UNIT,
            WHOLE_WINDOW, FAST,
        )  # fmt: skip


def _launch_tiles(
    shape: LaunchShape,
    blocks: Blocks,
    offsets: tuple[int, ...],
    buffers: tuple,
    sizes: tuple,
    static: dict,
    multiprocessors: int,
) -> None:
    reach = (static["TAPS"] - 1) * static["DILATION"]
    # Chunks of at least L tokens: then only a request's first chunk reads old state.
    sub = min(shape.tile_tokens, max(blocks.tiles_tokens, _power_of_two_at_least(reach)))
    items = shape.tiles_grid * (shape.tile_tokens // sub)
    channel_blocks = -(-sizes[0] // blocks.tiles_channels)
    grid_items = items
    if shape.padded and blocks.tiles_resident:  # a bucket's grid: loop, at most this many
        grid_items = _looping_items(items, channel_blocks, blocks.tiles_resident, multiprocessors)
    fast = static["FAST"] and (2 if blocks.tiles_high_half_rounding else 1)
    _short_conv_tiles[_grid(grid_items, channel_blocks, blocks.tiles_channels_first)](
        *buffers,
        *offsets,
        items,
        *sizes,
        **(static | dict(FAST=fast)),
        TILE=shape.tile_tokens,
        SUB=sub,
        REACH_BLOCK=_power_of_two_at_least(reach),
        BLOCK_C=blocks.tiles_channels,
        CHANNELS_FIRST=blocks.tiles_channels_first,
        LOOP=grid_items < items,
        ALIGN=_stride_alignment(sizes[1:3]),
        num_warps=blocks.tiles_warps,
        **_launch_options(static, blocks.tiles_registers),
    )
