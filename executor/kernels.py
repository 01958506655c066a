"""Triton kernels for SPEC §2's dilated short convolution: any mixed step in two launches.

Launch A (``_short_conv_rows``) runs one program per (row, channel block) over the
spec and decode rows; launch B (``_short_conv_tiles``) one program per (chunk of a
prefill tile, channel block). Both read the plan from its packed int32 buffer on
the device, so one captured CUDA graph replays any plan of the same layout. Every
program loads what it needs once, before its first store (``_load_history``).

Why one launch each is race-free although every program updates state in place:
the planner refuses one slot on two live rows of a group (slot 0 aside, which no
program reads or writes), so each slot's channels are read and written by
exactly one program: launch A's program of its row, or launch B's program of its
request's *first* chunk (the only one that reads old state; it also writes the
final state). Inside that program ``tl.debug_barrier()`` separates the last read of the
old window from the first write of the new one. Residual rows are disjoint too
(a token belongs to one row, and to one chunk), and ``x`` is only read. So
outputs need no second pass and the two launches could even overlap.
"""

# Triton types kernel arguments at launch, not through annotations.
# ruff: noqa: ANN001

from __future__ import annotations

import functools

import attrs
import numpy as np
import torch
import triton
import triton.language as tl

from stepplan.planner import ExecutionPlan, PlanLayout

from .reference import check_operands


@triton.jit
def _tokens(x_ptr, x_stride, first_token, pos, chan, valid, REACH: tl.constexpr):
    """``h[pos]`` of SPEC §2 where ``pos >= REACH`` (an input token), 0 elsewhere.

    ``pos`` is ``[rows, 1]``, ``chan`` ``[BLOCK_C]``, ``valid`` ``[rows, BLOCK_C]``.
    """
    token = (first_token + pos - REACH).to(tl.int64)
    return tl.load(x_ptr + token * x_stride + chan[None, :], mask=valid & (pos >= REACH), other=0.0)


@triton.jit
def _past(past_ptr, state_chan, state_win, state_end, pos, chan, valid):
    """``h[pos]`` of SPEC §2 where ``pos < state_end`` (a state entry), 0 elsewhere.

    ``past_ptr`` points at the row's window entry ``o``. ``state_end`` is L where the
    row reads state, else 0 (zeros in place of state): an integer, not a bool,
    because scalar bools in masks break the interpreter.
    """
    ptrs = past_ptr + chan[None, :] * state_chan + pos * state_win
    return tl.load(ptrs, mask=valid & (pos < state_end), other=0.0)


@triton.jit
def _rounded(acc, dtype: tl.constexpr, FAST: tl.constexpr):
    """``acc`` rounded to ``dtype`` (to nearest, ties to even), as fp32.

    FAST 2 rounds a bf16 accumulator in one instruction (``Blocks.tiles_high_half_rounding``):
    ``cvt.rn.bf16x2.f32`` of the value and a zero puts the rounded value in the high half
    over zero bits, which is already that value as fp32 (bf16 is fp32's upper half),
    where ``.to`` takes a conversion and a shift. It sped up the window layout's tiles and
    slowed vLLM's, and the rows.
    """
    if FAST == 2 and dtype == tl.bfloat16:
        high = tl.inline_asm_elementwise(
            "{ .reg .f32 zero; mov.f32 zero, 0f00000000; cvt.rn.bf16x2.f32 $0, $1, zero; }",
            "=r,f",
            [acc],
            tl.int32,
            True,
            1,
        )
        rounded = high.to(tl.float32, bitcast=True)
    else:
        rounded = acc.to(dtype).to(tl.float32)
    return rounded


@triton.jit
def _silu_rounded(acc, dtype: tl.constexpr, FAST: tl.constexpr):
    """``silu(round(acc))`` rounded to ``dtype``, in fp32: like ``F.conv1d`` then ``F.silu``.

    FAST (compiled kernels, 1 or 2): the exponential and the reciprocal straight from the
    special-function unit (``ex2.approx.ftz``, ``rcp.approx.ftz``: about 1 ulp of fp32,
    far below the rounding to ``dtype``) instead of ``tl.exp`` and a division, whose
    range fix-ups made the kernels issue-bound. The interpreter runs no PTX (FAST 0):
    ``tl.exp`` and ``/`` there. FAST 2 also rounds the accumulator in one instruction
    (:func:`_rounded`).
    """
    y = _rounded(acc, dtype, FAST)
    if FAST:
        # e^-y = 2^(-y·log2 e), inf for y < -88: the reciprocal is then 0
        power = tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=f,f", [y * -1.4426950408889634], tl.float32, True, 1
        )
        inverse = tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=f,f", [1.0 + power], tl.float32, True, 1
        )
        silu = y * inverse
    else:
        silu = y / (1.0 + tl.exp(-y))
    # By .to even where FAST is 2: the compiler already converts these two per instruction.
    return _rounded(silu, dtype, 1)


@triton.jit
def _write_window(
    window_ptr, state_chan, state_win, i, chan, keep, pos, past, tokens, REACH: tl.constexpr
):
    """``S[:, i] = h[pos]`` where ``keep``, ``past``/``tokens`` holding the state/token part.

    Two stores with complementary masks, one per source tile: no layout shuffle.
    """
    ptrs = window_ptr + chan[None, :] * state_chan + i * state_win
    tl.store(ptrs, past, mask=keep & (pos < REACH))
    tl.store(ptrs, tokens, mask=keep & (pos >= REACH))


@triton.jit
def _program_place(channels, BLOCK_C: tl.constexpr, CHANNELS_FIRST: tl.constexpr):
    """``(item, first channel)`` of this program: item = row or tile.

    CHANNELS_FIRST: consecutive programs take consecutive channel blocks of one item
    (they stream whole rows of memory together); else consecutive items of one block.
    Which is faster depends on the launch and the state layout (bench/kernel_notes.md).
    The grid is 2-D (:func:`_grid`), which spares each program two integer divisions
    before its first load, except for more than 65,535 items channels first, where
    the items and blocks share axis 0.
    """
    if CHANNELS_FIRST:
        if tl.num_programs(1) == 1:  # 1-D (or one item): the formula holds either way
            blocks = tl.cdiv(channels, BLOCK_C)
            item = tl.program_id(0) // blocks
            block = tl.program_id(0) % blocks
        else:
            item = tl.program_id(1)
            block = tl.program_id(0)
    else:
        item = tl.program_id(0)
        block = tl.program_id(1)
    return item, block * BLOCK_C


@triton.jit
def _await_previous_kernel(DEPENDENT: tl.constexpr):
    """In a programmatic dependent launch (DEPENDENT), wait here until the stream's
    previous kernel has finished and its writes are visible; DEPENDENT == 1 then lets
    the next kernel launch early likewise (it waits in turn)."""
    if DEPENDENT:
        tl.extra.cuda.gdc_wait()
        if DEPENDENT == 1:
            tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _channel_stride(state_chan, CHANNEL_UNIT: tl.constexpr, WHOLE_WINDOW: tl.constexpr):
    """The state's channel stride, as a literal where the layout fixes it: a unit
    stride lets Triton coalesce along channels, a compact pool's stride ``W`` tells it
    each window's alignment."""
    if CHANNEL_UNIT:
        return 1
    elif WHOLE_WINDOW:
        return WHOLE_WINDOW
    else:
        return state_chan


_ROW_OFFSETS = ("query_start_at", "token_start_at", "kind_at", "offset_at", "reads_at", "slot_at")
_TILE_OFFSETS = (
    "query_start_at",
    "token_start_at",
    "reads_at",
    "slot_at",
    "tile_row_at",
    "tile_start_at",
)


@triton.jit
def _live(chan_ok, index, bound):
    """``chan_ok & (index < bound)``: a constant ``index``, a scalar ``bound``.

    The comparison is made on a vector: the interpreter cannot AND a vector
    with a scalar bool (the compiler folds the extra zeros away).
    """
    return chan_ok & (chan_ok.to(tl.int32) * 0 + index < bound)


@triton.jit
def _load_history(
    x_ptr, x_stride, first_token, q, past_ptr, s_chan, s_win, state_end, start, chan, chan_ok,
    REACH: tl.constexpr, COUNT: tl.constexpr, STATE: tl.constexpr, TOKENS: tl.constexpr,
):  # fmt: skip
    """``(h[start], ..., h[start + COUNT - 1])`` of SPEC §2 as ``[BLOCK_C]`` vectors.

    Each entry is loaded once, all before any store, so a program costs one memory
    round trip; 1-D vectors in a tuple (not a ``[rows, BLOCK_C]`` tile) keep every
    thread busy on every entry (a tile spreads its rows over warps, and a decode
    row would leave three quarters of them idle), and the K taps of an output
    share the registers instead of loading their shifted rows K times.
    The first L entries may be state (STATE) and/or tokens (TOKENS): a row starts
    at h[0] (state only), a prefill chunk that starts before L may hold either, a
    later chunk tokens only; each case compiles only the loads it needs.
    """
    # Row pointers once, then a constant step per entry: the 64-bit address arithmetic
    # per entry was a sixth of the chunk's instructions.
    token_rows = x_ptr + (first_token + start - REACH).to(tl.int64) * x_stride + chan
    past_rows = past_ptr + chan * s_chan
    history = ()
    for p in tl.static_range(COUNT):
        token_ptrs = token_rows + p * x_stride
        in_query = _live(chan_ok, p, q + REACH - start)
        if p >= REACH or not STATE:
            entry = tl.load(token_ptrs, mask=in_query, other=0.0)
        else:
            past_ptrs = past_rows + p * s_win
            entry = tl.load(past_ptrs, mask=_live(chan_ok, p, state_end - start), other=0.0)
            if TOKENS:  # h[start + p] is a token once start + p >= L
                is_token = in_query & _live(chan_ok, REACH - 1 - p, start)
                token_entry = tl.load(token_ptrs, mask=is_token, other=0.0)
                entry = tl.where(is_token, token_entry, entry)
        history = history + (entry,)  # noqa: RUF005 (Triton has no starred tuples)
    return history


@triton.jit
def _add_silu_rows(
    residual_ptr, residual_stride, first_token, live_rows, chan, chan_ok, history, taps,
    ROWS: tl.constexpr, TAPS: tl.constexpr, DILATION: tl.constexpr, BLOCK_C: tl.constexpr,
    FAST: tl.constexpr,
):  # fmt: skip
    """``r[first_token + j] += silu(Σ_k w_k · history[j + k·D])`` for ``j < live_rows``.

    Every residual row is loaded before the first store: a store may alias later
    loads, so loads after it would wait for it.
    """
    rows = residual_ptr + first_token.to(tl.int64) * residual_stride + chan
    residuals = _load_residuals(rows, residual_stride, live_rows, chan_ok, ROWS)
    _store_silu_rows(
        rows, residual_stride, live_rows, chan_ok, history, taps, residuals,
        residual_ptr.dtype.element_ty, ROWS, TAPS, DILATION, BLOCK_C, FAST,
    )  # fmt: skip


@triton.jit
def _load_residuals(rows, residual_stride, live_rows, chan_ok, ROWS: tl.constexpr):
    """``(r[0], ..., r[ROWS - 1])`` from the row pointers ``rows`` (``[BLOCK_C]``), 0 from
    ``live_rows`` on: the first half of :func:`_add_silu_rows`."""
    residuals = ()
    for j in tl.static_range(ROWS):
        r = tl.load(rows + j * residual_stride, mask=_live(chan_ok, j, live_rows), other=0.0)
        residuals = residuals + (r,)  # noqa: RUF005
    return residuals


@triton.jit
def _store_silu_rows(
    rows, residual_stride, live_rows, chan_ok, history, taps, residuals, dtype: tl.constexpr,
    ROWS: tl.constexpr, TAPS: tl.constexpr, DILATION: tl.constexpr, BLOCK_C: tl.constexpr,
    FAST: tl.constexpr,
):  # fmt: skip
    """The second half of :func:`_add_silu_rows`: each output added to its loaded
    residual and stored."""
    for j in tl.static_range(ROWS):
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for k in tl.static_range(TAPS):
            acc += history[j + k * DILATION].to(tl.float32) * taps[k]
        total = residuals[j].to(tl.float32) + _silu_rounded(acc, dtype, FAST)
        tl.store(rows + j * residual_stride, total.to(dtype), mask=_live(chan_ok, j, live_rows))


@triton.jit
def _load_taps(weight_ptr, weight_chan, weight_tap, chan, chan_ok, TAPS: tl.constexpr):
    """``(w[:, 0], ..., w[:, K - 1])`` in fp32, ``[BLOCK_C]`` each."""
    taps = ()
    for k in tl.static_range(TAPS):
        tap = tl.load(weight_ptr + chan * weight_chan + k * weight_tap, mask=chan_ok, other=0.0)
        taps = taps + (tap.to(tl.float32),)  # noqa: RUF005
    return taps


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
    if WINDOW_TILE:
        # Window-contiguous state: one [W, BLOCK_C] tile, each channel's window stored
        # as one contiguous run; entry-by-entry stores would write 2 of every 2W bytes.
        # Its loads hit the lines the history just brought in.
        i = tl.arange(0, WINDOW_BLOCK)[:, None]
        kept = (i < keep) & chan_ok[None, :]
        past = _past(past_ptr, s_chan, s_win, state_end, i + 1, chan, kept)
        tokens = _tokens(x_ptr, x_stride, first_token, i + 1, chan, kept, reach)
    _add_silu_rows(
        residual_ptr, residual_stride, first_token, q, chan, chan_ok, history, taps,
        ROWS, TAPS, DILATION, BLOCK_C, FAST,
    )  # fmt: skip
    # The stores' register layout may differ from the loads': every thread must have
    # read the old window before any thread overwrites it.
    tl.debug_barrier()
    if WINDOW_TILE:
        _write_window(window_ptr, s_chan, s_win, i, chan, kept, i + 1, past, tokens, reach)
    else:
        for i in tl.static_range(reach + ROWS - 1):
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
    j = tl.arange(0, 1 << LEVELS)[None, :]
    tile_ptrs = window_ptr + chan[:, None] * WINDOW + j
    whole = (j < WINDOW) & chan_ok[:, None] & (j * 0 + has_slot > 0)  # slot 0 untouched
    old = tl.load(tile_ptrs, mask=whole, other=0.0)
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
    tl.debug_barrier()  # every thread has read the old window
    tl.store(tile_ptrs, new, mask=whole)
    _store_silu_rows(
        rows, residual_stride, q, chan_ok, history, taps, residuals,
        residual_ptr.dtype.element_ty, ROWS, TAPS, DILATION, BLOCK_C, FAST,
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


# Plan fields each kernel reads, in its argument order (row_slot: the launch group's row).
_ROW_FIELDS = (
    "row_query_start",
    "row_token_start",
    "row_kind",
    "row_state_offset",
    "row_reads_state",
    "row_slot",
)
_TILE_FIELDS = (
    "row_query_start",
    "row_token_start",
    "row_reads_state",
    "row_slot",
    "tile_row",
    "tile_start",
)


# slots=False: functools.cached_property needs an instance __dict__ before attrs 23.2.
@attrs.frozen(slots=False)
class LaunchShape:
    """Everything static a launch needs besides device buffers (one per plan layout).

    Attributes:
        layout: the packed buffer's layout (field offsets).
        rows_grid: programs of launch A over rows (0: no launch).
        tiles_grid: programs of launch B over prefill tiles (0: no launch).
        query_len_max: ``Q``.
        row_tokens_max: the most tokens a row of launch A may have: 1 where the plan
            can hold no spec row (a decode graph, or an eager plan of decodes), else Q.
        tile_tokens: tokens per prefill tile (a power of two, >= L).
    """

    layout: PlanLayout
    rows_grid: int
    tiles_grid: int
    query_len_max: int
    tile_tokens: int
    row_tokens_max: int

    @functools.cached_property
    def plan_offsets(self) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
        """Per layer group: the plan-field offsets of launch A and of launch B, in their
        argument order. Made on the first launch, not per launch (nor per graph replay)."""
        at = {name: offset for name, (offset, _) in self.layout.offsets().items()}
        slots, per_group = at["row_slot"], []
        for group in range(self.layout.num_groups):
            at["row_slot"] = slots + group * self.layout.num_rows  # this group's [R] slots
            per_group.append(
                (tuple(at[name] for name in _ROW_FIELDS), tuple(at[name] for name in _TILE_FIELDS))
            )
        return tuple(per_group)


def launch_shape(plan: ExecutionPlan) -> LaunchShape:
    """The launch shape of ``plan``: the grids of its ops (``plan.launch_grids``)."""
    rows, tiles = plan.launch_grids
    decodes_only = plan.graph.kind == "decode" if plan.graph else plan.num_spec_rows == 0
    return LaunchShape(
        layout=plan.layout,
        rows_grid=rows,
        tiles_grid=tiles,
        query_len_max=plan.query_len_max,
        tile_tokens=plan.tile_tokens,
        row_tokens_max=1 if decodes_only else plan.query_len_max,
    )


@attrs.frozen
class Blocks:
    """Per launch: channels and warps per program, program order (see ``_program_place``);
    tokens per tile program (a chunk of a plan tile); whether rows store the new window
    as one 2-D tile (for window-contiguous state) or entry by entry (compact
    window-contiguous pools with ``W <= 32`` ignore this: their rows always move whole
    windows, :func:`_update_row_window`); and how the launches depend on the kernel
    before them, where the device allows programmatic dependent launches (sm_90 on;
    see :func:`_await_previous_kernel`): 0 plainly, 1 each may start while the previous
    kernel finishes and lets the next start likewise, 2 the same without the latter;
    the most registers a thread of the tiles launch may use (0: the compiler's choice);
    and whether the tiles round a bf16 accumulator in one instruction
    (:func:`_rounded`, FAST 2; the results are the same)."""

    rows_channels: int
    rows_warps: int
    tiles_channels: int
    tiles_warps: int
    tiles_tokens: int
    rows_channels_first: bool = True
    tiles_channels_first: bool = True
    rows_window_tile: bool = False
    dependent: int = 0
    tiles_registers: int = 0
    tiles_high_half_rounding: bool = False


@functools.cache
def _dependent_launches(device: torch.device) -> bool:
    """Whether kernels on ``device`` can be programmatic dependent launches (sm_90 on).

    Kept per device: a fact of the hardware, asked on every eager launch, and the
    capability query costs microseconds."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def default_blocks(channels: int, window_contiguous: bool) -> Blocks:
    """Block sizes, program orders and launch settings for ``channels`` and the state's
    memory layout.

    Chosen on an H200 at C = 8192 by ``bench/kernel_bench.py --sweep`` and the runs
    recorded in ``bench/kernel_notes.md`` (the dependent launches and the tiles'
    register cap: sixth session; the window rows' order: seventh; the window tiles'
    rounding: ninth); narrower blocks where C is small.
    """
    # Row programs go rows first (one channel block of consecutive rows) in both
    # layouts: channels first, window spec 256 × 4 ran at 64% of the ceiling, not 71%.
    if window_contiguous:
        rows, rows_warps = 64, 1
        # 2, not 1: with the next launch's programs let in early, window decode 256
        # took 41 µs instead of 35 (H200); the rows of vLLM's layout gain either way.
        dependent = 2
    else:
        rows, rows_warps = 128, 2
        dependent = 1
    # Four channels per thread, registers capped at 168 so that 12 warps fit on an SM:
    # left alone, the compiler's count drifted above that with small changes to the
    # first chunk's code (8 warps fit), which cost the prefill 90% -> 76% of the ceiling.
    # One-warp programs in vLLM's layout: its mixed step 82.9% -> 83.4%, prefill 4 × 4096
    # 90.1% -> 90.8% (H200, ninth session; 512/4 and 32-token chunks were slower).
    tiles, tiles_warps = (256, 2) if window_contiguous else (128, 1)
    tokens, tiles_registers = 16, 168
    fit = _power_of_two_at_least(channels)
    return Blocks(
        min(rows, fit),
        rows_warps,
        min(tiles, fit),
        tiles_warps,
        tokens,
        rows_channels_first=False,
        tiles_channels_first=True,
        rows_window_tile=window_contiguous,
        dependent=dependent,
        tiles_registers=tiles_registers,
        # H200, window layout: prefill 4 × 4096 at 93% of the ceiling, mixed 76%, against
        # 86% and 71.5% without it; in vLLM's layout the tiles ran 1.6-1.8 points slower.
        tiles_high_half_rounding=window_contiguous,
    )


#: Widest window the row programs hold whole in registers (a power of two).
_WHOLE_WINDOW_MAX = 32


def _compact_window(conv_state: torch.Tensor) -> int:
    """``W`` where each channel's window is one contiguous run of ``W <= 32`` entries
    (strides ``[., W, 1]``), else 0 (the entry-by-entry path)."""
    window = conv_state.shape[2]
    compact = conv_state.stride()[1:] == (window, 1) and 1 < window <= _WHOLE_WINDOW_MAX
    return window if compact else 0


def _power_of_two_at_least(n: int) -> int:
    """The smallest power of two ``>= n`` (``n >= 1``).

    In plain ints because ``triton.next_power_of_2`` and ``triton.cdiv`` are
    ``constexpr_function`` wrappers that cost microseconds per host call.
    """
    return 1 << (n - 1).bit_length()


def launch_short_conv(
    shape: LaunchShape,
    plan_buffer: torch.Tensor,
    x: torch.Tensor,
    residual: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    *,
    dilation: int,
    group: int,
    blocks: Blocks | None = None,
    min_tokens: int = 0,
    side_stream: torch.cuda.Stream | None = None,
) -> None:
    """One layer of one step on the device: at most two launches, graph-capturable.

    No host sync and no allocation: everything the kernels need about the step is
    read from ``plan_buffer`` on the device, so a captured graph replays any plan
    whose :class:`LaunchShape` equals ``shape``.

    Args:
        shape: :func:`launch_shape` of the plan (or of any plan with its layout).
        plan_buffer: ``[layout.size], int32`` the plan's ``packed`` array, on x's device.
        x: ``[num_engine_tokens, C]``, bf16/fp16/fp32, channel stride 1, engine order.
        residual: ``[num_engine_tokens, C]``, x's dtype, channel stride 1; ``+= y`` in place.
        conv_state: ``[num_slots, C, W]``, x's dtype, any strides, ``W >= L + Q - 1``.
        weight: ``[C, K]``, x's dtype, ``K`` in 2..8.
        dilation: ``D``, 1..8.
        group: layer group whose slots this layer uses.
        blocks: block sizes (tuning only); :func:`default_blocks` when ``None``.
        min_tokens: the fewest rows ``x`` may have (the plan's live tokens, when known).
        side_stream: where a step has both launches, the rows launch runs on this
            stream beside the tiles launch (forked from and joined back into the
            current stream), so neither waits out the other's last wave; they share no
            memory (module docstring). Under graph capture the fork is free at replay.
    """
    layout = shape.layout
    check_operands(
        x,
        residual,
        conv_state,
        weight,
        dilation=dilation,
        group=group,
        num_groups=layout.num_groups,
        query_len_max=shape.query_len_max,
        min_tokens=min_tokens,
    )
    blocks = blocks or default_blocks(x.shape[1], conv_state.stride(2) == 1)
    _check_launch(shape, plan_buffer, x, residual, (weight.shape[1] - 1) * dilation, blocks)
    rows_offsets, tiles_offsets = shape.plan_offsets[group]
    args = (
        (plan_buffer, x, residual, conv_state, weight),
        (x.shape[1], x.stride(0), residual.stride(0), *conv_state.stride(), *weight.stride()),
        dict(
            TAPS=weight.shape[1],
            DILATION=dilation,
            CHANNEL_UNIT=conv_state.stride(1) == 1,
            WINDOW_UNIT=conv_state.stride(2) == 1,
            WHOLE_WINDOW=_compact_window(conv_state),
            FAST=int(x.is_cuda),  # compiled, not interpreted: see _silu_rounded
            DEPENDENT=blocks.dependent if _dependent_launches(x.device) else 0,
        ),
    )
    if shape.rows_grid and shape.tiles_grid and side_stream is not None:
        main = torch.cuda.current_stream(x.device)
        side_stream.wait_stream(main)
        with torch.cuda.stream(side_stream):
            _launch_rows(shape, blocks, rows_offsets, *args)
        _launch_tiles(shape, blocks, tiles_offsets, *args)
        main.wait_stream(side_stream)
        return
    if shape.rows_grid:
        _launch_rows(shape, blocks, rows_offsets, *args)
    if shape.tiles_grid:
        _launch_tiles(shape, blocks, tiles_offsets, *args)


def _launch_rows(
    shape: LaunchShape,
    blocks: Blocks,
    offsets: tuple[int, ...],
    buffers: tuple,
    sizes: tuple,
    static: dict,
) -> None:
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


#: The most programs a launch grid's axes 1 and 2 may hold (CUDA's limit).
_GRID_AXIS_MAX = 65_535


def _grid(items: int, blocks: int, channels_first: bool) -> tuple[int, ...]:
    """The launch grid of ``items`` × ``blocks`` programs, as :func:`_program_place`
    reads it: the faster-moving of the two on axis 0."""
    if not channels_first:
        return (items, blocks)
    return (blocks, items) if items <= _GRID_AXIS_MAX else (blocks * items,)


def _launch_options(static: dict, registers: int) -> dict:
    """The compiler's launch options: a programmatic dependent launch where DEPENDENT,
    and a register cap (``maxnreg``) where ``registers`` is set and the kernel is
    compiled (the interpreter has no registers)."""
    options = dict(launch_pdl=True) if static["DEPENDENT"] else {}
    if registers and static["FAST"]:
        options["maxnreg"] = registers
    return options


def _check_launch(
    shape: LaunchShape,
    plan_buffer: torch.Tensor,
    x: torch.Tensor,
    residual: torch.Tensor,
    reach: int,
    blocks: Blocks,
) -> None:
    size = shape.layout.size
    if plan_buffer.shape != (size,) or plan_buffer.dtype != torch.int32:
        raise ValueError(
            f"plan_buffer: must be [{size}] int32, "
            f"got {list(plan_buffer.shape)} {plan_buffer.dtype}"
        )
    if plan_buffer.device != x.device:
        raise ValueError(f"plan_buffer: must be on {x.device} like x, got {plan_buffer.device}")
    for name, tensor in (("x", x), ("residual", residual)):
        if tensor.stride(1) != 1:
            raise ValueError(f"{name}: channel stride must be 1, got {tensor.stride(1)}")
    if shape.tiles_grid and shape.tile_tokens < reach:
        raise ValueError(
            f"tile_tokens: prefill tiles of {shape.tile_tokens} tokens are shorter than "
            f"the reach L = (K - 1) * D = {reach}; raise PlannerConfig.prefill_tile_tokens"
        )
    # Rows-first launches put the channel blocks on grid axis 1 (see _grid).
    for width, first in (
        (blocks.rows_channels, blocks.rows_channels_first),
        (blocks.tiles_channels, blocks.tiles_channels_first),
    ):
        if not first and -(-x.shape[1] // width) > _GRID_AXIS_MAX:
            raise ValueError(
                f"channels: {x.shape[1]} channels make more than {_GRID_AXIS_MAX} blocks of "
                f"{width}, which a rows-first launch cannot place; use wider blocks"
            )


def short_conv(
    plan: ExecutionPlan,
    x: torch.Tensor,
    residual: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    *,
    dilation: int,
    group: int = 0,
    plan_buffer: torch.Tensor | None = None,
) -> None:
    """:func:`stepplan.executor.reference.short_conv` on the Triton kernels.

    Same arguments as the reference, plus ``plan_buffer`` (``[layout.size], int32``
    ``plan.packed`` already on x's device; uploaded here when ``None``).
    """
    if plan_buffer is None:
        plan_buffer = torch.from_numpy(np.array(plan.packed)).to(x.device)
    launch_short_conv(
        launch_shape(plan),
        plan_buffer,
        x,
        residual,
        conv_state,
        weight,
        dilation=dilation,
        group=group,
        min_tokens=plan.batch.num_tokens,
    )
