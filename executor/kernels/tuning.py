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
    (``device._rounded``, FAST 2; the results are the same).

    Persistence: ``tiles_resident`` programs per multiprocessor at most in a launch whose
    grid holds a graph bucket (``LaunchShape.padded``), each looping over the tiles' items
    until the first padding tile, so that a bucket's padded tiles cost nothing (0: one
    program per item, every padded one too). ``rows_resident`` programs per multiprocessor
    run the rows persistently (``rows._short_conv_rows_persistent``), each looping over
    rows of one channel block and, with ``rows_prefetch``, loading the next row's plan
    fields, history and residuals before it computes and stores the current one (0: one
    program per row and channel block, ``rows._short_conv_rows``)."""

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
    tiles_resident: int = 0
    rows_resident: int = 0
    rows_prefetch: bool = True


#: Named defaults, oldest first (``default_blocks``' ``variant``; the runs behind each in
#: ``bench/kernel_notes.md``):
#: ``program-per-tile`` one program per item in every launch, a graph bucket's padded tiles
#: included; ``looping-tiles`` the tiles of a graph launch as looping programs (a bucket's
#: padding costs a plan read per program); ``persistent`` looping-tiles with the rows as
#: persistent programs that fetch the next row while computing the current one.
VARIANTS = ("program-per-tile", "looping-tiles", "persistent")
#: The variant an executor runs unless told otherwise.
DEFAULT_VARIANT = "looping-tiles"


def default_blocks(
    channels: int, window_contiguous: bool, variant: str = DEFAULT_VARIANT
) -> Blocks:
    """Block sizes, program orders and launch settings for ``channels``, the state's
    memory layout and the named ``variant`` (one of :data:`VARIANTS`).

    Chosen on an H200 at C = 8192 by ``bench/kernel_bench.py --sweep``; narrower blocks
    where C is small. The runs behind each choice: ``bench/kernel_notes.md``.
    """
    check_variant(variant)
    blocks = _program_per_tile_blocks(channels, window_contiguous)
    if variant == "program-per-tile":
        return blocks
    # Two waves of tile programs (12 one-warp programs of 168 registers fit on an SM in
    # vLLM's layout, 6 two-warp ones in the window layout): fewer leave SMs idle while a
    # program waits on memory, more cost the bucket's padding a read each.
    blocks = attrs.evolve(blocks, tiles_resident=12 if window_contiguous else 24)
    if variant == "looping-tiles":
        return blocks
    return attrs.evolve(blocks, rows_resident=_PERSISTENT_ROWS[window_contiguous])


#: Persistent row programs per multiprocessor, by window contiguity: at least as many as
#: fit (sm_90 build, C = 8192: vLLM's two-warp programs 8 of Q-token rows, 21 of decode
#: rows; the window layout's one-warp ones 15 and 24). Programs beyond those that fit
#: start as the first finish, which costs less than SMs left short of rows in flight.
_PERSISTENT_ROWS = {False: 16, True: 16}


def check_variant(variant: str) -> None:
    """Raise ``ValueError`` unless ``variant`` is one of :data:`VARIANTS`."""
    if variant not in VARIANTS:
        raise ValueError(f"kernel_variant: must be one of {VARIANTS}, got {variant!r}")


def _program_per_tile_blocks(channels: int, window_contiguous: bool) -> Blocks:
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
