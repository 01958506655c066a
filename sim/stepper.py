"""A step after it is planned and timed: its drafts' acceptance, the scheduler's commit,
the request log and the step's record -- on the compiled stepper where it is built.

The compiled stepper (the optional C extension ``stepplan.sim._stepper``, ``sim/csrc/``,
built by ``pip install`` like the planner's packer) works on the very arrays of the
scheduler (``scheduler/state.py``), the block pool, the :class:`~.records.RequestLog` and
the :class:`~.records.StepTable`, the prefix cache's dicts included: it schedules
every step (preemptions, evictions and prefix-cache hits too) and finishes it, drawing
with the acceptance models of ``acceptance.py`` (a model of the caller's is drawn in
Python, the rest of that step then finished in Python too). The Python code is the
specification: without the extension it runs every step, with the same results byte
for byte (``tests/test_stepper.py``).
"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from stepplan.planner.native import source_digest

from .acceptance import (
    AcceptanceModel,
    FixedLength,
    PerPosition,
    Replay,
    draw_rows,
    uniform_key,
)
from .memory import ALIGNED_KEY_SCALE, COPY
from .results.records import RequestLog, StepTable
from .scheduler import Scheduler
from .scheduler.state import ROWS, SPEC, WAITING
from .state_blocks import GROUP, STATE

SOURCES = Path(__file__).with_name("csrc")
_MODULE = "stepplan.sim._stepper"
_DONE, _PYTHON, _GROW = 0, 1, 2  # the compiled finish's answers
_PYTHON_DRAW, _PER_POSITION, _FIXED, _REPLAY = 0, 1, 2, 3  # acceptance kinds it knows
_PYTHON_COST = "several times the compiled stepper's time per step; pip install -e . builds it"


def load_stepper() -> ModuleType | None:
    """The compiled stepper's module, or ``None`` where it is not installed or was built
    from other sources than those beside this file (then Python runs every step)."""
    return _stepper_module()[0]


def _stepper_module() -> tuple[ModuleType | None, str]:
    """The module, or ``None`` and why not."""
    try:
        module = importlib.import_module(_MODULE)
    except ImportError as error:
        return None, f"{_MODULE} is not installed ({error})"
    if SOURCES.is_dir() and getattr(module, "SOURCE_DIGEST", None) != source_digest(SOURCES):
        return None, f"{module.__file__} was built from other C sources than {SOURCES} holds"
    return module, ""


class Stepper:
    """Finishes the steps of one simulation (see the module docstring).

    Args:
        native: ``None`` uses the compiled stepper where it is installed; ``False``
            runs every step in Python; ``True`` requires the compiled one.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        acceptance: AcceptanceModel,
        log: RequestLog,
        table: StepTable,
        *,
        native: bool | None = None,
    ) -> None:
        self.scheduler, self.acceptance, self.log, self.table = scheduler, acceptance, log, table
        self._module, why = (None, "") if native is False else _stepper_module()
        if self._module is None and native is not False:
            if native:
                raise RuntimeError(f"{why}; reinstall stepplan (pip install -e .)")
            message = f"stepplan.sim steps in Python ({_PYTHON_COST}): {why}"
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        self._compiled: Any = None
        # a scheduler holding its step's rows as Python numbers (the vLLM scheduler, a
        # few rows a step) is finished with lists, where array operations cost more
        self._listed = hasattr(scheduler, "commit_listed")
        self._bind()

    @property
    def native(self) -> bool:
        """Whether the compiled stepper runs the steps it covers."""
        return self._compiled is not None

    def _bind(self) -> None:
        """(Re)bind the compiled stepper to the arrays (after a buffer grew)."""
        if self._module is not None:
            self._compiled = self._module.Stepper(self._fields())
            self.scheduler.native = self._compiled

    def finish(
        self, end_s: float, record: tuple[float, ...], accepted: np.ndarray | None = None
    ) -> None:
        """Finish the step in ``scheduler.rows``, which ends at ``end_s``: ``record`` is
        its ``steps.csv`` record up to the memory row (``records.STEP_RECORD``'s first
        20 fields). ``accepted`` (``[R], int64``) replaces the acceptance model's draw
        (live mode; its spec counts are then logged by the caller)."""
        compiled = self._compiled
        given = accepted is not None
        if compiled is None:
            if self._listed:
                self._finish_listed(end_s, record, accepted)
            else:
                self._finish_python(end_s, record, accepted)
            return
        if given:
            self.scheduler.rows.drawn[: accepted.size] = accepted
        status = compiled.finish(end_s, record, given)
        while status == _GROW:
            self.table.grow()
            self.log.grow(self.scheduler.rows.ids.size)
            self._bind()
            status = self._compiled.finish(end_s, record, given)
        if status == _PYTHON:  # an acceptance model it does not know: nothing done yet
            self._finish_python(end_s, record, accepted)

    def _finish_python(
        self, end_s: float, record: tuple[float, ...], accepted: np.ndarray | None
    ) -> None:
        """:meth:`finish` in Python: its specification."""
        scheduler, rows = self.scheduler, self.scheduler.rows
        count = int(scheduler.counters.values[ROWS])
        ids = rows.ids[:count].copy()
        spec = (rows.flags[:count] & SPEC) != 0
        if accepted is None:
            accepted = np.zeros(count, np.int64)
            if spec.any():
                drafts = rows.drafts[:count][spec].astype(np.int64)
                spec_ids = ids[spec]
                steps = scheduler.spec_steps[spec_ids]
                accepted[spec] = self.acceptance.draw(spec_ids, steps, drafts)
                self.log.record_spec(spec_ids, drafts, accepted[spec])
        rows.drawn[:count] = accepted
        emitted, finished = scheduler.commit_rows(accepted)
        self.log.record(ids, emitted, finished, end_s)
        self.table.append(record + tuple(rows.info[WAITING:].tolist()))

    def _finish_listed(
        self, end_s: float, record: tuple[float, ...], accepted: np.ndarray | None
    ) -> None:
        """:meth:`_finish_python` for a scheduler with ``listed_rows`` and
        ``commit_listed``: the same draws, commit and records, on lists."""
        scheduler, rows = self.scheduler, self.scheduler.rows
        ids, spec_steps = scheduler.listed_rows()
        count = len(ids)
        if accepted is None:
            drawn = [0] * count
            drafts = rows.drafts[:count].tolist()  # -1 off the spec rows
            spec = [row for row in range(count) if drafts[row] >= 0]
            if spec:
                spec_ids = [ids[row] for row in spec]
                spec_drafts = [drafts[row] for row in spec]
                steps = [spec_steps[row] for row in spec]
                taken = draw_rows(self.acceptance, spec_ids, steps, spec_drafts)
                for row, count_taken in zip(spec, taken, strict=True):
                    drawn[row] = count_taken
                self.log.record_spec_rows(spec_ids, spec_drafts, taken)
        else:
            drawn = accepted.tolist()
        rows.drawn[:count] = drawn
        emitted, finished = scheduler.commit_listed(drawn)
        self.log.record_rows(ids, emitted, finished, end_s)
        self.table.append(record + tuple(rows.info[WAITING:].tolist()))

    def _fields(self) -> dict[str, Any]:
        """What the compiled stepper binds to: the arrays by name, and the settings."""
        scheduler, rows, log = self.scheduler, self.scheduler.rows, self.log
        config = scheduler.config
        fields: dict[str, Any] = {
            "arrival": np.ascontiguousarray(scheduler.arrival, np.float64),
            "prompt": np.ascontiguousarray(scheduler.prompt, np.int64),
            "output": np.ascontiguousarray(scheduler.output, np.int64),
            **{
                name: getattr(scheduler, name)
                for name in (
                    "target",
                    "computed",
                    "emitted",
                    "spec_steps",
                    "slot",
                    "lost",
                    "preemptions",
                    "recomputed",
                    "cached",
                    "preloaded",
                )
            },
            "last_accepted": scheduler.last_accepted,
            "counters": scheduler.counters.values,
            "running": scheduler._running,
            "resumed": scheduler._resumed,
            "free_slots": scheduler._free_slots,
            "ids": rows.ids,
            "drawn": rows.drawn,
            "query_lens": rows.query_lens,
            "computed_rows": rows.computed,
            "slots": rows.slots,
            "drafts": rows.drafts,
            "accepted_rows": rows.accepted,
            "flags": rows.flags,
            "info": rows.info,
            **{
                name: getattr(log, name)
                for name in ("first_token_s", "finish_s", "last_emit_s", "num_steps")
            },
            "drafted": log.drafted,
            "accepted": log.accepted,
            "gaps": log.gaps,
            "gaps_size": log.size,
            "table": self.table.array,
            "table_size": self.table.size,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "max_num_seqs": config.max_num_seqs,
            "num_spec_tokens": config.num_spec_tokens,
            "has_pool": int(scheduler.pool is not None),
            "takes_preloaded": int(scheduler.takes_preloaded),
        }
        fields.update(_pool_fields(scheduler))
        fields.update(_queue_fields(scheduler))
        fields.update(_acceptance_fields(self.acceptance, config.num_spec_tokens))
        return fields


def _pool_fields(scheduler: Scheduler) -> dict[str, Any]:
    pool = scheduler.pool
    if pool is None:
        return {}
    layout = pool.layout
    fields = {
        "held": pool.held,
        "hashed": pool.hashed,
        "registered": pool.registered,
        "free_blocks": pool.free_blocks,
        "caching": int(pool.caching),
        "capacity": pool.capacity,
        "block_size": layout.block_size,
        "entry_tokens": layout.entry_tokens,
        "state_blocks": layout.state_blocks,
        "attention_groups": layout.attention_groups,
        "entries_per_hash": layout.entries_per_hash,
        "entry_blocks": layout.entry_blocks,
        "align_tokens": 0,
        "entries": pool.entries,
        "lru": pool.lru,
        "refs": pool.refs,
    }
    if pool.caching:
        fields["prefix_offsets"] = np.ascontiguousarray(pool.prefix_offsets, np.int64)
        fields["hashes"] = np.ascontiguousarray(pool.prefix_hashes, np.int64)
        fields.update(copies=pool.copies, copies_made=pool.copies_made, copy_tag=COPY)
    if pool.align:
        fields["align_tokens"] = pool.align
        fields["prefix_block_tokens"] = layout.prefix_block_tokens
        fields["aligned_key_scale"] = ALIGNED_KEY_SCALE
        fields["kept_states"] = pool.kept_states
        fields["states_this_step"] = pool.states_this_step
        fields["junction"] = pool.junction
        fields["tracks_states"] = int(pool.tracks_states)
    if pool.tracks_states:
        fields.update(
            state_size=layout.state_groups,
            spec_blocks=layout.state_blocks - layout.state_groups,
            states=pool.states,
            state_tags=(GROUP, STATE),
            lru_blocks=pool.lru_blocks,
        )
    return fields


def _queue_fields(scheduler: Scheduler) -> dict[str, Any]:
    """The admission policy's waiting queue (``ordered`` 0: arrival order, none)."""
    queue = scheduler.queue
    if queue is None:
        return {"ordered": 0}
    return {
        "ordered": 1,
        "rank": queue.rank,
        "heap": queue.heap,
        "admitted": queue.admitted,
        "age_limit_s": float(queue.age_limit_s),
    }


def _acceptance_fields(model: AcceptanceModel, num_spec_tokens: int) -> dict[str, Any]:
    """The acceptance model as the compiled stepper draws it (``accept_kind`` 0: it
    does not, and Python draws)."""
    if type(model) is PerPosition:
        survival = model.survival(max(1, num_spec_tokens))
        return {"accept_kind": _PER_POSITION, "key": uniform_key(model.seed), "survival": survival}
    if type(model) is FixedLength:
        whole, fraction = divmod(max(model.length - 1.0, 0.0), 1.0)
        return {
            "accept_kind": _FIXED,
            "key": uniform_key(model.seed),
            "whole": int(whole),
            "fraction": fraction,
        }
    if type(model) is Replay:
        return {
            "accept_kind": _REPLAY,
            "key": 0,
            "offsets": np.ascontiguousarray(model.offsets, np.int64),
            "values": np.ascontiguousarray(model.values, np.int64),
        }
    return {"accept_kind": _PYTHON_DRAW}
