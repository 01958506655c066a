"""The seed builder's rules as plain numpy, written for the tests (independent of stepplan).

``seed_fields`` reads the seed's ``PleShortConvAttentionMetadataBuilder.build`` (and the
base builder's fields it keeps, as SPEC §3 describes them) for one step given as
per-row numpy arrays. It returns every field of ``PleShortConvAttentionMetadata``:
ints, numpy arrays of the seed's dtypes, ``None`` where the seed leaves a field unset,
or ``PASS`` where the seed hands the engine's own tensor on. Rows are classified by their
own masks (SPEC §3.1); zero-length rows join no group.

Where the seed indexes by position (``query_start_loc[:num_spec + 1]`` in a batch of
spec rows only, ``num_computed_tokens[:num_decodes]`` without spec rows), these rules
index by mask: the two agree when zero-length rows trail, as vLLM's padding rows do.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

PASS = "the engine's own"
NONE_FIELDS = (
    "nums_dict",
    "batch_ptr",
    "token_chunk_offset_ptr",
    "block_idx_last_scheduled_token",
    "block_idx_first_scheduled_token_p",
    "block_idx_last_computed_token",
    "block_idx_last_scheduled_token_prev_step",
)


def _starts(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _pad(values: np.ndarray, length: int, fill: Any) -> np.ndarray:
    return np.concatenate([values, np.full(length - len(values), fill, values.dtype)])


def seed_fields(
    q: np.ndarray,
    drafts: np.ndarray | None,
    accepted: np.ndarray | None,
    seq_lens: np.ndarray,
    slots: np.ndarray,
    num_actual_tokens: int,
    *,
    num_spec: int,
    full_graphs: bool,
    capture_sizes: tuple[int, ...],
    max_num_seqs: int,
) -> dict[str, Any]:
    """Every metadata field of one step: ``q``, ``seq_lens``, ``slots`` (block table
    column 0) per engine row; ``drafts`` and ``accepted`` per row or ``None``."""
    rows = len(q)
    largest = max(capture_sizes)
    limits = (min(max_num_seqs, largest), min(max_num_seqs * (num_spec + 1), largest))
    fields: dict[str, Any] = dict.fromkeys(NONE_FIELDS)
    fields.update(
        num_reqs=rows,
        num_actual_tokens=num_actual_tokens,
        spec_query_len=num_spec + 1,
        query_start_loc=PASS,
        seq_lens=PASS,
        num_decode_draft_tokens_cpu=PASS,
    )
    spec = np.zeros(rows, bool) if not num_spec or drafts is None else drafts[:rows] >= 0
    computed = (seq_lens[:rows] - q).astype(np.int32)
    if spec.any():
        ones = np.ones(rows, np.int32)
        counts = ones if accepted is None else accepted[:rows].astype(np.int32)
        graph = full_graphs, limits
        fields.update(_spec_rules(q, spec, counts, computed, slots[:rows].astype(np.int32), graph))
    else:
        decode_pad = capture_sizes if full_graphs else None
        fields.update(_plain_rules(q, computed, slots[:rows].astype(np.int32), decode_pad, limits))
    return fields


def _counts(q: np.ndarray, spec: np.ndarray, decode: np.ndarray, prefill: np.ndarray) -> dict:
    return dict(
        num_spec_decodes=int(spec.sum()),
        num_spec_decode_tokens=int(q[spec].sum()),
        num_decodes=int(decode.sum()),
        num_decode_tokens=int(decode.sum()),
        num_prefills=int(prefill.sum()),
        num_prefill_tokens=int(q[prefill].sum()),
        max_prefill_query_len=int(q[prefill].max()) if prefill.any() else 0,
    )


def _spec_rules(q, spec, accepted, computed, slots, graph) -> dict[str, Any]:
    """The seed's own path: a step with at least one spec row."""
    rows = len(q)
    decode, prefill = ~spec & (q == 1), ~spec & (q > 1)
    spec_rows, decode_rows, prefill_rows = (np.flatnonzero(m) for m in (spec, decode, prefill))
    plain_rows = np.concatenate([decode_rows, prefill_rows])
    ns, nd, npf = len(spec_rows), len(decode_rows), len(prefill_rows)
    out = _counts(q, spec, decode, prefill)
    spec_tokens = out["num_spec_decode_tokens"]
    out.update(
        spec_sequence_masks=spec.copy(),
        spec_state_indices_tensor=slots[spec_rows],
        spec_query_start_loc=_starts(q[spec_rows]),
        num_accepted_tokens=accepted[spec_rows],
    )
    if not nd and not npf:
        out.update(
            spec_token_indx=np.arange(spec_tokens, dtype=np.int32),
            non_spec_token_indx=np.zeros(0, np.int32),
            state_indices_tensor=np.zeros(0, np.int32),
            non_spec_query_start_loc=None,
        )
        full_graphs, (max_rows, max_tokens) = graph
        if full_graphs and ns <= max_rows and spec_tokens <= max_tokens:
            out["spec_state_indices_tensor"] = _pad(out["spec_state_indices_tensor"], rows, 0)
            spec_qsl = out["spec_query_start_loc"]
            out["spec_query_start_loc"] = _pad(spec_qsl, rows + 1, spec_qsl[-1])
            out["num_accepted_tokens"] = _pad(out["num_accepted_tokens"], rows, 1)
        return out
    # Tokens grouped spec | decode | prefill by a stable sort of each token's group.
    group = np.where(spec, 0, np.where(decode, 1, 2))
    order = np.argsort(np.repeat(group, q), kind="stable").astype(np.int64)
    plain_qsl = _starts(q[plain_rows])
    state = slots[plain_rows]
    out.update(
        spec_token_indx=order[:spec_tokens],
        non_spec_token_indx=order[spec_tokens:],
        state_indices_tensor=state,
        non_spec_query_start_loc=plain_qsl,
        state_indices_tensor_d=state[:nd],
        state_indices_tensor_p=state[nd:],
    )
    plain_computed = computed[plain_rows]
    if nd:
        out["has_initial_states_d"] = plain_computed[:nd] > 0
        out["query_start_loc_d"] = plain_qsl[: nd + 1]
    if npf:
        out["num_computed_tokens_p"] = plain_computed[nd:]
        out["has_initial_states_p"] = plain_computed[nd:] > 0
        out["query_start_loc_p"] = (plain_qsl[nd:] - nd).astype(np.int32)
    return out


def _plain_rules(q, computed, slots, capture_sizes, limits) -> dict[str, Any]:
    """The path without spec rows (the base builder's decode and prefill fields)."""
    no_spec = np.zeros(len(q), bool)
    decode, prefill = q == 1, q > 1
    decode_rows, prefill_rows = np.flatnonzero(decode), np.flatnonzero(prefill)
    nd, npf = len(decode_rows), len(prefill_rows)
    out = _counts(q, no_spec, decode, prefill)
    out["non_spec_query_start_loc"] = PASS
    padded = nd
    if capture_sizes is not None and nd and not npf and nd <= limits[0]:
        padded = capture_sizes[bisect.bisect_left(capture_sizes, nd)]
    if nd:
        out["state_indices_tensor_d"] = _pad(slots[decode_rows], padded, 0)
        out["has_initial_states_d"] = _pad(computed[decode_rows] > 0, padded, False)
        out["query_start_loc_d"] = np.arange(nd + 1, dtype=np.int32)
    if npf:
        out["state_indices_tensor_p"] = slots[prefill_rows]
        out["num_computed_tokens_p"] = computed[prefill_rows]
        out["has_initial_states_p"] = computed[prefill_rows] > 0
        out["query_start_loc_p"] = _starts(q[prefill_rows])
        out["state_indices_tensor"] = np.concatenate([slots[decode_rows], slots[prefill_rows]])
    else:
        out["state_indices_tensor"] = out.get("state_indices_tensor_d", np.zeros(0, np.int32))
    return out
