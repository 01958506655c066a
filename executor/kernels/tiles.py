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
    _past,
    _program_place,
    _tokens,
    _write_window,
)
from .grid import _grid, _launch_options, _power_of_two_at_least

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


@triton.jit(do_not_specialize=_TILE_OFFSETS)
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
    FAST: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Launch B: one program per (SUB-token chunk of a prefill tile, channel block).

    One chunk per program, not a loop over the tile's chunks: a loop's next loads
    may alias its residual store, so each chunk would wait a memory round trip
    for the last; separate programs keep those round trips in flight together.
    A chunk loads its SUB + L history rows once (the L before it come from the
    previous chunk's rows, mostly from L2). SUB >= L, so only a request's first
    chunk reads old state.
    """
    _await_previous_kernel(DEPENDENT)
    item, chan0 = _program_place(channels, BLOCK_C, CHANNELS_FIRST)
    chunks: tl.constexpr = TILE // SUB
    tile = item // chunks
    row = tl.load(plan_ptr + tile_row_at + tile)
    start = tl.load(plan_ptr + tile_start_at + tile) + (item % chunks) * SUB
    if row < 0:
        return  # a padding tile of a graph plan
    slot = tl.load(plan_ptr + slot_at + row)
    first = tl.load(plan_ptr + query_start_at + row)
    q = tl.load(plan_ptr + query_start_at + row + 1) - first
    first_token = tl.load(plan_ptr + token_start_at + row)
    reads = tl.load(plan_ptr + reads_at + row)
    if (slot == 0) | (start >= q):
        return  # the NULL slot adds 0 and keeps no state; or past the request's end
    reach: tl.constexpr = (TAPS - 1) * DILATION
    s_chan = _channel_stride(state_chan, CHANNEL_UNIT, WHOLE_WINDOW)
    s_win = 1 if WINDOW_UNIT else state_win
    chan = chan0 + tl.arange(0, BLOCK_C)
    chan_ok = chan < channels
    state_end = reach * tl.minimum(reads, 1)
    window_ptr = state_ptr + slot.to(tl.int64) * state_slot  # prefill offset o is 0
    if start < reach:  # a chunk whose history starts in the state
        _update_chunk(
            x_ptr, x_stride, residual_ptr, residual_stride, weight_ptr, weight_chan, weight_tap,
            first_token, q, start, window_ptr, s_chan, s_win, state_end, chan, chan_ok,
            TAPS, DILATION, SUB, BLOCK_C, True, FAST,
        )  # fmt: skip
    else:  # tokens only: compiled without the state loads and selects
        _update_chunk(
            x_ptr, x_stride, residual_ptr, residual_stride, weight_ptr, weight_chan, weight_tap,
            first_token, q, start, window_ptr, s_chan, s_win, state_end, chan, chan_ok,
            TAPS, DILATION, SUB, BLOCK_C, False, FAST,
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


def _launch_tiles(
    shape: LaunchShape,
    blocks: Blocks,
    offsets: tuple[int, ...],
    buffers: tuple,
    sizes: tuple,
    static: dict,
) -> None:
    reach = (static["TAPS"] - 1) * static["DILATION"]
    # Chunks of at least L tokens: then only a request's first chunk reads old state.
    sub = min(shape.tile_tokens, max(blocks.tiles_tokens, _power_of_two_at_least(reach)))
    items = shape.tiles_grid * (shape.tile_tokens // sub)
    fast = static["FAST"] and (2 if blocks.tiles_high_half_rounding else 1)
    _short_conv_tiles[
        _grid(items, -(-sizes[0] // blocks.tiles_channels), blocks.tiles_channels_first)
    ](
        *buffers,
        *offsets,
        *sizes,
        **(static | dict(FAST=fast)),
        TILE=shape.tile_tokens,
        SUB=sub,
        REACH_BLOCK=_power_of_two_at_least(reach),
        BLOCK_C=blocks.tiles_channels,
        CHANNELS_FIRST=blocks.tiles_channels_first,
        num_warps=blocks.tiles_warps,
        **_launch_options(static, blocks.tiles_registers),
    )
