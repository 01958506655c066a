"""A continuous-batching scheduler modelled on vLLM v1's, with speculative decoding.

Each step (:meth:`Scheduler.schedule`):

1. **Running requests first**, in admission order. A request still in its prompt
   asks for the rest of it (chunked prefill); a decoding request asks for one
   token plus ``k = min(num_spec_tokens, tokens_left - 1)`` drafts (fewer near the
   end of its output, so it never overshoots). Requests take what they ask while the
   token budget ``max_num_batched_tokens`` lasts, the spec lookahead included; the
   request that meets the end of the budget gets the remainder (a shorter chunk, or
   fewer drafts) and the rest wait for the next step.
2. **Then waiting requests**, first come first served (no request overtakes an
   earlier one), while budget, ``max_num_seqs`` and a free slot remain. A request
   takes a slot of the pool (``1..slot_capacity``; 0 is NULL) when admitted and gives
   it back when it finishes.

Spec rows: ``num_draft_tokens = k``, ``q = k + 1`` (the last emitted token and the
drafts), ``num_accepted_tokens`` = ``a + 1`` for the ``a`` drafts its previous spec
step accepted (1 on its first). A request's first step after its prompt is already a
spec row, and it stays spec (possibly with 0 drafts) to its end, as SPEC §2's state
offset rule requires. With ``num_spec_tokens == 0`` decoding rows are plain decodes.

After the step (:meth:`Scheduler.commit`) a spec row has committed ``1 + a`` tokens
(the fed token and the accepted drafts; rejected drafts are fed again next step as
new positions) and emitted ``a + 1``; a decode row committed and emitted one; a
prefill chunk committed its ``q`` tokens and emits the first output token when it
completes the prompt. Over a request's life every position of its prompt and output
but the last output token is committed exactly once: ``prompt + output - 1``.
"""

from __future__ import annotations

import time

import attrs
import numpy as np

from stepplan.planner import StepBatch

from .config import SchedulerConfig
from .traces import RequestTable


@attrs.frozen(eq=False)
class ScheduledStep:
    """One step's batch and the bookkeeping the scheduler needs back.

    Attributes:
        batch: the step as the planner takes it (rows in the engine's order).
        request_ids: ``[R], int64`` the request of every row.
        is_spec: ``[R], bool`` spec rows.
        emits_first: ``[R], bool`` prefill rows that complete the prompt (they emit the
            request's first output token).
        decoding: ``[R], bool`` rows past their prompt (spec or decode).
        kv_tokens: ``sum(num_computed + q)``.
        attention_pairs: ``sum(q * (num_computed + (q + 1) / 2))``.
        batch_ns: nanoseconds spent constructing (validating) :attr:`batch`.
    """

    batch: StepBatch
    request_ids: np.ndarray
    is_spec: np.ndarray
    emits_first: np.ndarray
    decoding: np.ndarray
    kv_tokens: int
    attention_pairs: float
    batch_ns: int


class Scheduler:
    """The scheduler's mutable state over one trace; see the module docstring.

    Per-request state lives in ``[N]`` arrays indexed by request id (the table's
    row); the running set is an ``[n], int64`` array of ids in admission order.
    """

    def __init__(self, requests: RequestTable, config: SchedulerConfig) -> None:
        n = requests.num_requests
        self.config = config
        self.arrival = requests.arrival_s
        self.prompt = requests.prompt_tokens
        self.output = requests.output_tokens
        self.computed = np.zeros(n, np.int64)  # tokens committed to state
        self.emitted = np.zeros(n, np.int64)  # output tokens produced
        self.slot = np.zeros(n, np.int32)  # 0 until admitted
        self.last_accepted = np.ones(n, np.int32)  # num_accepted_tokens of the next spec row
        self.spec_steps = np.zeros(n, np.int64)
        self.running = np.zeros(0, np.int64)
        self.next_admit = 0  # first request not yet admitted (admission is FCFS)
        self.num_finished = 0
        capacity = config.slots
        self._free_slots = np.arange(capacity, 0, -1, dtype=np.int32)  # a stack, top at end
        self._num_free = capacity

    @property
    def done(self) -> bool:
        """Every request has finished."""
        return self.num_finished == self.prompt.shape[0]

    def next_arrival_s(self) -> float:
        """Arrival of the first request not yet admitted (``inf`` when none is left)."""
        return (
            float(self.arrival[self.next_admit]) if self.next_admit < self.arrival.size else np.inf
        )

    def schedule(self, now_s: float) -> ScheduledStep | None:
        """The next step at time ``now_s``, or ``None`` when nothing can run."""
        budget = self.config.max_num_batched_tokens
        run_ids, run_q, prefilling = self._running_rows(budget)
        used = int(run_q.sum())
        new_ids, new_q = self._admit(now_s, budget - used)
        if run_ids.size + new_ids.size == 0:
            return None
        ids = np.concatenate((run_ids, new_ids))
        q = np.concatenate((run_q, new_q))
        computed = self.computed[ids]
        decoding = np.concatenate((~prefilling, np.zeros(new_ids.size, bool)))
        is_spec = decoding if self.config.num_spec_tokens else np.zeros(ids.size, bool)
        emits_first = ~decoding & (computed + q == self.prompt[ids])
        return self._step(ids, q, computed, is_spec, emits_first, decoding)

    def _running_rows(self, budget: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Running requests that get tokens this step, their ``q``, and which prefill."""
        run = self.running
        if run.size == 0:
            return run, run, np.zeros(0, bool)
        computed, prompt = self.computed[run], self.prompt[run]
        prefilling = computed < prompt
        lookahead = np.minimum(
            self.config.num_spec_tokens, self.output[run] - self.emitted[run] - 1
        )
        want = np.where(prefilling, prompt - computed, 1 + lookahead)
        ends = np.cumsum(want)
        if ends[-1] <= budget:
            return run, want, prefilling
        got = np.clip(budget - (ends - want), 0, want)
        keep = got > 0
        return run[keep], got[keep], prefilling[keep]

    def _admit(self, now_s: float, budget: int) -> tuple[np.ndarray, np.ndarray]:
        """Waiting requests admitted this step (taking slots) and their first chunk."""
        first = self.next_admit
        arrived = int(np.searchsorted(self.arrival, now_s, side="right"))
        room = min(self.config.max_num_seqs - self.running.size, self._num_free, arrived - first)
        if room <= 0 or budget <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        prompt = self.prompt[first : first + room]
        starts = np.cumsum(prompt) - prompt
        count = int(np.searchsorted(starts, budget, side="left"))
        ids = np.arange(first, first + count, dtype=np.int64)
        chunk = np.minimum(prompt[:count], budget - starts[:count])
        self._num_free -= count
        self.slot[ids] = self._free_slots[self._num_free : self._num_free + count][::-1]
        self.next_admit = first + count
        self.running = np.concatenate((self.running, ids))
        return ids, chunk

    def _step(
        self,
        ids: np.ndarray,
        q: np.ndarray,
        computed: np.ndarray,
        is_spec: np.ndarray,
        emits_first: np.ndarray,
        decoding: np.ndarray,
    ) -> ScheduledStep:
        slots = self.slot[ids]
        groups = self.config.num_groups
        # int32 arrays, as an engine hands them over (StepBatch then only copies them)
        q32, computed32 = q.astype(np.int32), computed.astype(np.int32)
        drafts = np.where(is_spec, q32 - 1, -1)
        accepted = np.where(is_spec, self.last_accepted[ids], 1)
        start = time.perf_counter_ns()
        batch = StepBatch(
            query_lens=q32,
            num_computed_tokens=computed32,
            slots=slots if groups == 1 else np.broadcast_to(slots, (groups, slots.size)),
            num_draft_tokens=drafts,
            num_accepted_tokens=accepted,
        )
        batch_ns = time.perf_counter_ns() - start
        return ScheduledStep(
            batch=batch,
            request_ids=ids,
            is_spec=is_spec,
            emits_first=emits_first,
            decoding=decoding,
            kv_tokens=int(computed.sum() + q.sum()),
            attention_pairs=float(q @ computed + 0.5 * (q @ (q + 1))),
            batch_ns=batch_ns,
        )

    def commit(self, step: ScheduledStep, accepted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Apply a step's outcome; ``accepted`` is ``[R], int64`` accepted drafts per row
        (0 on rows that are not spec). Returns ``(emitted [R] int64, finished [R] bool)``."""
        ids, q = step.request_ids, step.batch.query_lens
        spec = step.is_spec
        self.computed[ids] += np.where(spec, 1 + accepted, q)
        emitted = np.where(step.decoding, 1 + accepted, step.emits_first)
        self.emitted[ids] += emitted
        if spec.any():
            spec_ids = ids[spec]
            self.last_accepted[spec_ids] = 1 + accepted[spec]
            self.spec_steps[spec_ids] += 1
        finished = self.emitted[ids] >= self.output[ids]
        if finished.any():
            self._finish(ids[finished])
        return emitted, finished

    def _finish(self, ids: np.ndarray) -> None:
        count = ids.size
        self._free_slots[self._num_free : self._num_free + count] = self.slot[ids]
        self._num_free += count
        self.slot[ids] = 0
        self.num_finished += count
        self.running = self.running[self.slot[self.running] != 0]
