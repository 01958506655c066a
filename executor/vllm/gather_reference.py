"""The kernels of :mod:`.gather_kernels` in torch operations, after their copies: the CPU
builder's device half, and the specification the kernels are tested against.

The buffer is a CPU tensor, so its header and plan are read on the host (they are host
data); the engine's tensors (block tables, ``seq_lens``, accepted counts) only through
torch operations, as device tensors would be, never read back.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .gather_kernels import HEADER, SLOT_SOURCES_PER_GROUP, TICKET_WORD, header_values


class _Step:
    """The header of the step in ``words``, and its group-ordered rows' engine rows."""

    def __init__(self, words: torch.Tensor) -> None:
        self.words = words
        self.host = host = words.numpy()
        self.at = at = header_values(host)
        self.request = np.full(at["gather"], -1, np.int64)
        self.request[: at["rows"]] = host[at["request"] : at["request"] + at["rows"]]

    def put(self, start: int, values: torch.Tensor, *, flags: bool = False) -> None:
        """``buffer[start : start + len(values)] = values`` (bytes with ``flags``)."""
        target = self.words.view(torch.uint8) if flags else self.words
        target[start : start + values.shape[0]] = values.to(target.dtype)


def open_step_reference(
    entry: torch.Tensor | None,
    words: torch.Tensor,
    table: torch.Tensor,
    query_start: torch.Tensor,
    seq_lens: torch.Tensor,
    accepted: torch.Tensor | None,
    group: int,
    query_len_max: int,
    registered: Sequence[torch.Tensor] = (),
) -> None:
    """``_open_step`` on ``words``: the copy of ``entry``'s ranges (``None``: the header and
    plan are in place already), the slots of every ``registered`` table's group and then
    of ``group`` from ``table``, the rows, the plan sources, and in a step split by
    position the engine-ordered sources."""
    if entry is not None:
        copy_entry_reference(entry, words)
    step = _Step(words)
    for other, registered_table in enumerate(registered):
        _slots(step, registered_table, other)
    _slots(step, table, group)
    _rows(step, seq_lens, accepted, query_len_max)
    _plan_sources(step)
    _engine_rows(step, query_start, seq_lens)


def copy_entry_reference(entry: torch.Tensor, words: torch.Tensor) -> None:
    """The opening kernel's copy, into the same words of ``words``: the entry's header
    with its ticket, its plan (as long as the header's summary says) and the accepted
    counts the host gave (as many as the header says)."""
    host = entry.numpy()
    plan_at, accepted_at = int(host[HEADER["plan_at"]]), int(host[HEADER["accepted_host_at"]])
    for start, length in (
        (0, TICKET_WORD + 1),
        (plan_at, int(host[HEADER["size"]])),
        (accepted_at, int(host[HEADER["accepted_rows"]])),
    ):
        words[start : start + length] = entry[start : start + length]


def group_slots_reference(words: torch.Tensor, table: torch.Tensor, group: int) -> None:
    """``_group_slots``: group ``group``'s slots from ``table`` into the open step."""
    _slots(_Step(words), table, group)


def _slots(step: _Step, table: torch.Tensor, group: int) -> None:
    at, request = step.at, step.request
    rows, gather, stride = at["rows"], at["gather"], at["stride"]
    live = torch.from_numpy(request >= 0)
    if bool(live.any()):  # a host mask: the plan's own rows
        index = torch.from_numpy(np.maximum(request, 0))
        slot = torch.where(live, table[:, 0].index_select(0, index).to(torch.int32), 0)
    else:
        slot = torch.zeros(gather, dtype=torch.int32)
    step.put(at["slot"] + group * rows, slot[:rows])
    spec_at = at["slots_at"] + SLOT_SOURCES_PER_GROUP * group * stride
    step.put(spec_at, slot)
    step.put(spec_at + stride, slot[at["spec_rows"] :])
    step.put(spec_at + 2 * stride, slot[at["first_prefill"] :])
    split = at["split"]
    if split >= 0:  # every engine row's, in engine order
        engine = table[: at["engine_rows"], 0].to(torch.int32)
        step.put(spec_at + 3 * stride, engine)
        step.put(spec_at + 4 * stride, engine[split:])


def _rows(
    step: _Step, seq_lens: torch.Tensor, accepted: torch.Tensor | None, query_len_max: int
) -> None:
    at, host, request = step.at, step.host, step.request
    rows, gather = at["rows"], at["gather"]
    kind = np.full(gather, 3, np.int64)
    kind[:rows] = host[at["kind"] : at["kind"] + rows]
    query_len = np.zeros(gather, np.int32)
    query_len[:rows] = np.diff(host[at["query_start"] : at["query_start"] + rows + 1])
    spec = torch.from_numpy((request >= 0) & (kind == 0))
    plain = torch.from_numpy((request >= 0) & ((kind == 1) | (kind == 2)))
    index = torch.from_numpy(np.maximum(request, 0))
    counts = torch.ones(gather, dtype=torch.int32)
    if accepted is not None and bool(spec.any()):
        counts = torch.where(spec, accepted.index_select(0, index).to(torch.int32), counts)
    computed = torch.zeros(gather, dtype=torch.int32)
    if bool(plain.any()):
        seq = seq_lens.index_select(0, index).to(torch.int32)
        computed = torch.where(plain, seq - torch.from_numpy(query_len), 0)
    has_initial = computed > 0
    step.put(
        at["state_offset"], torch.where(spec, (counts - 1).clamp(0, query_len_max - 1), 0)[:rows]
    )
    step.put(at["reads_state"], torch.where(spec, 1, has_initial.to(torch.int32))[:rows])
    step.put(at["accepted"], counts[:rows])
    step.put(at["accepted_at"], counts)
    spec_rows, first_prefill = at["spec_rows"], at["first_prefill"]
    step.put(at["has_plain_at"], has_initial[spec_rows:], flags=True)
    step.put(at["has_prefill_at"], has_initial[first_prefill:], flags=True)
    step.put(at["computed_prefill_at"], computed[first_prefill:])


def _plan_sources(step: _Step) -> None:
    """The plan sources, from the plan in the buffer (host data: numpy on its memory)."""
    at, host = step.at, step.host
    starts = host[at["query_start"] :]
    spec_rows, first_prefill, live = at["spec_rows"], at["first_prefill"], at["live_rows"]
    count = at["gather"] + 1
    host[at["spec_qsl_at"] : at["spec_qsl_at"] + count] = starts[
        np.minimum(np.arange(count), spec_rows)
    ]
    for first, target in ((spec_rows, at["non_spec_qsl_at"]), (first_prefill, at["qsl_p_at"])):
        count = live - first + 1
        host[target : target + count] = starts[first : first + count] - starts[first]
    token_map, spec_tokens, tokens = at["token_map"], at["spec_tokens"], at["tokens"]
    longs = host.view(np.int64)
    for first, count, target in (
        (0, spec_tokens, at["spec_tokens_at"]),
        (spec_tokens, tokens - spec_tokens, at["plain_tokens_at"]),
    ):
        longs[target : target + count] = host[token_map + first : token_map + first + count]
    masks = host.view(np.uint8)[at["masks_at"] : at["masks_at"] + at["engine_rows"]]
    masks[:] = 0
    masks[host[at["request"] : at["request"] + spec_rows]] = 1


def _engine_rows(step: _Step, query_start: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """The engine-ordered sources of a step split by position: per engine row its
    has-initial-state flag, query length and start; from the split on the flags and the
    starts shifted to begin at 0 (torch operations on the engine's tensors)."""
    at = step.at
    split, rows = at["split"], at["engine_rows"]
    if split < 0:
        return
    starts = query_start[: rows + 1].to(torch.int32)
    lengths = starts[1:] - starts[:-1]
    has_initial = (seq_lens[:rows].to(torch.int32) - lengths) > 0
    step.put(at["engine_has_at"], has_initial, flags=True)
    step.put(at["engine_has_p_at"], has_initial[split:], flags=True)
    step.put(at["engine_qlen_at"], lengths)
    step.put(at["engine_qsl_at"], starts)
    step.put(at["engine_qsl_p_at"], starts[split:] - starts[split])
