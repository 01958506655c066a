"""Triton kernels for SPEC §2's dilated short convolution: any mixed step in two launches.

Launch A (``_short_conv_rows``, :mod:`.rows`) runs one program per (row, channel block)
over the spec and decode rows, or (``Blocks.rows_resident``) persistent programs that walk
the rows of a channel block (``_short_conv_rows_persistent``, :mod:`.persistent`); launch
B (``_short_conv_tiles``, :mod:`.tiles`) one program per (chunk of a prefill tile, channel
block), or in a graph bucket's launch (``Blocks.tiles_resident``) fewer programs that loop
over the chunks up to the first padding tile. Both read the plan from its packed int32
buffer on the device, so one captured CUDA graph replays any plan of the same layout.
Every program loads what it needs once, before its first store (``_load_history`` in
:mod:`.device`, the helpers both share). :mod:`.launch` turns a plan and its operands into
the launches, :mod:`.tuning` holds the block sizes, :mod:`.grid` the grid geometry.

Why one launch each is race-free although every program updates state in place:
the planner refuses one slot on two live rows of a group (slot 0 aside, which no
program reads or writes), so each slot's channels are read and written by exactly one
program: launch A's program of its row (a persistent program's, of its rows), or launch
B's program of its request's *first* chunk (the only one that reads old state; it also
writes the final state). Inside that program ``tl.debug_barrier()`` separates the last read of the
old window from the first write of the new one. Residual rows are disjoint too
(a token belongs to one row, and to one chunk), and ``x`` is only read. So
outputs need no further pass and the two launches could even overlap.
"""

from .compiled import compiled_variants
from .launch import LaunchShape, launch_shape, launch_short_conv, short_conv
from .tuning import DEFAULT_VARIANT, VARIANTS, Blocks, check_variant, default_blocks

__all__ = [
    "DEFAULT_VARIANT",
    "VARIANTS",
    "Blocks",
    "LaunchShape",
    "check_variant",
    "compiled_variants",
    "default_blocks",
    "launch_shape",
    "launch_short_conv",
    "short_conv",
]
