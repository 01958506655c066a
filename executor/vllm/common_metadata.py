"""vLLM's metadata in, a plan out; duck-typed: no vLLM import.

Two readings of vLLM's ``CommonAttentionMetadata``. The drop-in builder takes only what
lives on the host (``query_start_loc_cpu``, ``num_decode_draft_tokens_cpu``, the counts:
:func:`~stepplan.planner.host_step_batch`'s step) and gathers slots, accepted counts and
computed tokens on the device (:mod:`.gather_kernels`).
:func:`plan_from_common_metadata` reads every field into a complete plan, device tensors
included (each read waits for the device): an oracle for tests and offline use. (The
other way, :mod:`.metadata_fields` lays a plan out as the seed builder's fields.)
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
