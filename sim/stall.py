"""A run that can go no further: requests are left, nothing runs and none can be admitted.

The loops (``run.py``, ``deployment/loop.py``, ``deployment/disaggregated.py``) stop
with a :class:`StallError` then, one line naming the request first in line and why it
does not fit, rather than waiting forever on a state that no longer changes. On vLLM's
scheduler the line names the request vLLM holds (running, waiting, or ended early) and
what holds it, read from vLLM's own state (``scheduler/vllm_limits.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .memory import BlockPool
from .scheduler import Scheduler
from .scheduler.state import NUM_FREE
from .scheduler.vllm_engine_scheduler import VllmEngineScheduler
from .scheduler.vllm_limits import held_request
from .settings.config_values import ConfigError
from .traces import RequestTable


class StallError(ConfigError):
    """Requests are left but none can run: a setting is too small for one of them."""


def stall_error(
    scheduler: Any,
    clock: float,
    *,
    table: RequestTable | None = None,
    request_ids: np.ndarray | None = None,
) -> StallError:
    """The error for ``scheduler`` (a :class:`~.scheduler.state.RequestProgress`) stalled
    at ``clock`` (seconds; ``inf``: no arrival is left). A replica's: ``request_ids``
    maps its rows to rows of the trace ``table`` (``[n], int64``), whose lengths are shown
    (a prefill engine's request has one output token). On vLLM's scheduler the request
    is the one vLLM holds, and the words say how (``scheduler/vllm_limits.py``)."""
    held = held_request(scheduler) if isinstance(scheduler, VllmEngineScheduler) else None
    if held is None:
        request = waiting_request(scheduler, clock)
        why = admission_refusal(scheduler, request)
        held = request, f"cannot be admitted while nothing runs: {why}"
    request, what = held
    shown = request if request_ids is None else int(request_ids[request])
    if table is not None:
        prompt, output = int(table.prompt_tokens[shown]), int(table.output_tokens[shown])
    else:
        prompt, output = int(scheduler.prompt[request]), int(scheduler.output[request])
    when = f" at {clock:.6g} s" if math.isfinite(clock) else ""
    lengths = f"prompt {prompt:,} + output {output:,} tokens"
    return StallError(f"run stalled{when}: request {shown} ({lengths}) {what}")


def waiting_request(scheduler: Any, clock: float) -> int:
    """The request first in line: the front preempted one, else the earliest arrived by
    ``clock`` that is neither running nor finished (the earliest unfinished at all when
    none has arrived)."""
    resumed = getattr(scheduler, "resumed", None)
    if resumed:
        return int(resumed[0])
    left = (scheduler.emitted < scheduler.output) & (scheduler.slot == 0)
    arrived = left & (scheduler.arrival <= clock)
    candidates = np.flatnonzero(arrived if arrived.any() else left)
    if candidates.size == 0:
        return int(np.argmax(scheduler.emitted < scheduler.output))
    return int(candidates[np.argmin(scheduler.arrival[candidates])])


def admission_refusal(scheduler: Any, request: int) -> str:
    """Why ``request`` is not admitted into an empty engine, in a few words naming the
    setting to raise."""
    config = scheduler.config
    budget, pad = config.max_num_batched_tokens, config.num_spec_tokens
    if isinstance(scheduler, Scheduler) and scheduler.counters.values[NUM_FREE] <= 0:
        slots = scheduler.slot_capacity
        return f"none of the {slots:,} conv-state slots is free (scheduler.slots)"
    if budget < 1 + pad:
        return (
            f"scheduler.max_num_batched_tokens = {budget:,} is less than the "
            f"{1 + pad} tokens a padded row takes (scheduler.num_spec_tokens + 1)"
        )
    pool = getattr(scheduler, "pool", None)
    if isinstance(pool, BlockPool):
        blocks = int(pool.layout.blocks_for(int(scheduler.target[request])))
        free = int(pool.free) + int(pool.cached_blocks)
        if blocks > free:
            return (
                f"its prompt needs {blocks:,} KV blocks and the cache has {free:,} free "
                f"of {pool.capacity:,} (memory.kv_cache_gib)"
            )
    return (
        f"the scheduler admits nothing (scheduler.max_num_batched_tokens = {budget:,}, "
        f"scheduler.max_num_seqs = {config.max_num_seqs:,}, scheduler.policy = "
        f"{config.policy!r})"
    )


def replicas_stall_error(replicas: Sequence[Any], table: RequestTable) -> StallError:
    """:func:`stall_error` for the first of ``replicas`` (``deployment/replica.py``'s
    ``Replica``) with requests left of the trace ``table``, once no arrival and no step
    is left."""
    stalled = next((replica for replica in replicas if replica.outstanding), None)
    if stalled is None:  # none is left on an engine: a hand-off between pools was lost
        return StallError("run stalled: requests left but none is on an engine to run")
    ids = stalled.request_ids
    return stall_error(stalled.scheduler, math.inf, table=table, request_ids=ids)
