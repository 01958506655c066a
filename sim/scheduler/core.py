"""The scheduler's state and its step: see the package docstring for the rules."""

from __future__ import annotations

import time

import numpy as np

from stepplan.planner import StepBatch

from ..admission import admission_rank
from ..memory import BlockPool
from ..settings.config import SchedulerConfig
from ..traces import RequestTable
from . import state
from .queue import WaitingQueue
from .state import (
    ADMITTED,
    ARRIVED,
    DECODING,
    EMITS_FIRST,
    FINISHED,
    NEXT_ADMIT,
    NUM_FREE,
    PREEMPTED,
    RESUMED,
    ROWS,
    RUNNING,
    SPEC,
    RequestProgress,
    StepRows,
)
from .step import ScheduledStep, StepMemory

_EMPTY = np.zeros(0, np.int64)


def _counter(index: int, doc: str) -> property:
    """An attribute kept in the shared counters (``state.Counters``)."""

    def get(self: Scheduler) -> int:
        return int(self.counters.values[index])

    def put(self: Scheduler, value: int) -> None:
        self.counters.values[index] = value

    return property(get, put, doc=doc)


class Scheduler(RequestProgress):
    """The scheduler's mutable state over one trace.

    Per-request state lives in ``[N]`` arrays indexed by request id (the table's
    row); the running set is an ``[n], int64`` array of ids in admission order.
    ``pool`` is the memory model (``None``: memory never binds, no slot limit but
    ``config.slots``). ``queue`` orders the new requests waiting by ``config.policy``
    (``None``: first come first served, the arrived requests from :attr:`next_admit` on).
    """

    def __init__(
        self, requests: RequestTable, config: SchedulerConfig, pool: BlockPool | None = None
    ) -> None:
        super().__init__(requests)
        n = requests.num_requests
        self.config = config
        self.pool = pool
        capacity = config.slots if pool is None else pool.layout.slots
        self.slot_capacity = capacity
        most = max(1, min(capacity, config.max_num_seqs, n))  # running requests, at most
        self._running = np.zeros(most, np.int64)  # the first counters[RUNNING], in admission order
        self._resumed = np.zeros(max(1, n), np.int64)  # preempted, front of the queue first
        self._free_slots = np.arange(capacity, 0, -1, dtype=np.int32)  # a stack, top at end
        self._num_free = capacity
        self.rows = StepRows(most)  # the step being run
        self.native = None  # the compiled stepper, where run.py attaches one
        rank = admission_rank(requests, config.policy)
        limit = config.policy_age_limit_s
        self.queue = None
        if rank is not None:
            age_limit = np.inf if limit is None else float(limit)
            self.queue = WaitingQueue(self.arrival, rank, age_limit, self.counters.values)

    next_admit = _counter(NEXT_ADMIT, "First request never admitted (by arrival).")
    _admitted = _counter(ADMITTED, "New requests admitted so far.")
    num_finished = _counter(FINISHED, "Requests finished.")
    _num_free = _counter(NUM_FREE, "Free slots (the top of ``_free_slots``).")
    _arrived = _counter(ARRIVED, "Requests arrived by the current step.")
    _preempted = _counter(PREEMPTED, "Preemptions while scheduling the current step.")

    @property
    def running(self) -> np.ndarray:
        """``[n], int64`` running requests in admission order (a view)."""
        return self._running[: self.counters.values[RUNNING]]

    @running.setter
    def running(self, ids: np.ndarray) -> None:
        self._running[: ids.size] = ids
        self.counters.values[RUNNING] = ids.size

    @property
    def resumed(self) -> list[int]:
        """Preempted requests waiting, front of the queue first."""
        return self._resumed[: self.counters.values[RESUMED]].tolist()

    def _resume_first(self, request: int) -> None:
        count = int(self.counters.values[RESUMED])
        self._resumed[1 : count + 1] = self._resumed[:count].copy()
        self._resumed[0] = request
        self.counters.values[RESUMED] = count + 1

    def _pop_resumed(self) -> None:
        count = int(self.counters.values[RESUMED])
        self._resumed[: count - 1] = self._resumed[1:count].copy()
        self.counters.values[RESUMED] = count - 1

    @property
    def done(self) -> bool:
        """Every request has finished."""
        return self.counters.values[FINISHED] == self.prompt.shape[0]

    def next_arrival_s(self) -> float:
        """Arrival of the first request never admitted (``inf`` when none is left, or
        when a preempted request waits: it never waits on an arrival)."""
        first = self.next_admit if self.queue is None else self.queue.oldest(self.arrival.size)
        if first >= self.arrival.size or self.counters.values[RESUMED]:
            return np.inf
        return float(self.arrival[first])

    def schedule(self, now_s: float) -> ScheduledStep | None:
        """The next step at time ``now_s``, or ``None`` when nothing can run."""
        if self.schedule_rows(now_s) is None:
            return None
        return self.scheduled_step()

    def schedule_rows(self, now_s: float) -> tuple[int, int, float] | None:
        """Schedule the next step at ``now_s`` into :attr:`rows`: ``(rows, kv_tokens,
        attention_pairs)``, or ``None`` when nothing can run. The compiled stepper
        (``sim/stepper.py``) schedules where it is attached, this class elsewhere."""
        native = self.native
        found = self._schedule_rows(now_s) if native is None else native.schedule(now_s)
        if found is not None and self.pool is not None and self.pool.layout.check:
            rows = self.rows
            count = found[0]
            reach = rows.computed[:count].astype(np.int64) + rows.query_lens[:count]
            self._check(rows.ids[:count].copy(), reach)
        return found

    def _schedule_rows(self, now_s: float) -> tuple[int, int, float] | None:
        """:meth:`schedule_rows` in Python: the specification of the compiled stepper."""
        budget = self.config.max_num_batched_tokens
        self._preempted = 0
        if self.pool is not None:
            self.pool.new_step()
        self._arrived = int(np.searchsorted(self.arrival, now_s, side="right"))
        run_ids, run_q, prefilling = self._running_rows(budget)
        if self.pool is not None and self.pool.caching:
            reach = self.computed[run_ids] + run_q
            self.pool.register(run_ids, reach, self.prompt[run_ids], self.emitted[run_ids])
        # as vLLM v1: a step that preempted admits nothing
        used = int(run_q.sum())
        # vLLM pads a request with one token left to 1 + k rows unless a prefill runs
        pad = 0 if prefilling.any() else self.config.num_spec_tokens
        admit_left = budget - used
        new_ids, new_q = (
            (_EMPTY, _EMPTY)
            if self._preempted
            else self._admit(admit_left, now_s, pad, run_ids.size)
        )
        count = run_ids.size + new_ids.size
        self.counters.values[ROWS] = count
        if count == 0:
            return None
        ids = np.concatenate((run_ids, new_ids))
        q = np.concatenate((run_q, new_q))
        computed = self.computed[ids]
        decoding = np.concatenate((~prefilling, np.zeros(new_ids.size, bool)))
        is_spec = decoding if self.config.num_spec_tokens else np.zeros(ids.size, bool)
        emits_first = ~decoding & (computed + q >= self.target[ids])  # > where padded
        flags = (is_spec * SPEC + decoding * DECODING + emits_first * EMITS_FIRST).astype(np.uint8)
        rows = self.rows
        rows.fill(ids, q, computed, flags, self.slot[ids], self.last_accepted[ids])
        rows.info[state.WAITING :] = self._memory().row()
        return count, int(rows.info[state.KV_TOKENS]), float(rows.info[state.ATTENTION_PAIRS])

    def scheduled_step(self) -> ScheduledStep:
        """The step in :attr:`rows` as a :class:`ScheduledStep` of its own arrays, with the
        planner's ``StepBatch`` (its construction timed)."""
        rows, count = self.rows, int(self.counters.values[ROWS])
        groups = self.config.num_groups
        slots = rows.slots[:count].copy()
        start = time.perf_counter_ns()
        batch = StepBatch(
            query_lens=rows.query_lens[:count],
            num_computed_tokens=rows.computed[:count],
            slots=slots if groups == 1 else np.broadcast_to(slots, (groups, slots.size)),
            num_draft_tokens=rows.drafts[:count],
            num_accepted_tokens=rows.accepted[:count],
        )
        batch_ns = time.perf_counter_ns() - start
        flags, info = rows.flags[:count], rows.info
        waiting, preempted, used, cached = (int(v) for v in info[state.WAITING : state.USAGE])
        return ScheduledStep(
            batch=batch,
            request_ids=rows.ids[:count].copy(),
            is_spec=(flags & SPEC) != 0,
            emits_first=(flags & EMITS_FIRST) != 0,
            decoding=(flags & DECODING) != 0,
            kv_tokens=int(info[state.KV_TOKENS]),
            attention_pairs=float(info[state.ATTENTION_PAIRS]),
            batch_ns=batch_ns,
            memory=StepMemory(waiting, preempted, used, cached, float(info[state.USAGE])),
        )

    def _running_rows(self, budget: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Running requests that get tokens this step, their ``q``, and which prefill."""
        run = self.running
        if run.size == 0:
            return run, run, np.zeros(0, bool)
        computed, target = self.computed[run], self.target[run]
        prefilling = computed < target
        lookahead = np.minimum(
            self.config.num_spec_tokens, self.output[run] - self.emitted[run] - 1
        )
        want = np.where(prefilling, target - computed, 1 + lookahead)
        if self.pool is not None and self.pool.align:
            keep = self.pool.aligned_wants(run, want, prefilling, computed, target, budget)
        elif (ends := np.cumsum(want))[-1] > budget:
            want = np.clip(budget - (ends - want), 0, want)
            keep = want > 0
        else:
            keep = None
        if keep is not None:
            run, want, prefilling, computed = (
                run[keep],
                want[keep],
                prefilling[keep],
                computed[keep],
            )
        if self.pool is None or self.pool.grow_all(run, computed + want):
            return run, want, prefilling
        return self._running_rows_preempting(budget)

    def _running_rows_preempting(self, budget: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_running_rows` one request at a time when the free blocks do not cover
        them all: a request that cannot grow preempts the most recently admitted
        running request, until it fits or has preempted itself."""
        running = self.running.tolist()
        ids, qs, prefilling = [], [], []
        index, left = 0, budget
        while index < len(running) and left > 0:
            request = running[index]
            computed, target = int(self.computed[request]), int(self.target[request])
            if computed < target:
                want = target - computed
            else:
                left_out = int(self.output[request] - self.emitted[request]) - 1
                want = 1 + min(self.config.num_spec_tokens, left_out)
            q = min(want, left)
            if self.pool.align and computed < target:
                q = self.pool.aligned_chunk(request, computed, q, target)
                if q == 0:  # no aligned chunk fits: vLLM goes on to the next request
                    index += 1
                    continue
            if not self._make_room(running, request, computed + q, computed):
                break  # it preempted itself, the last running request
            ids.append(request)
            qs.append(q)
            prefilling.append(computed < target)
            index, left = index + 1, left - q
        self.running = np.array(running, np.int64)
        return np.array(ids, np.int64), np.array(qs, np.int64), np.array(prefilling, bool)

    def _make_room(self, running: list[int], request: int, positions: int, computed: int) -> bool:
        """Grow ``request`` (``computed`` tokens computed) to ``positions``, preempting
        from the end of ``running``; ``False`` when the request itself was preempted."""
        assert self.pool is not None
        while not self.pool.grow(request, positions, computed):
            victim = running.pop()
            self._preempt(victim)
            if victim == request:
                return False
        return True

    def _preempt(self, request: int) -> None:
        """Preempt by recompute (vLLM v1): free the blocks and the slot; the request
        waits at the front of the queue and will compute its prompt and output again."""
        assert self.pool is not None
        self.pool.release(np.array([request], np.int64))
        self._free_slots[self._num_free] = self.slot[request]
        self._num_free += 1
        self.slot[request] = 0
        self.lost[request] = self.computed[request]
        self.computed[request] = 0
        self.target[request] = self.prompt[request] + self.emitted[request]
        self.last_accepted[request] = 1
        self.preemptions[request] += 1
        self._preempted += 1
        self._resume_first(request)

    def _admit(
        self, budget: int, now_s: float, pad: int, running_rows: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Waiting requests admitted this step (taking slots) and their first chunk.
        ``pad``: placeholder drafts given to a request with one token left to compute
        when ``running_rows`` run or a prefix hit started it (vLLM keeps its full CUDA
        graph so); it is not admitted unless ``1 + pad`` tokens of budget are left."""
        room = min(self.config.max_num_seqs - self.running.size, self._num_free)
        if room <= 0 or budget <= 0:
            return _EMPTY, _EMPTY
        each = self.counters.values[RESUMED] or self.queue is not None or self.takes_preloaded
        if each or (self.pool is not None and self.pool.caching):
            return self._admit_each(room, budget, now_s, pad, running_rows)
        first = self.next_admit
        room = min(room, self._arrived - first)
        if room <= 0:
            return _EMPTY, _EMPTY
        prompt = self.prompt[first : first + room]
        padded = prompt == 1 if pad and running_rows else None
        want = prompt if padded is None else np.where(padded, 1 + pad, prompt)
        starts = np.cumsum(want) - want
        count = int(np.searchsorted(starts, budget, side="left"))
        if padded is not None:
            short = np.flatnonzero(padded[:count] & (starts[:count] + want[:count] > budget))
            count = int(short[0]) if short.size else count
        ids = np.arange(first, first + count, dtype=np.int64)
        chunk = np.minimum(want[:count], budget - starts[:count])
        if self.pool is not None and count:
            count = self.pool.admit_all(ids, chunk, np.maximum(prompt[:count], chunk))
            ids, chunk = ids[:count], chunk[:count]
        self.next_admit = first + count
        self._admitted += count
        self._start(ids)
        return ids, chunk

    def _admit_each(
        self, room: int, budget: int, now_s: float, pad: int, running_rows: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_admit` one request at a time: preempted requests first, then new
        ones in the policy's order, each starting after its prefix-cache hit, until one
        does not fit."""
        ids, chunks = [], []
        queue = self.queue
        while room > 0 and budget > 0:
            resumed = self.counters.values[RESUMED]
            if resumed:
                request = int(self._resumed[0])
            elif queue is not None:
                request = queue.first(now_s, self._arrived)
                if request < 0:
                    break
            elif self.next_admit < self._arrived:
                request = self.next_admit
            else:
                break
            target = int(self.target[request])
            hits = self.pool.lookup(request, target) if self.pool is not None else []
            hit = len(hits) * (self.pool.layout.entry_tokens if hits else 0)
            start = max(hit, int(self.preloaded[request]))
            q = target - start
            if q == 1 and pad and (running_rows or start):
                if 1 + pad > budget:
                    break
                q += pad
            q = min(q, budget)
            if self.pool is not None and self.pool.align:
                padded = bool(pad) and q == 1 + pad and q > target - start
                q = self.pool.aligned_chunk(request, start, q, target)
                if q == 0:
                    break
                if padded and q != 1 + pad:  # vLLM drops the placeholders it would cut
                    q = 1
            if self.pool is not None:
                if not self.pool.admit(request, hits, start + q, target):
                    break
                one = np.array([request])
                self.pool.register(one, np.array([start + q]), self.prompt[one], self.emitted[one])
            if resumed:
                self._pop_resumed()
            elif queue is not None:
                queue.take(request)
            else:
                self.next_admit += 1
                self._admitted += 1
            lost = int(self.lost[request])
            self.recomputed[request] += max(0, lost - start)
            self.cached[request] += max(0, hit - lost)
            self.computed[request] = start
            self.preloaded[request] = 0  # preempted, it computes its state here
            ids.append(request)
            chunks.append(q)
            room, budget = room - 1, budget - q
        admitted = np.array(ids, np.int64)
        self._start(admitted)
        return admitted, np.array(chunks, np.int64)

    def _start(self, ids: np.ndarray) -> None:
        count = ids.size
        self._num_free -= count
        self.slot[ids] = self._free_slots[self._num_free : self._num_free + count][::-1]
        self.running = np.concatenate((self.running, ids))

    def _memory(self) -> StepMemory:
        waiting = self._arrived - self._admitted + int(self.counters.values[RESUMED])
        pool = self.pool
        if pool is None:
            return StepMemory(waiting, 0, 0, 0, 0.0)
        cached = pool.cached_blocks
        used = pool.capacity - pool.free - cached  # pool.used_blocks, without a second lookup
        return StepMemory(waiting, self._preempted, used, cached, used / pool.capacity)

    def _check(self, ids: np.ndarray, positions: np.ndarray) -> None:
        """``memory.check``: blocks and slots are accounted for (``ids`` and
        ``positions``: ``[R], int64`` the step's rows and the positions they reach)."""
        assert self.pool is not None
        running = self.running
        covered = self.computed.copy()  # a running request not in the step covers its state
        covered[ids] = positions
        self.pool.check(running, covered[running])
        # a padded row's placeholder drafts are positions no token is computed at
        target = self.target[ids]
        real = np.where(self.computed[ids] < target, np.minimum(positions, target), positions)
        assert (real <= self.prompt[ids] + self.output[ids] - 1).all(), "past the last token"
        slots = self.slot[running]
        assert (slots > 0).all() and np.unique(slots).size == slots.size, "slots shared"
        assert self._num_free + running.size == self.slot_capacity, "slots leaked"
        assert np.count_nonzero(self.slot) == running.size, "a slot held by a waiting request"

    def commit(self, step: ScheduledStep, accepted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Apply a step's outcome; ``accepted`` is ``[R], int64`` accepted drafts per row
        (0 on rows that are not spec). Returns ``(emitted [R] int64, finished [R] bool)``."""
        q = step.batch.query_lens
        return self._commit(
            step.request_ids, q, step.is_spec, step.decoding, step.emits_first, accepted
        )

    def commit_rows(self, accepted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`commit` of the step in :attr:`rows`."""
        rows, count = self.rows, int(self.counters.values[ROWS])
        flags = rows.flags[:count]
        return self._commit(
            rows.ids[:count].copy(),
            rows.query_lens[:count],
            (flags & SPEC) != 0,
            (flags & DECODING) != 0,
            (flags & EMITS_FIRST) != 0,
            accepted,
        )

    def _commit(
        self,
        ids: np.ndarray,
        q: np.ndarray,
        spec: np.ndarray,
        decoding: np.ndarray,
        emits_first: np.ndarray,
        accepted: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        reach = self.computed[ids] + np.where(spec, 1 + accepted, q)
        # a prefill row padded with placeholder drafts computes its last prompt token only
        self.computed[ids] = np.where(decoding, reach, np.minimum(reach, self.target[ids]))
        emitted = np.where(decoding, 1 + accepted, emits_first)
        self.emitted[ids] += emitted
        if self.config.num_spec_tokens and self.pool is not None and self.pool.caching:
            # vLLM caches an emitting row's blocks again after its output where drafts run
            # (accepted drafts fill blocks its allocation could not cache), before it frees
            # a finished request
            emitting = ids[emitted > 0]
            self.pool.cache_committed(emitting, self.computed[emitting])
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
        if self.pool is not None:
            self.pool.release(ids)
        self.num_finished += count
        self.running = self.running[self.slot[self.running] != 0]

    def memory_columns(self) -> dict[str, np.ndarray]:
        """``requests.csv``'s memory columns, ``[N], int64`` each."""
        return {
            "num_preemptions": self.preemptions,
            "recomputed_tokens": self.recomputed,
            "cached_tokens": self.cached,
        }
