"""Tuning: block sizes, program orders and launch settings, and their defaults."""

from __future__ import annotations

import attrs

from .grid import _power_of_two_at_least


@attrs.frozen
class Blocks:
    """Per launch: channels and warps per program, program order (see
    ``device._program_place``); tokens per tile program (a chunk of a plan tile); whether
    rows store the new window as one 2-D tile (for window-contiguous state) or entry by
    entry (compact window-contiguous pools with ``W <= 32`` ignore this: their rows always
    move whole windows, ``rows._update_row_window``); and how the launches depend on the
    kernel before them, where the device allows programmatic dependent launches (sm_90
    on; see ``device._await_previous_kernel``): 0 plainly, 1 each may start while the
    previous kernel finishes and lets the next start likewise, 2 the same without the
    latter; the most registers a thread of the tiles launch may use (0: the compiler's
    choice); and whether the tiles round a bf16 accumulator in one instruction
    (``device._rounded``, FAST 2; the results are the same)."""

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


def default_blocks(channels: int, window_contiguous: bool) -> Blocks:
    """Block sizes, program orders and launch settings for ``channels`` and the state's
    memory layout.

    Chosen on an H200 at C = 8192 by ``bench/kernel_bench.py --sweep``; narrower blocks
    where C is small. The runs behind each choice: ``bench/kernel_notes.md``.
    """
    # Row programs go rows first (one channel block of consecutive rows) in both
    # layouts: channels first ran the window layout's spec rows slower.
    if window_contiguous:
        rows, rows_warps = 64, 1
        # 2, not 1: letting the next launch's programs in early slowed the window
        # layout's decode rows; the rows of vLLM's layout gain either way.
        dependent = 2
    else:
        rows, rows_warps = 128, 2
        dependent = 1
    # Four channels per thread, registers capped at 168 so that 12 warps fit on an SM:
    # left alone, the compiler's count drifted above that with small changes to the
    # first chunk's code (8 warps fit), which cost the prefill much of its speed.
    # One-warp tile programs in vLLM's layout: a little faster than two, and than 512/4
    # blocks or 32-token chunks.
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
        # Faster tiles in the window layout (its prefill and mixed steps); in vLLM's
        # layout the tiles ran slower with it.
        tiles_high_half_rounding=window_contiguous,
    )
