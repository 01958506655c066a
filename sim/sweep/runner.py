"""Running a sweep's points: one after the other in this process, in worker processes on
this machine (:func:`run_local`), or on Ray (``ray_runner.py``).

A point is a :class:`PointTask` (its trace, prepared, and its settings); running it is
:func:`run_point`, a pure function of the task, so any runner gives the same summaries.
A runner hands each finished point to ``done`` in the calling process (which writes
its record), and returns when every point has run or ``stop`` is set; a stopped runner
ends the points still running at once and drops them (they run again on a re-run).
``meanwhile``, when given, is called once in the calling process as soon as the first
points are handed out: its own preparation (the figure's imports) then overlaps the
points instead of following the last one, and comes after the workers are forked.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

import attrs
import numpy as np

from ..run import simulate
from ..settings.config import SimConfig
from ..traces import RequestTable

#: Seconds between looks at the stop event while points run.
POLL_S = 0.2
#: Points queued per worker beyond the one it runs (enough to keep it busy, few enough
#: that a large sweep's prepared traces are not all in memory at once).
QUEUED_PER_WORKER = 2


@attrs.frozen(eq=False)
class PointTask:
    """One point to run.

    Attributes:
        digest: the point's key (``records.point_digest``).
        requests: its trace, prepared (windowed, limited, rate-scaled).
        config: its settings, checked.
        keep: return the run's tables too (``--keep-runs``).
    """

    digest: str
    requests: RequestTable
    config: SimConfig
    keep: bool = False


@attrs.frozen(eq=False)
class PointOutcome:
    """A finished point.

    Attributes:
        digest: the task's. summary: the run's summary, ``measured`` section included.
        steps, requests: the run's columns when the task asked to keep them, else ``None``
            (plain dicts of ``[rows]`` arrays: they travel between processes).
    """

    digest: str
    summary: dict[str, Any]
    steps: dict[str, np.ndarray] | None = None
    requests: dict[str, np.ndarray] | None = None


Done = Callable[[PointOutcome], None]
Meanwhile = Callable[[], None] | None


def run_point(task: PointTask, stop: threading.Event | None = None) -> PointOutcome | None:
    """Simulate one point; ``None`` when ``stop`` ended it early."""
    result = simulate(task.requests, task.config, stop=stop)
    if not result.summary["complete"]:
        return None
    if not task.keep:
        return PointOutcome(task.digest, result.summary)
    return PointOutcome(
        task.digest, result.summary, dict(result.steps.columns), dict(result.requests.columns)
    )


def default_workers() -> int:
    """The cores this process may use."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def run_serial(
    tasks: Iterable[PointTask], done: Done, stop: threading.Event, meanwhile: Meanwhile = None
) -> None:
    """Every point in this process, in order; ``stop`` also ends the point running."""
    if meanwhile is not None:
        meanwhile()
    for task in tasks:
        if stop.is_set():
            return
        outcome = run_point(task, stop)
        if outcome is None:
            return
        done(outcome)


def _worker_init() -> None:
    """Workers leave Ctrl-C to the sweep (a terminal sends it to the whole process
    group): the sweep stops them itself, and no worker prints a traceback. SIGTERM ends
    a worker (a forked one would inherit the sweep's handler, which only asks to stop)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start_method() -> str:
    """``fork`` on Linux from a process of one thread, else ``spawn``.

    A forked worker starts at once with stepplan imported and no state of its own to
    build (a spawned one starts a new interpreter and imports stepplan and the calling
    script again: about 0.3 s of CPU per worker, on the cores the points need). Another
    thread of this process could hold a lock at the fork that stays held in the child,
    so then the workers are spawned; macOS and Windows always spawn. The threads Python
    does not see are numpy's BLAS pool, which stops itself around a fork, and those of
    torch or Ray when this process started them: a worker touches neither."""
    forkable = sys.platform.startswith("linux") and threading.active_count() == 1
    return "fork" if forkable else "spawn"


def run_local(
    tasks: Iterable[PointTask],
    done: Done,
    stop: threading.Event,
    meanwhile: Meanwhile = None,
    *,
    workers: int,
    start: str | None = None,
) -> None:
    """The points in ``workers`` worker processes, each handed to ``done`` as it
    finishes; ``start`` is how they start (``fork``, ``spawn``; default
    :func:`start_method`). Either way a worker runs only :func:`run_point` of a task."""
    queue: Iterator[PointTask] = iter(tasks)
    context = multiprocessing.get_context(start or start_method())
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init)
    pending: set[Future] = set()
    try:
        while True:
            while len(pending) < workers * (1 + QUEUED_PER_WORKER):
                task = next(queue, None)
                if task is None:
                    break
                pending.add(pool.submit(run_point, task))
            if meanwhile is not None:  # the workers are starting: the parent's turn
                meanwhile()
                meanwhile = None
            if not pending:
                break
            finished, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
            for future in finished:
                if stop.is_set() and future.exception() is not None:
                    continue  # a SIGTERM to the process group ended its worker too
                done(future.result())
            if stop.is_set():
                _take_finished(pending, done)
                break
    except BaseException:
        _end_workers(pool, pending)
        raise
    if stop.is_set():
        _end_workers(pool, pending)
    else:
        pool.shutdown(wait=True)


def _take_finished(pending: set[Future], done: Done) -> None:
    """Points that finished while the sweep was being stopped still count."""
    for future in [f for f in pending if f.done() and not f.cancelled()]:
        if future.exception() is None:
            done(future.result())
        pending.discard(future)


def _end_workers(pool: ProcessPoolExecutor, pending: set[Future]) -> None:
    """Cancel the queued points and end the running ones now: a stopped sweep must not
    wait for them (``terminate_workers`` is Python 3.14's; before, the processes)."""
    for future in pending:
        future.cancel()
    terminate = getattr(pool, "terminate_workers", None)
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError):
            process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)
