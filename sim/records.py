"""What the simulation loop records: per-request accumulators, and the per-step and
per-request columns of a :class:`~.results.SimResult` built from them (named and
typed in ``schema.py``)."""

from __future__ import annotations

import numpy as np

from .schema import (
    COST_COLUMNS,
    FLOAT,
    GRAPH_KINDS,
    KIND_ROWS,
    KIND_TOKENS,
    MEMORY_COLUMNS,
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


class StepTable:
    """The loop's per-step records: row ``i`` of ``array`` (``[capacity,
    len(STEP_RECORD)], float64``, grown by :meth:`grow`) is step ``i`` in
    ``STEP_RECORD`` order, for the first ``size[0]`` steps; the compiled stepper writes
    rows in place too."""

    def __init__(self, capacity: int = 4096) -> None:
        self.array = np.zeros((capacity, len(STEP_RECORD)), np.float64)
        self.size = np.zeros(1, np.int64)

    def __len__(self) -> int:
        return int(self.size[0])

    def grow(self) -> None:
        """Room for at least one more step."""
        count = len(self)
        if count == self.array.shape[0]:
            array = np.zeros((2 * count, len(STEP_RECORD)), np.float64)
            array[:count] = self.array
            self.array = array

    def append(self, record: tuple[float, ...]) -> None:
        """One step's record (``STEP_RECORD`` order)."""
        self.grow()
        count = len(self)
        self.array[count] = record
        self.size[0] = count + 1

    def rows(self) -> np.ndarray:
        """``[num_steps, len(STEP_RECORD)], float64`` the steps so far (a view)."""
        return self.array[: len(self)]


def step_columns(records: np.ndarray) -> dict[str, np.ndarray]:
    """The steps' columns (``schema.STEPS_IN_MEMORY``, in order, ``[num_steps]`` each)
    from the loop's records (``StepTable.rows()``: ``STEP_RECORD`` order)."""
    table = np.asarray(records, dtype=np.float64).reshape(len(records), len(STEP_RECORD))
    columns = {
        name: table[:, i] if name in _FLOAT_RECORD else table[:, i].astype(np.int64)
        for i, name in enumerate(STEP_RECORD)
    }
    code = columns.pop("graph_code")
    columns["step"] = np.arange(len(records), dtype=np.int64)
    columns["num_rows"] = sum(columns[name] for name in KIND_ROWS.values())
    columns["num_tokens"] = sum(columns[name] for name in KIND_TOKENS.values())
    columns["graph_kind"] = np.asarray(GRAPH_KINDS)[code]
    columns["graph_hit"] = (code > 0).astype(np.int64)
    return {name: columns[name] for name in STEPS_IN_MEMORY.names}


def request_columns(
    arrival_s: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    log: RequestLog,
) -> dict[str, np.ndarray]:
    """``requests.csv`` columns (``[N]`` each) from the trace and the log."""
    ttft = log.first_token_s - arrival_s
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (log.finish_s - log.first_token_s) / (output - 1), np.nan)
    return {
        "request_id": np.arange(arrival_s.size, dtype=np.int64),
        "arrival_s": arrival_s,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "first_token_s": log.first_token_s,
        "finish_s": log.finish_s,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": log.finish_s - arrival_s,
        "num_steps": log.num_steps,
        "accepted_tokens": log.accepted,
        "drafted_tokens": log.drafted,
    }
