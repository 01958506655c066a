"""vLLM's metadata in, a plan out; duck-typed: no vLLM import.

Two readings of vLLM's ``CommonAttentionMetadata``. :func:`host_step_batch` takes only
what lives on the host (``query_start_loc_cpu``, ``num_decode_draft_tokens_cpu``, the
counts): the drop-in builder's, which gathers slots, accepted counts and computed tokens
on the device (:mod:`.door`). :func:`plan_from_common_metadata` reads every field into a
complete plan, device tensors included (each read waits for the device): an oracle for
tests and offline use. (The other way, :mod:`.seed` lays a plan out as the seed
builder's fields.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from stepplan.planner import ExecutionPlan, Planner, PlannerConfig, StepBatch, compile_plan

_INT32 = np.dtype(np.int32)


def host_array(value: Any) -> np.ndarray:
    """A numpy copy of a host or device tensor, list or array (a device tensor waits for
    the device)."""
    if hasattr(value, "detach"):
        value = value.detach().to("cpu").numpy()
    return np.asarray(value)


def host_only_array(field: str, value: Any) -> np.ndarray:
    """``value`` (a CPU tensor, array or list) as numpy, without a copy where it can;
    a tensor on a device is refused (reading it would wait for the device)."""
    if isinstance(value, torch.Tensor):
        try:
            return value.numpy()
        except (TypeError, RuntimeError):  # on a device, or one that needs grad
            if value.device.type != "cpu":
                raise ValueError(
                    f"{field}: must be on the host, got a tensor on {value.device} "
                    "(reading it would wait for the device)"
                ) from None
            return value.detach().numpy()
    return np.asarray(value)


def host_step_batch(
    query_start: np.ndarray,
    drafts: np.ndarray | None,
    num_reqs: int,
    num_actual_tokens: int,
    placeholders: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> StepBatch:
    """The :class:`StepBatch` of one step from host data alone.

    Args:
        query_start: ``[>= num_reqs + 1]`` vLLM's ``query_start_loc_cpu``.
        drafts: ``[>= num_reqs]`` ``num_decode_draft_tokens_cpu`` (``>= 0`` marks spec
            rows), or ``None`` (no row is spec).
        num_reqs: rows, padding rows included.
        num_actual_tokens: the engine's padded token count.
        placeholders: zeros ``[R]``, zeros ``[G, R]``, ones ``[R]``, minus ones ``[R]``
            (int32): the computed tokens, slots and accepted counts the plan holds until
            the device fills in the real ones (the slots are NULL, so the batch allows
            NULL slots), and the drafts of a step without spec rows.
    """
    if query_start.shape[0] < num_reqs + 1:
        raise ValueError(
            f"common_attn_metadata.query_start_loc_cpu: {query_start.shape[0]} entries, "
            f"num_reqs + 1 = {num_reqs + 1} needed"
        )
    query_lens = query_start[1 : num_reqs + 1] - query_start[:num_reqs]
    if query_lens.dtype != _INT32:
        query_lens = query_lens.astype(np.int32)
    zeros, slots, ones, no_drafts = placeholders
    if drafts is None:
        drafts = no_drafts
    else:
        if drafts.shape[0] < num_reqs:
            raise ValueError(
                f"num_decode_draft_tokens_cpu: {drafts.shape[0]} entries, num_reqs = "
                f"{num_reqs} needed"
            )
        drafts = drafts[:num_reqs]
        if drafts.dtype != _INT32:
            drafts = drafts.astype(np.int32)
    return StepBatch(
        query_lens,
        zeros,
        slots,
        drafts,
        ones,
        num_padded_tokens=num_actual_tokens,
        allow_null_slots=True,
    )


def batch_from_common_metadata(
    m: Any,
    *,
    num_accepted_tokens: Any | None,
    num_decode_draft_tokens_cpu: Any | None,
) -> StepBatch:
    """The :class:`StepBatch` of one vLLM step (one layer group).

    Reads ``m.query_start_loc_cpu`` ``[num_reqs + 1]``, ``m.num_reqs``,
    ``m.num_actual_tokens`` (the padded token count),
    ``m.block_table_tensor[:, 0]`` (the slot) and
    ``m.compute_num_computed_tokens()``. Rows without drafts info are not spec.
    """
    rows = int(m.num_reqs)
    query_start = host_array(m.query_start_loc_cpu)[: rows + 1].astype(np.int64)
    query_lens = np.diff(query_start)
    computed = host_array(m.compute_num_computed_tokens())[:rows]
    slots = host_array(m.block_table_tensor)[:rows, 0]
    if num_decode_draft_tokens_cpu is None:
        drafts = np.full(rows, -1)
    else:
        drafts = host_array(num_decode_draft_tokens_cpu)[:rows]
    accepted = (
        np.ones(rows, dtype=np.int32)
        if num_accepted_tokens is None
        else host_array(num_accepted_tokens)
    )
    return StepBatch(
        query_lens=query_lens,
        num_computed_tokens=computed,
        slots=slots,
        num_draft_tokens=drafts,
        num_accepted_tokens=accepted[:rows],
        num_padded_tokens=int(m.num_actual_tokens),
    )


def plan_from_common_metadata(
    m: Any,
    *,
    num_accepted_tokens: Any | None,
    num_decode_draft_tokens_cpu: Any | None,
    config: PlannerConfig,
    planner: Planner | None = None,
) -> ExecutionPlan:
    """Compile the plan of one vLLM step from its ``CommonAttentionMetadata``.

    ``planner`` (built for ``config``), kept by the engine across steps, gives
    the same plan as ``compile_plan``: in less host time for graph steps (kept
    shapes), in about the same for eager ones.
    """
    # Identity first: comparing two configs field by field costs a step microseconds.
    if planner is not None and planner.config is not config and planner.config != config:
        raise ValueError("planner was built for another config")
    batch = batch_from_common_metadata(
        m,
        num_accepted_tokens=num_accepted_tokens,
        num_decode_draft_tokens_cpu=num_decode_draft_tokens_cpu,
    )
    return compile_plan(batch, config) if planner is None else planner.compile(batch)
