"""Running a sweep's points on Ray (the optional extra ``stepplan[ray]``).

``ray.init()`` without an address starts a local Ray on this machine; an address
(``auto``, ``ray://host:10001``) joins a cluster, whose nodes need stepplan installed.
A Ray already initialised in this process (a notebook, a test) is used as it is and
left running; one this runner started is shut down when the points are done. Each point
is one task of one CPU running :func:`~.runner.run_point`, so a Ray sweep's table equals
a local one's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

from .runner import POLL_S, QUEUED_PER_WORKER, Done, Meanwhile, PointTask, run_point

INSTALL = "pip install 'stepplan[ray]'"


class RayMissing(ImportError):
    """Ray is not installed; the message says how to install it."""


def import_ray() -> ModuleType:
    """The ``ray`` module, or :class:`RayMissing` saying to install the extra."""
    try:
        import ray
    except ImportError:
        raise RayMissing(f"--ray needs Ray, which is not installed: {INSTALL}") from None
    return ray


def run_ray(
    tasks: Iterable[PointTask],
    done: Done,
    stop: threading.Event,
    meanwhile: Meanwhile = None,
    *,
    address: str | None = None,
    say: Any = None,
) -> None:
    """The points as Ray tasks, each handed to ``done`` as it finishes; ``say`` (a
    callable of one line, or ``None``) hears which Ray runs them."""
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        extra = {"include_dashboard": False} if address is None else {}
        ray.init(address=address, logging_level=logging.ERROR, **extra)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    if say is not None:
        where = "a local Ray" if started and address is None else "Ray"
        say(f"running on {where} ({cpus} CPUs)")
    try:
        _run(ray, iter(tasks), done, stop, cpus, meanwhile)
    finally:
        if started:
            ray.shutdown()


def _run(
    ray: ModuleType,
    queue: Iterator[PointTask],
    done: Done,
    stop: threading.Event,
    cpus: int,
    meanwhile: Meanwhile,
) -> None:
    remote = ray.remote(num_cpus=1, max_retries=0)(run_point)
    pending: list[Any] = []
    try:
        while True:
            while len(pending) < cpus * (1 + QUEUED_PER_WORKER):
                task = next(queue, None)
                if task is None:
                    break
                pending.append(remote.remote(task))
            if meanwhile is not None:
                meanwhile()
                meanwhile = None
            if not pending:
                return
            ready, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
            for ref in ready:
                done(ray.get(ref))
            if stop.is_set():
                return
    finally:
        for ref in pending:  # stopped or failed: the rest must not run on
            ray.cancel(ref, force=True)
