"""One layer of one step on the device: the launch shape of a plan, and the launches."""

from __future__ import annotations

import functools

import attrs
import numpy as np
import torch

from stepplan.planner import ExecutionPlan, PlanLayout

from ..reference import check_operands
from .grid import _check_channel_blocks, _multiprocessors
from .persistent import _launch_rows_persistent
from .rows import _launch_rows
from .tiles import _launch_tiles
from .tuning import Blocks, default_blocks

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
        padded: the grids hold a graph bucket's capacity, the live work first and padding
            after it (a graph plan); an eager plan's hold its live work alone.
    """

    layout: PlanLayout
    rows_grid: int
    tiles_grid: int
    query_len_max: int
    tile_tokens: int
    row_tokens_max: int
    padded: bool = False

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
        padded=plan.graph is not None,
    )


@functools.cache
def _dependent_launches(device: torch.device) -> bool:
    """Whether kernels on ``device`` can be programmatic dependent launches (sm_90 on).

    Kept per device: a fact of the hardware, asked on every eager launch, and the
    capability query costs microseconds."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


#: Widest window the row programs hold whole in registers (a power of two).
_WHOLE_WINDOW_MAX = 32


def _compact_window(conv_state: torch.Tensor) -> int:
    """``W`` where each channel's window is one contiguous run of ``W <= 32`` entries
    (strides ``[., W, 1]``), else 0 (the entry-by-entry path)."""
    window = conv_state.shape[2]
    compact = conv_state.stride()[1:] == (window, 1) and 1 < window <= _WHOLE_WINDOW_MAX
    return window if compact else 0


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
            memory (the package docstring). Under graph capture the fork is free at replay.
    """
    check_operands(
        x,
        residual,
        conv_state,
        weight,
        dilation=dilation,
        group=group,
        num_groups=shape.layout.num_groups,
        query_len_max=shape.query_len_max,
        min_tokens=min_tokens,
    )
    blocks = blocks or default_blocks(x.shape[1], conv_state.stride(2) == 1)
    _check_launch(shape, plan_buffer, x, residual, (weight.shape[1] - 1) * dilation, blocks)
    args = (
        (plan_buffer, x, residual, conv_state, weight),
        (x.shape[1], x.stride(0), residual.stride(0), *conv_state.stride(), *weight.stride()),
        _static_arguments(x, conv_state, weight, dilation, blocks),
    )
    _launch(
        shape, blocks, shape.plan_offsets[group], (*args, _multiprocessors(x.device)), side_stream
    )


def _launch(
    shape: LaunchShape,
    blocks: Blocks,
    offsets: tuple[tuple[int, ...], tuple[int, ...]],
    args: tuple[tuple, tuple, dict, int],
    side_stream: torch.cuda.Stream | None,
) -> None:
    """The launches of ``shape``: rows beside tiles on ``side_stream`` where given and both run.

    ``args``: the launches' buffers, sizes, shared constexprs and the device's
    multiprocessors."""
    rows_offsets, tiles_offsets = offsets
    launch_rows = _launch_rows_persistent if blocks.rows_resident else _launch_rows
    if shape.rows_grid and shape.tiles_grid and side_stream is not None:
        main = torch.cuda.current_stream(args[0][1].device)
        side_stream.wait_stream(main)
        with torch.cuda.stream(side_stream):
            launch_rows(shape, blocks, rows_offsets, *args)
        _launch_tiles(shape, blocks, tiles_offsets, *args)
        main.wait_stream(side_stream)
        return
    if shape.rows_grid:
        launch_rows(shape, blocks, rows_offsets, *args)
    if shape.tiles_grid:
        _launch_tiles(shape, blocks, tiles_offsets, *args)


def _static_arguments(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, dilation: int, blocks: Blocks
) -> dict:
    """The constexprs both launches share, by name."""
    return dict(
        TAPS=weight.shape[1],
        DILATION=dilation,
        CHANNEL_UNIT=conv_state.stride(1) == 1,
        WINDOW_UNIT=conv_state.stride(2) == 1,
        WHOLE_WINDOW=_compact_window(conv_state),
        FAST=int(x.is_cuda),  # compiled, not interpreted: see _silu_rounded
        DEPENDENT=blocks.dependent if _dependent_launches(x.device) else 0,
    )


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
    _check_channel_blocks(
        x.shape[1],
        (
            # Persistent rows put their channel blocks on axis 1, as rows-first ones do.
            (blocks.rows_channels, blocks.rows_channels_first and not blocks.rows_resident),
            (blocks.tiles_channels, blocks.tiles_channels_first),
        ),
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
