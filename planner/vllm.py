"""Bridge to vLLM's metadata contract, duck-typed: no vLLM import.

``plan_from_common_metadata`` reads the fields of vLLM's
``CommonAttentionMetadata`` into a :class:`StepBatch` and compiles it;
``seed_view`` lays a plan out as the seed builder's
``PleShortConvAttentionMetadata`` fields, so engine code written against the
seed can read a plan unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .batch import StepBatch
from .compile import compile_plan
from .config import PlannerConfig
from .plan import ExecutionPlan
from .planner import Planner


def host_array(value: Any) -> np.ndarray:
    """A numpy copy of a host or device tensor, list or array."""
    if hasattr(value, "detach"):
        value = value.detach().to("cpu").numpy()
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


def seed_graph_limits(config: PlannerConfig) -> tuple[int, int]:
    """``(rows, tokens)``: the largest uniform batch the seed captures a full graph for,
    ``min(max_num_seqs, largest size)`` rows and ``min(max_num_seqs * Q, largest size)``
    tokens."""
    largest = config.sizes[-1]
    return min(config.max_num_seqs, largest), min(
        config.max_num_seqs * config.query_len_max, largest
    )


def _seed_pads(plan: ExecutionPlan) -> tuple[int | None, int | None]:
    """Rows the seed pads a pure-spec and a pure-decode batch to (``None``: no padding).

    The seed captures full graphs only for uniform batches within
    :func:`seed_graph_limits`; decode rows pad to the smallest capture size.
    """
    config = plan.config
    if config.graph_mode == "none":
        return None, None
    max_rows, max_tokens = seed_graph_limits(config)
    spec_pad = decode_pad = None
    pure_spec = plan.num_spec_rows and plan.num_rows == plan.num_spec_rows
    if pure_spec and plan.num_spec_rows <= max_rows and plan.num_spec_tokens <= max_tokens:
        spec_pad = max(plan.batch.num_rows, plan.batch.num_padded_rows or 0)
    pure_decode = plan.num_decode_rows and plan.num_rows == plan.num_decode_rows
    if pure_decode and plan.num_decode_rows <= max_rows:
        decode_pad = config.smallest_size(plan.num_decode_rows)
    return spec_pad, decode_pad


def _padded(values: np.ndarray, length: int | None, fill: Any) -> np.ndarray:
    if length is None or length <= len(values):
        return values
    return np.concatenate([values, np.full(length - len(values), fill, dtype=values.dtype)])


def seed_view(plan: ExecutionPlan, group: int = 0) -> dict[str, Any]:
    """The plan as the seed's ``PleShortConvAttentionMetadata`` fields, for layer group ``group``.

    Values are numpy arrays (``int32``; masks ``bool``), ints, or ``None``
    where the seed leaves a field unset, graph padding included. Where the
    seed indexes by position and the engine order is not already grouped
    (a zero-length row between spec rows), this view gives the by-mask value
    of SPEC §3.1 instead of the seed's positional one.
    """
    ns, nd, npf = plan.num_spec_rows, plan.num_decode_rows, plan.num_prefill_rows
    live = plan.num_rows
    batch = plan.batch
    slots = plan.row_slot[group, :live]
    starts = plan.row_query_start[: live + 1]
    has_initial = batch.num_computed_tokens[plan.row_request[:live]] > 0
    spec_pad, decode_pad = _seed_pads(plan)

    non_spec_qsl = (starts[ns:] - starts[ns]).astype(np.int32)
    view: dict[str, Any] = {
        "num_reqs": batch.num_rows,
        "num_actual_tokens": batch.num_padded_tokens or batch.num_tokens,
        "num_spec_decodes": ns,
        "num_spec_decode_tokens": plan.num_spec_tokens,
        "num_decodes": nd,
        "num_decode_tokens": plan.num_decode_tokens,
        "num_prefills": npf,
        "num_prefill_tokens": plan.num_prefill_tokens,
        "spec_query_len": plan.query_len_max,
        "max_prefill_query_len": plan.max_prefill_query_len,
        "state_indices_tensor_d": _padded(slots[ns : ns + nd], decode_pad, 0) if nd else None,
        "state_indices_tensor_p": slots[ns + nd :] if npf else None,
        "has_initial_states_d": _padded(has_initial[ns : ns + nd], decode_pad, False)
        if nd
        else None,
        "has_initial_states_p": has_initial[ns + nd :] if npf else None,
        "num_computed_tokens_p": batch.num_computed_tokens[plan.row_request[ns + nd : live]]
        if npf
        else None,
        "query_start_loc_d": non_spec_qsl[: nd + 1] if nd else None,
        "query_start_loc_p": non_spec_qsl[nd:] - nd if npf else None,
    }
    view["state_indices_tensor"] = (
        np.concatenate([view["state_indices_tensor_d"], slots[ns + nd :]])
        if nd
        else slots[ns + nd :]
    )
    if not ns:
        engine_rows = batch.num_rows + 1 - len(non_spec_qsl)
        view["non_spec_query_start_loc"] = _padded(
            non_spec_qsl, len(non_spec_qsl) + engine_rows, non_spec_qsl[-1]
        )
        view.update(
            dict.fromkeys(
                (
                    "spec_sequence_masks",
                    "spec_token_indx",
                    "non_spec_token_indx",
                    "spec_state_indices_tensor",
                    "spec_query_start_loc",
                    "num_accepted_tokens",
                ),
                None,
            )
        )
        return view
    tokens = plan.token_map[: plan.num_tokens]
    spec_qsl = starts[: ns + 1]
    view.update(
        spec_sequence_masks=batch.kinds == 0,
        spec_token_indx=tokens[: plan.num_spec_tokens],
        non_spec_token_indx=tokens[plan.num_spec_tokens :],
        spec_state_indices_tensor=_padded(slots[:ns], spec_pad, 0),
        spec_query_start_loc=_padded(spec_qsl, spec_pad and spec_pad + 1, spec_qsl[-1]),
        num_accepted_tokens=_padded(plan.row_num_accepted[:ns], spec_pad, 1),
        non_spec_query_start_loc=non_spec_qsl if nd + npf else None,
    )
    return view
