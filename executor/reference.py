"""The oracle: SPEC §2's dilated short convolution for one layer of one step, in plain PyTorch.

Clarity over speed: one request row at a time, on any device, fp32 accumulation.
The Triton kernels (:mod:`stepplan.executor.kernels`) must agree with it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from stepplan.planner import DECODE, PREFILL, SPEC, ExecutionPlan

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_operands(
    x: torch.Tensor,
    residual: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    *,
    dilation: int,
    group: int,
    num_groups: int,
    query_len_max: int,
    min_tokens: int = 0,
) -> None:
    """Raise ``ValueError`` naming the first operand that breaks SPEC §2's shapes (no device sync).

    ``min_tokens`` is the fewest rows ``x`` may have (the plan's live tokens, when known).
    """
    _check_activations(x, residual, min_tokens)
    channels = x.shape[1]
    if weight.ndim != 2 or weight.shape[0] != channels or not 2 <= weight.shape[1] <= 8:
        raise ValueError(
            f"weight: must be [C={channels}, K] with K in 2..8, got {list(weight.shape)}"
        )
    if not 1 <= dilation <= 8:
        raise ValueError(f"dilation: must be in 1..8, got {dilation}")
    if not 0 <= group < num_groups:
        raise ValueError(f"group: must be in 0..{num_groups - 1}, got {group}")
    reach = (weight.shape[1] - 1) * dilation
    need = reach + query_len_max - 1
    if conv_state.ndim != 3 or conv_state.shape[1] != channels or conv_state.shape[2] < need:
        raise ValueError(
            f"conv_state: must be a [num_slots, C={channels}, W >= L + Q - 1 = {need}] view, "
            f"got {list(conv_state.shape)}"
        )
    for name, tensor in (("weight", weight), ("conv_state", conv_state)):
        if tensor.dtype != x.dtype or tensor.device != x.device:
            raise ValueError(f"{name}: must be {x.dtype} on {x.device} like x, got {tensor.dtype}")


def _check_activations(x: torch.Tensor, residual: torch.Tensor, min_tokens: int) -> None:
    if x.dtype not in _DTYPES:
        raise ValueError(f"x: dtype must be one of {_DTYPES}, got {x.dtype}")
    if x.ndim != 2 or x.shape[0] < min_tokens:
        raise ValueError(f"x: must be [num_engine_tokens >= {min_tokens}, C], got {list(x.shape)}")
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(
            f"residual: must match x ({list(x.shape)}, {x.dtype}), "
            f"got {list(residual.shape)}, {residual.dtype}"
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
) -> None:
    """One layer of one step, in place: ``residual += y`` and ``conv_state`` updated (SPEC §2).

    Args:
        plan: the step's plan; only its live rows are touched.
        x: ``[num_engine_tokens, C]``, bf16/fp16/fp32, in the engine's token order.
        residual: ``[num_engine_tokens, C]``, x's dtype; gets ``y`` added in place.
        conv_state: ``[num_slots, C, W]``, x's dtype, a logical view with any strides;
            ``W >= (K - 1) * dilation + Q - 1``. Slot 0 is never read or written.
        weight: ``[C, K]``, x's dtype.
        dilation: ``D``, 1..8.
        group: the layer group whose slots (``plan.row_slot[group]``) this layer uses.
    """
    check_operands(
        x,
        residual,
        conv_state,
        weight,
        dilation=dilation,
        group=group,
        num_groups=plan.num_groups,
        query_len_max=plan.query_len_max,
        min_tokens=plan.batch.num_tokens,
    )
    reach = (weight.shape[1] - 1) * dilation
    histories = [_history(plan, row, x, conv_state, reach, group) for row in range(plan.num_rows)]
    # Every row reads the old state before any row writes its new state.
    for row, history in enumerate(histories):
        if history is not None:
            _add_outputs(plan, row, history, residual, weight, dilation)
    for row, history in enumerate(histories):
        if history is not None:
            _write_state(plan, row, history, conv_state, reach, group)


def _tokens(plan: ExecutionPlan, row: int) -> torch.Tensor:
    """``[q], int64`` engine token rows of ``row``, through the plan's token map."""
    start, stop = plan.row_query_start[row], plan.row_query_start[row + 1]
    return torch.from_numpy(plan.token_map[start:stop].astype("int64"))


def _history(
    plan: ExecutionPlan,
    row: int,
    x: torch.Tensor,
    conv_state: torch.Tensor,
    reach: int,
    group: int,
) -> torch.Tensor | None:
    """``[C, L + q]`` history ``h`` of SPEC §2, or ``None`` where the row contributes nothing."""
    kind, slot = int(plan.row_kind[row]), int(plan.row_slot[group, row])
    if kind not in (SPEC, DECODE, PREFILL) or (kind != SPEC and slot == 0):
        return None  # padding rows; decode/prefill on the NULL slot give y = 0, write nothing
    tokens = x[_tokens(plan, row).to(x.device)].T
    if plan.row_reads_state[row] and slot != 0:
        offset = int(plan.row_state_offset[row])
        past = conv_state[slot, :, offset : offset + reach]
    else:
        past = torch.zeros(x.shape[1], reach, dtype=x.dtype, device=x.device)
    return torch.cat([past, tokens], dim=1)


def _add_outputs(
    plan: ExecutionPlan,
    row: int,
    history: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    dilation: int,
) -> None:
    taps = weight.shape[1]
    q = history.shape[1] - (taps - 1) * dilation
    acc = torch.zeros(history.shape[0], q, dtype=torch.float32, device=history.device)
    for k in range(taps):
        window = history[:, k * dilation : k * dilation + q].float()
        acc += weight[:, k : k + 1].float() * window
    # Round to the activation dtype before silu, as F.conv1d followed by F.silu would.
    y = F.silu(acc.to(history.dtype))
    tokens = _tokens(plan, row).to(residual.device)
    residual[tokens] += y.T


def _write_state(
    plan: ExecutionPlan,
    row: int,
    history: torch.Tensor,
    conv_state: torch.Tensor,
    reach: int,
    group: int,
) -> None:
    slot = int(plan.row_slot[group, row])
    if slot == 0:
        return
    q = history.shape[1] - reach
    if plan.row_kind[row] == SPEC:
        # The window ending at every draft position, so the next step's offset picks one.
        count = min(conv_state.shape[2], reach + q - 1)
        conv_state[slot, :, :count] = history[:, 1 : 1 + count]
    else:
        conv_state[slot, :, :reach] = history[:, q : q + reach]
