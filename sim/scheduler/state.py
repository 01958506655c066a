"""The scheduler's state laid out for the compiled stepper: preallocated arrays updated in
place, so the Python scheduler (``core.py``, the specification) and the C stepper
(``sim/csrc/``) work on the same memory and either may run any step.

Scalars live in one ``int64`` array (:class:`Counters`) rather than in attributes: a
C function reads and writes them where Python would have to be called back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..traces import RequestTable

#: Indices of :attr:`Counters.values`: running requests, the first request never admitted,
#: finished requests, free slots, requests arrived by the step, preemptions while
#: scheduling the step, preempted requests waiting, the step's rows, new requests admitted,
#: and a policy's waiting queue (``queue.py``): its heap's size, the requests pushed.
RUNNING, NEXT_ADMIT, FINISHED, NUM_FREE, ARRIVED, PREEMPTED, RESUMED, ROWS = range(8)
ADMITTED, QUEUED, PUSHED = range(8, 11)
NUM_COUNTERS = 11

#: Bits of :attr:`StepRows.flags`.
SPEC, DECODING, EMITS_FIRST = 1, 2, 4
#: Fields of :attr:`StepRows.info`: the step's load and its memory row (``StepMemory``).
KV_TOKENS, ATTENTION_PAIRS, WAITING, NUM_PREEMPTED, USED, CACHED, USAGE = range(7)


class Counters:
    """The scheduler's scalars, ``values``: ``[NUM_COUNTERS], int64``."""

    def __init__(self) -> None:
        self.values = np.zeros(NUM_COUNTERS, np.int64)


class RequestProgress:
    """Per-request arrays every scheduler implementation keeps (``[num_requests]`` each;
    the loop, the stepper and the results read them by these names), and its counters."""

    def __init__(self, requests: RequestTable) -> None:
        n = requests.num_requests
        self.arrival = requests.arrival_s
        self.prompt = requests.prompt_tokens
        self.output = requests.output_tokens
        self.target = np.array(requests.prompt_tokens, np.int64)  # tokens before decoding
        self.computed = np.zeros(n, np.int64)  # tokens committed to state
        self.emitted = np.zeros(n, np.int64)  # output tokens produced
        self.slot = np.zeros(n, np.int32)  # 0 while not running
        self.last_accepted = np.ones(n, np.int32)  # num_accepted_tokens of the next spec row
        self.spec_steps = np.zeros(n, np.int64)
        self.preemptions = np.zeros(n, np.int64)
        self.recomputed = np.zeros(n, np.int64)  # lost tokens computed again
        self.cached = np.zeros(n, np.int64)  # tokens the prefix cache saved
        self.lost = np.zeros(n, np.int64)  # computed tokens at the last preemption
        # prompt tokens whose state another engine computed (a disaggregated prefill),
        # taken at the first admission as a prefix hit is, where ``takes_preloaded``
        self.preloaded = np.zeros(n, np.int64)
        self.takes_preloaded = False
        self.counters = Counters()


class StepRows:
    """The scheduled step's rows, written by whichever scheduler ran it (``[capacity]``
    arrays; the step's rows are the first ``rows``).

    Attributes:
        ids: ``int64`` request of every row, in the engine's order.
        query_lens, computed, slots, drafts, accepted: ``int32`` the ``StepBatch``
            inputs (``num_draft_tokens`` ``-1`` off the spec rows, ``num_accepted_tokens``
            1 there).
        flags: ``uint8`` :data:`SPEC`, :data:`DECODING`, :data:`EMITS_FIRST` bits.
        drawn: ``int64`` accepted drafts of each row once drawn (0 off the spec rows).
        info: ``[7], float64`` the load and memory figures (:data:`KV_TOKENS`, ...).
    """

    def __init__(self, capacity: int) -> None:
        capacity = max(1, capacity)
        self.ids = np.zeros(capacity, np.int64)
        self.query_lens = np.zeros(capacity, np.int32)
        self.computed = np.zeros(capacity, np.int32)
        self.slots = np.zeros(capacity, np.int32)
        self.drafts = np.zeros(capacity, np.int32)
        self.accepted = np.zeros(capacity, np.int32)
        self.flags = np.zeros(capacity, np.uint8)
        self.drawn = np.zeros(capacity, np.int64)
        self.info = np.zeros(7, np.float64)

    def fill(
        self,
        ids: np.ndarray,
        q: np.ndarray,
        computed: np.ndarray,
        flags: np.ndarray,
        slots: np.ndarray,
        accepted: np.ndarray,
    ) -> None:
        """Write ``R`` rows (``int64`` ``ids``, ``q``, ``computed``; ``uint8`` ``flags``;
        ``slots`` and the spec rows' ``accepted`` counts, ``int32``)."""
        count = ids.size
        spec = (flags & SPEC) != 0
        self.ids[:count] = ids
        self.query_lens[:count] = q
        self.computed[:count] = computed
        self.slots[:count] = slots
        self.drafts[:count] = np.where(spec, q - 1, -1)
        self.accepted[:count] = np.where(spec, accepted, 1)
        self.flags[:count] = flags
        self.info[KV_TOKENS] = int(computed.sum() + q.sum())
        self.info[ATTENTION_PAIRS] = float(q @ computed + 0.5 * (q @ (q + 1)))

    def fill_lists(
        self,
        ids: list[int],
        q: list[int],
        computed: list[int],
        flags: list[int],
        slots: list[int],
        accepted: list[int],
    ) -> tuple[int, float]:
        """:meth:`fill` from Python lists of ``R`` rows (a scheduler that holds its rows
        as Python numbers: for a few rows a loop costs less than array operations);
        returns the step's KV tokens and attention pairs."""
        count = len(ids)
        drafts, spec_accepted = [], []
        kv_tokens = pairs = squares = 0
        for tokens, start, flag, drawn in zip(q, computed, flags, accepted, strict=True):
            spec = flag & SPEC
            drafts.append(tokens - 1 if spec else -1)
            spec_accepted.append(drawn if spec else 1)
            kv_tokens += start + tokens
            pairs += tokens * start
            squares += tokens * (tokens + 1)
        self.ids[:count] = ids
        self.query_lens[:count] = q
        self.computed[:count] = computed
        self.slots[:count] = slots
        self.drafts[:count] = drafts
        self.accepted[:count] = spec_accepted
        self.flags[:count] = flags
        attention_pairs = pairs + 0.5 * squares
        self.info[KV_TOKENS] = kv_tokens
        self.info[ATTENTION_PAIRS] = attention_pairs
        return kv_tokens, attention_pairs
