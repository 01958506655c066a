"""Host-side launch geometry: grids, compiler launch options, powers of two."""

from __future__ import annotations

import functools

import torch

#: The most programs a launch grid's axes 1 and 2 may hold (CUDA's limit).
_GRID_AXIS_MAX = 65_535


def _power_of_two_at_least(n: int) -> int:
    """The smallest power of two ``>= n`` (``n >= 1``).

    In plain ints because ``triton.next_power_of_2`` and ``triton.cdiv`` are
    ``constexpr_function`` wrappers that cost microseconds per host call.
    """
    return 1 << (n - 1).bit_length()


def _grid(items: int, blocks: int, channels_first: bool) -> tuple[int, ...]:
    """The launch grid of ``items`` × ``blocks`` programs, as ``_program_place``
    (:mod:`.device`) reads it: the faster-moving of the two on axis 0."""
    if not channels_first:
        return (items, blocks)
    return (blocks, items) if items <= _GRID_AXIS_MAX else (blocks * items,)


def _looping_items(items: int, blocks: int, resident: int, multiprocessors: int) -> int:
    """Items on the grid of a looping launch: ``resident`` programs per multiprocessor
    over the ``blocks`` channel blocks (at least one item, at most ``items``, and within a
    grid axis: a looping program steps by its axis' program count)."""
    return max(1, min(items, resident * multiprocessors // blocks, _GRID_AXIS_MAX))


def _stride_alignment(strides: tuple[int, ...]) -> int:
    """16 where every one of ``strides`` is a multiple of 16, else 1: what Triton's
    specialization of the launch would have known of them (``device._opaque`` hides
    them from it)."""
    return 16 if all(stride % 16 == 0 for stride in strides) else 1


def _check_channel_blocks(channels: int, widths_first: tuple[tuple[int, bool], ...]) -> None:
    """Refuse channel blocks a rows-first grid cannot place: those go on axis 1 (:func:`_grid`).

    ``widths_first`` holds ``(channels per program, channels first)`` of each launch.
    """
    for width, first in widths_first:
        if not first and -(-channels // width) > _GRID_AXIS_MAX:
            raise ValueError(
                f"channels: {channels} channels make more than {_GRID_AXIS_MAX} blocks of "
                f"{width}, which a rows-first launch cannot place; use wider blocks"
            )


def _launch_options(static: dict, registers: int) -> dict:
    """The compiler's launch options: a programmatic dependent launch where DEPENDENT,
    and a register cap (``maxnreg``) where ``registers`` is set and the kernel is
    compiled (the interpreter has no registers)."""
    options = dict(launch_pdl=True) if static["DEPENDENT"] else {}
    if registers and static["FAST"]:
        options["maxnreg"] = registers
    return options


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    """Multiprocessors of ``device`` (kept per device: asked on every launch); 1 off CUDA,
    where the interpreter runs the programs one after another."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count
