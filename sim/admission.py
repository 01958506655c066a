"""Admission policies: the order in which the scheduler admits waiting requests.

A policy is one entry of :data:`POLICIES`. It gives every request an ordering key once,
before the run (:func:`admission_rank`); the scheduler keeps the requests that arrived
and were never admitted in a queue ordered by that key (a binary heap, in
``scheduler/core.py`` and in the compiled stepper's ``csrc/schedule.c`` alike), and
admits from its front. Ties go in arrival order. First come first served needs no key:
arrival order is the trace's own, so its queue is the range of arrived requests never
admitted.

Whatever the policy, preempted requests go first (as in vLLM v1), and with an age limit
(``scheduler.policy_age_limit_s``) a request that has waited longer than the limit goes
before every other new request, the oldest first, which bounds how long a policy may
pass it over. Admission stops at the first request that does not fit: no request
overtakes the one the policy puts first.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import numpy as np

from .settings.config_values import ConfigError
from .traces import RequestTable
from .traces.request_table import frozen


def _priority(requests: RequestTable) -> np.ndarray:
    if requests.priority is None:
        raise ConfigError(
            f"scheduler.policy: priority needs priorities, and {requests.source} has none "
            "(a trace's priority column, or priority=LEVELS in a synthetic spec)"
        )
    return requests.priority


def _prompt(requests: RequestTable) -> np.ndarray:
    return requests.prompt_tokens


@attrs.frozen
class AdmissionPolicy:
    """One admission order.

    Attributes:
        name: what ``scheduler.policy`` and ``--policy`` call it.
        description: the order in a few words (``--help`` shows it).
        key: ``requests -> [N], int64`` each request's key, lowest first; ``None``:
            arrival order.
    """

    name: str
    description: str
    key: Callable[[RequestTable], np.ndarray] | None


#: Every admission policy, by name.
POLICIES: dict[str, AdmissionPolicy] = {
    policy.name: policy
    for policy in (
        AdmissionPolicy("fcfs", "first come first served", None),
        AdmissionPolicy("priority", "lowest priority value first", _priority),
        AdmissionPolicy("shortest-prompt", "fewest prompt tokens first", _prompt),
    )
}
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)


def check_policy(requests: RequestTable, policy: str) -> None:
    """Refuse (:class:`ConfigError`) a policy that ``requests`` lack the key of, before
    anything runs; cheap (the keys are the table's own columns)."""
    key = POLICIES[policy].key
    if key is not None:
        key(requests)


def admission_rank(requests: RequestTable, policy: str) -> np.ndarray | None:
    """Each request's place in ``policy``'s order: ``[N], int64``, a permutation of
    ``0..N-1`` (0 is admitted first; ties in arrival order), or ``None`` for arrival
    order. A :class:`ConfigError` when the trace lacks what the policy orders by."""
    key = POLICIES[policy].key
    if key is None:
        return None
    count = requests.num_requests
    order = np.lexsort((np.arange(count), np.asarray(key(requests), np.int64)))
    rank = np.empty(count, np.int64)
    rank[order] = np.arange(count, dtype=np.int64)
    return frozen(rank)
