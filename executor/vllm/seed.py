"""A plan laid out as the seed builder's ``PleShortConvAttentionMetadata`` fields.

``seed_view`` gives engine code written against the seed's metadata the same
fields from a plan, graph padding included, so it reads a plan unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepplan.planner import ExecutionPlan, PlannerConfig

#: Seed fields set only where a step has spec rows.
SPEC_FIELDS = (
    "spec_sequence_masks",
    "spec_token_indx",
    "non_spec_token_indx",
    "spec_state_indices_tensor",
    "spec_query_start_loc",
    "num_accepted_tokens",
)


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
    if pure_spec and plan.num_spec_rows <= max_rows and plan.num_spec_decode_tokens <= max_tokens:
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
    ns = plan.num_spec_rows
    starts = plan.row_query_start[: plan.num_rows + 1]
    non_spec_qsl = (starts[ns:] - starts[ns]).astype(np.int32)
    spec_pad, decode_pad = _seed_pads(plan)
    view = _counts(plan) | _non_spec_fields(plan, group, non_spec_qsl, decode_pad)
    if not ns:
        engine_rows = plan.batch.num_rows + 1 - len(non_spec_qsl)
        view["non_spec_query_start_loc"] = _padded(
            non_spec_qsl, len(non_spec_qsl) + engine_rows, non_spec_qsl[-1]
        )
        view.update(dict.fromkeys(SPEC_FIELDS, None))
        return view
    view.update(_spec_fields(plan, group, spec_pad))
    non_spec_rows = plan.num_decode_rows + plan.num_prefill_rows
    view["non_spec_query_start_loc"] = non_spec_qsl if non_spec_rows else None
    return view


def _counts(plan: ExecutionPlan) -> dict[str, int]:
    """The seed's host counts of ``plan``."""
    batch = plan.batch
    return {
        "num_reqs": batch.num_rows,
        "num_actual_tokens": batch.num_padded_tokens or batch.num_tokens,
        "num_spec_decodes": plan.num_spec_rows,
        "num_spec_decode_tokens": plan.num_spec_decode_tokens,
        "num_decodes": plan.num_decode_rows,
        "num_decode_tokens": plan.num_decode_tokens,
        "num_prefills": plan.num_prefill_rows,
        "num_prefill_tokens": plan.num_prefill_tokens,
        "spec_query_len": plan.query_len_max,
        "max_prefill_query_len": plan.max_prefill_query_len,
    }


def _non_spec_fields(
    plan: ExecutionPlan, group: int, non_spec_qsl: np.ndarray, decode_pad: int | None
) -> dict[str, Any]:
    """The decode (``_d``) and prefill (``_p``) fields, and ``state_indices_tensor``.

    ``non_spec_qsl`` is ``[non-spec rows + 1], int32``: the query starts of the rows after
    the spec rows, from 0.
    """
    ns, nd, npf = plan.num_spec_rows, plan.num_decode_rows, plan.num_prefill_rows
    live, batch = plan.num_rows, plan.batch
    slots = plan.row_slot[group, :live]
    has_initial = batch.num_computed_tokens[plan.row_request[:live]] > 0
    view: dict[str, Any] = {
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
    return view


def _spec_fields(plan: ExecutionPlan, group: int, spec_pad: int | None) -> dict[str, Any]:
    """The fields of :data:`SPEC_FIELDS`, for a plan with spec rows."""
    ns = plan.num_spec_rows
    tokens = plan.token_map[: plan.num_tokens]
    spec_qsl = plan.row_query_start[: ns + 1]
    return dict(
        spec_sequence_masks=plan.batch.kinds == 0,
        spec_token_indx=tokens[: plan.num_spec_decode_tokens],
        non_spec_token_indx=tokens[plan.num_spec_decode_tokens :],
        spec_state_indices_tensor=_padded(plan.row_slot[group, :ns], spec_pad, 0),
        spec_query_start_loc=_padded(spec_qsl, spec_pad and spec_pad + 1, spec_qsl[-1]),
        num_accepted_tokens=_padded(plan.row_num_accepted[:ns], spec_pad, 1),
    )
