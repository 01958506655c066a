"""What one scheduled step hands the loop: the batch, row bookkeeping, and the memory state."""

from __future__ import annotations

import attrs
import numpy as np

from stepplan.planner import StepBatch


@attrs.frozen
class StepMemory:
    """The cache and the queue as a step runs (after its blocks were allocated); the
    fields are ``steps.csv`` columns of these names, in this order (``schema.py``
    types them and gives their units; a new field needs its meaning there).

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
