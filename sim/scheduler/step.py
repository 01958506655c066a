"""What one scheduled step hands the loop: the batch, row bookkeeping, and the memory state."""

from __future__ import annotations

import time

import attrs
import numpy as np

from stepplan.planner import StepBatch


@attrs.frozen
class StepMemory:
    """The cache and the queue as a step runs (after its blocks were allocated); the
    fields are ``steps.csv`` columns of these names, in this order.

    Attributes:
        num_waiting: requests arrived but not running (preempted ones included).
        num_preempted: requests preempted while scheduling this step.
        kv_used_blocks: blocks held by running requests (cached entries they share
            included).
        kv_cached_blocks: blocks of cached prefix entries nobody references (evictable).
        kv_usage: ``kv_used_blocks / capacity`` (0 without a memory model).
    """

    num_waiting: int
    num_preempted: int
    kv_used_blocks: int
    kv_cached_blocks: int
    kv_usage: float

    def row(self) -> tuple[int, int, int, int, float]:
        """The fields in order, as the loop appends them to a step's record."""
        return (
            self.num_waiting,
            self.num_preempted,
            self.kv_used_blocks,
            self.kv_cached_blocks,
            self.kv_usage,
        )


@attrs.frozen(eq=False)
class ScheduledStep:
    """One step's batch and the bookkeeping the scheduler needs back.

    Attributes:
        batch: the step as the planner takes it (rows in the engine's order).
        request_ids: ``[R], int64`` the request of every row.
        is_spec: ``[R], bool`` spec rows.
        emits_first: ``[R], bool`` prefill rows that complete the prompt (they emit the
            request's first output token, or after a preemption its next one).
        decoding: ``[R], bool`` rows past their prompt (spec or decode).
        kv_tokens: ``sum(num_computed + q)``.
        attention_pairs: ``sum(q * (num_computed + (q + 1) / 2))``.
        batch_ns: nanoseconds spent constructing (validating) :attr:`batch`.
        memory: the cache and the queue during the step.
    """

    batch: StepBatch
    request_ids: np.ndarray
    is_spec: np.ndarray
    emits_first: np.ndarray
    decoding: np.ndarray
    kv_tokens: int
    attention_pairs: float
    batch_ns: int
    memory: StepMemory


@attrs.frozen(eq=False)
class StepRows:
    """The rows of a step before the batch is built (``[R]`` arrays, engine order).

    Attributes:
        ids: ``int64`` requests; ``q``: ``int64`` tokens scheduled;
        computed: ``int64`` computed tokens; ``slots``: ``int32`` slots;
        accepted: ``int32`` ``num_accepted_tokens`` of spec rows.
        is_spec, emits_first, decoding: ``bool``, as in :class:`ScheduledStep`.
    """

    ids: np.ndarray
    q: np.ndarray
    computed: np.ndarray
    slots: np.ndarray
    accepted: np.ndarray
    is_spec: np.ndarray
    emits_first: np.ndarray
    decoding: np.ndarray


def build_step(rows: StepRows, num_groups: int, memory: StepMemory) -> ScheduledStep:
    """The planner's ``StepBatch`` of ``rows`` (timed) and its :class:`ScheduledStep`."""
    q, computed, slots = rows.q, rows.computed, rows.slots
    # int32 arrays, as an engine hands them over (StepBatch then only copies them)
    q32, computed32 = q.astype(np.int32), computed.astype(np.int32)
    drafts = np.where(rows.is_spec, q32 - 1, -1)
    accepted = np.where(rows.is_spec, rows.accepted, 1)
    start = time.perf_counter_ns()
    batch = StepBatch(
        query_lens=q32,
        num_computed_tokens=computed32,
        slots=slots if num_groups == 1 else np.broadcast_to(slots, (num_groups, slots.size)),
        num_draft_tokens=drafts,
        num_accepted_tokens=accepted,
    )
    batch_ns = time.perf_counter_ns() - start
    return ScheduledStep(
        batch=batch,
        request_ids=rows.ids,
        is_spec=rows.is_spec,
        emits_first=rows.emits_first,
        decoding=rows.decoding,
        kv_tokens=int(computed.sum() + q.sum()),
        attention_pairs=float(q @ computed + 0.5 * (q @ (q + 1))),
        batch_ns=batch_ns,
        memory=memory,
    )
