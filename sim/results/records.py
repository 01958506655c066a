"""What the simulation loop records: per-request accumulators, the steps in chunks of
:data:`CHUNK_STEPS` handed on as they fill (to memory, or to a results folder's files:
memory independent of the step count), and the per-step and per-request columns built
from them (named and typed in ``schema.py``)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import attrs
import numpy as np

from .schema import (
    COST_COLUMNS,
    FLOAT,
    GRAPH_KINDS,
    KIND_ROWS,
    KIND_TOKENS,
    MEMORY_COLUMNS,
    REQUESTS,
    STEPS_IN_MEMORY,
)

#: The loop's per-step record, in order (``run._record``, then ``StepMemory.row()``):
#: the recorded columns of the steps, ``graph_kind`` as its index in ``GRAPH_KINDS``.
STEP_RECORD = (
    "start_s",
    "duration_s",
    *KIND_ROWS.values(),
    *KIND_TOKENS.values(),
    "graph_code",
    "graph_tokens",
    "graph_rows",
    "padded_tokens",
    "padded_rows",
    "plan_us",
    *(column.name for column in COST_COLUMNS),
    *(column.name for column in MEMORY_COLUMNS),
)
#: Record fields kept as floats (the rest become int64).
_FLOAT_RECORD = frozenset(c.name for c in STEPS_IN_MEMORY.columns if c.dtype == FLOAT)
#: Steps a :class:`StepTable` holds before it hands them on: what is left to write when
#: a run stops is at most this many steps and the requests they finished.
CHUNK_STEPS = 1 << 13
#: What takes a full chunk: ``(records, first)``, ``[k, len(STEP_RECORD)], float64`` rows
#: in ``STEP_RECORD`` order (a view, valid during the call) and the first one's step.
StepSink = Callable[[np.ndarray, int], None]


class RequestLog:
    """Per-request accumulators the loop updates after every step.

    Arrays are ``[N]``: ``first_token_s``, ``finish_s``, ``last_emit_s`` (float64,
    NaN until set), ``num_steps``, ``drafted``, ``accepted`` (int64). The inter-token gaps
    fill ``gaps`` (``[capacity], float64``, grown by :meth:`grow`) in the order they
    occur, the first ``size[0]`` of them (:attr:`itl_s`); the compiled stepper writes
    them in place too.
    """

    def __init__(self, num_requests: int) -> None:
        self.first_token_s = np.full(num_requests, np.nan)
        self.finish_s = np.full(num_requests, np.nan)
        self.last_emit_s = np.full(num_requests, np.nan)
        self.num_steps = np.zeros(num_requests, np.int64)
        self.drafted = np.zeros(num_requests, np.int64)
        self.accepted = np.zeros(num_requests, np.int64)
        self.gaps = np.zeros(max(1024, num_requests), np.float64)
        self.size = np.zeros(1, np.int64)

    @property
    def itl_s(self) -> np.ndarray:
        """``[k], float64`` every inter-token gap so far (a copy)."""
        return self.gaps[: self.size[0]].copy()

    def grow(self, more: int) -> None:
        """Room for ``more`` gaps past those recorded."""
        need = int(self.size[0]) + more
        if need > self.gaps.size:
            gaps = np.zeros(max(need, 2 * self.gaps.size), np.float64)
            gaps[: self.size[0]] = self.gaps[: self.size[0]]
            self.gaps = gaps

    def record(
        self,
        ids: np.ndarray,
        emitted: np.ndarray,
        finished: np.ndarray,
        end_s: float,
    ) -> None:
        """One step's rows: ``ids``, ``emitted`` (``[R], int64``), ``finished`` (``[R], bool``)."""
        self.num_steps[ids] += 1
        emitting = ids[emitted > 0]
        last = self.last_emit_s[emitting]
        seen = ~np.isnan(last)
        if seen.any():
            gaps = end_s - last[seen]
            self.grow(gaps.size)
            size = int(self.size[0])
            self.gaps[size : size + gaps.size] = gaps
            self.size[0] = size + gaps.size
        if not seen.all():
            self.first_token_s[emitting[~seen]] = end_s
        self.last_emit_s[emitting] = end_s
        if finished.any():
            self.finish_s[ids[finished]] = end_s

    def record_spec(self, ids: np.ndarray, drafts: np.ndarray, accepted: np.ndarray) -> None:
        """Spec rows' drafts and accepted drafts (``[S], int64`` each)."""
        self.drafted[ids] += drafts
        self.accepted[ids] += accepted

    def record_rows(
        self, ids: list[int], emitted: list[int], finished: list[bool], end_s: float
    ) -> None:
        """:meth:`record` for a few rows given as lists, element by element (array
        operations cost more than that for a few rows; ``tests/test_records.py`` holds
        the two equal). Requests are distinct, as in a step."""
        num_steps, last_emit_s = self.num_steps, self.last_emit_s
        gaps: list[float] = []
        for request, count, done in zip(ids, emitted, finished, strict=True):
            num_steps[request] += 1
            if count > 0:
                last = float(last_emit_s[request])
                if last == last:  # not NaN: emitted before
                    gaps.append(end_s - last)
                else:
                    self.first_token_s[request] = end_s
                last_emit_s[request] = end_s
            if done:
                self.finish_s[request] = end_s
        if gaps:
            self.grow(len(gaps))
            size = int(self.size[0])
            self.gaps[size : size + len(gaps)] = gaps
            self.size[0] = size + len(gaps)

    def record_spec_rows(self, ids: list[int], drafts: list[int], accepted: list[int]) -> None:
        """:meth:`record_spec` for a few rows given as lists."""
        for request, count, taken in zip(ids, drafts, accepted, strict=True):
            self.drafted[request] += count
            self.accepted[request] += taken


class StepTable:
    """The loop's per-step records, a chunk at a time: row ``i`` of ``array``
    (``[capacity, len(STEP_RECORD)], float64``) is step ``flushed + i`` in ``STEP_RECORD``
    order, for the first ``size[0]`` rows; the compiled stepper writes rows in place too.
    A full chunk, and the last one at :meth:`flush`, goes to ``sink``."""

    def __init__(self, sink: StepSink, capacity: int | None = None) -> None:
        capacity = CHUNK_STEPS if capacity is None else capacity  # read now: tests shrink it
        self.array = np.zeros((capacity, len(STEP_RECORD)), np.float64)
        self.size = np.zeros(1, np.int64)
        self.flushed = 0
        self._sink = sink

    def __len__(self) -> int:
        """Steps recorded so far, handed on or not."""
        return self.flushed + int(self.size[0])

    def grow(self) -> None:
        """Room for at least one more step: a full chunk is handed on."""
        if int(self.size[0]) == self.array.shape[0]:
            self.flush()

    def append(self, record: tuple[float, ...]) -> None:
        """One step's record (``STEP_RECORD`` order)."""
        self.grow()
        count = int(self.size[0])
        self.array[count] = record
        self.size[0] = count + 1

    def flush(self) -> None:
        """Hand the steps held to the sink (the loop's end calls it for the last ones)."""
        count = int(self.size[0])
        if count:
            self._sink(self.array[:count], self.flushed)
            self.flushed += count
            self.size[0] = 0


def step_columns(records: np.ndarray, first: int = 0) -> dict[str, np.ndarray]:
    """The steps' columns (``schema.STEPS_IN_MEMORY``, in order, ``[k]`` each) from the
    loop's records (``[k, len(STEP_RECORD)]``, ``STEP_RECORD`` order), the first of them
    step ``first``."""
    table = np.asarray(records, dtype=np.float64).reshape(len(records), len(STEP_RECORD))
    columns = {
        name: table[:, i] if name in _FLOAT_RECORD else table[:, i].astype(np.int64)
        for i, name in enumerate(STEP_RECORD)
    }
    code = columns.pop("graph_code")
    columns["step"] = np.arange(first, first + len(records), dtype=np.int64)
    columns["num_rows"] = sum(columns[name] for name in KIND_ROWS.values())
    columns["num_tokens"] = sum(columns[name] for name in KIND_TOKENS.values())
    columns["graph_kind"] = np.asarray(GRAPH_KINDS)[code]
    columns["graph_hit"] = (code > 0).astype(np.int64)
    return {name: columns[name] for name in STEPS_IN_MEMORY.names}


#: ``requests.csv``'s first columns: the trace's, known before the run.
TRACE_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens")
_REQUEST_ORDER = REQUESTS.names


@attrs.frozen(eq=False)
class RequestRows:
    """``requests.csv``'s rows of a run, made on demand from its arrays: the trace's
    ``arrival_s``, ``prompt``, ``output`` (``[N]`` each), the :class:`RequestLog` and the
    scheduler's memory columns. A finished request's row is final; the columns after
    :data:`TRACE_COLUMNS` are the run's, at their first value (NaN, 0) in the row of a
    request the run never scheduled."""

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    log: RequestLog
    memory: Mapping[str, np.ndarray]

    @property
    def count(self) -> int:
        """``N``."""
        return int(self.arrival_s.size)

    def first_unfinished(self, start: int) -> int:
        """The first request from ``start`` on that has not finished (``N``: none)."""
        unfinished = np.flatnonzero(np.isnan(self.log.finish_s[start:]))
        return start + int(unfinished[0]) if unfinished.size else self.count

    def stored(self) -> dict[str, np.ndarray]:
        """The columns the run keeps as arrays (``[N]`` each, views): what sums over
        every request read."""
        log = self.log
        return {
            "arrival_s": self.arrival_s,
            "prompt_tokens": self.prompt,
            "output_tokens": self.output,
            "first_token_s": log.first_token_s,
            "finish_s": log.finish_s,
            "num_steps": log.num_steps,
            "accepted_tokens": log.accepted,
            "drafted_tokens": log.drafted,
            **self.memory,
        }

    def columns(
        self,
        start: int = 0,
        stop: int | None = None,
        *,
        where: np.ndarray | None = None,
        names: Collection[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """The columns of rows ``start:stop`` (``[stop - start]`` each; ``where``: only
        the rows it marks), in ``schema.REQUESTS``'s order; ``names``: only those."""
        rows = slice(start, self.count if stop is None else stop)
        wanted = _REQUEST_ORDER if names is None else [n for n in _REQUEST_ORDER if n in names]
        derived = set(_DERIVED) & set(wanted)
        reads = set(wanted) | ({"arrival_s", "output_tokens", "first_token_s", "finish_s"}
                               if derived else set())  # fmt: skip
        picked = {}
        for name, values in self.stored().items():
            if name in reads:
                picked[name] = values[rows] if where is None else values[rows][where]
        if derived:
            picked.update(_derived(picked))
        if "request_id" in wanted:
            ids = np.arange(rows.start, rows.stop, dtype=np.int64)
            picked["request_id"] = ids if where is None else ids[where]
        return {name: picked[name] for name in wanted}


#: The columns :meth:`RequestRows.columns` computes from the stored ones (and the ids).
_DERIVED = ("ttft_s", "tpot_s", "e2e_s")


def _derived(stored: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    arrival, output = stored["arrival_s"], stored["output_tokens"]
    first, finish = stored["first_token_s"], stored["finish_s"]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (finish - first) / (output - 1), np.nan)
    return {"ttft_s": first - arrival, "tpot_s": tpot, "e2e_s": finish - arrival}
