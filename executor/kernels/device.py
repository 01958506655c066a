"""Device helpers both launches share: history and state loads, rounding, silu, window writes.

Each is a ``@triton.jit`` function inlined into the row and tile programs
(:mod:`.rows`, :mod:`.tiles`); vectors are ``[BLOCK_C]`` (one entry of every
channel of the program's block) unless a docstring says otherwise.
"""

# Triton types kernel arguments at launch, not through annotations.
# ruff: noqa: ANN001

from __future__ import annotations

import triton
import triton.language as tl


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
def _opaque(value, ALIGN: tl.constexpr, FAST: tl.constexpr):
    """``value`` (an int32 scalar, a multiple of ALIGN), as something the compiler must
    take as new where it is made: inside a loop, its products are then made per iteration,
    not hoisted out of the loop to stay in registers throughout (a 64-bit row offset per
    history row made the looping tile programs spill). ALIGN restores what the launch's
    specialization knew of it (a stride's divisibility by 16 lets rows load as vectors).
    The interpreter runs no PTX (FAST 0): ``value`` itself."""
    if FAST:
        value = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [value], tl.int32, False, 1)
        value = tl.multiple_of(value, ALIGN)
    return value


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
    # Row pointers once, then a constant step per entry: 64-bit address arithmetic per
    # entry was a large share of the chunk's instructions (bench/kernel_notes.md).
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
