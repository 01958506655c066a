"""The deployment loop: one clock over every replica (see the package docstring).

At each time ``t`` the loop first commits the steps that end at ``t`` (lowest replica
first), then routes the requests that arrive by ``t`` in arrival order, then starts a
step on every replica that is free and has work (lowest first). The next ``t`` is the
earlier of the next arrival and the first step end. So with one replica the loop makes
the same steps, at the same times, as :func:`~stepplan.sim.run.run_steps`
(``tests/test_replicas.py``), and equal inputs give equal results byte for byte.

Each replica hands its steps on a chunk at a time with a ``replica`` column
(:class:`~stepplan.sim.results.outcome.StepStore`): a run's memory holds a chunk per replica,
not its steps. Request rows are gathered at the end, in trace order, with the replica
that served each (:meth:`DeploymentEnd.request_columns`).
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import numpy as np

from ..acceptance import make_acceptance
from ..live import engine_setup
from ..memory import BlockPool
from ..memory_sizing import MemoryLayout, gpu_summary, plan_memory
from ..progress import Progress
from ..results.outcome import StepStore, run_summary
from ..results.records import RequestLog, RequestRows
from ..results.summary import StepTotals
from ..settings.config import SimConfig
from ..stall import replicas_stall_error
from ..timing.cost import CostModel
from ..traces import RequestTable
from .replica import Replica, ReplicaSink
from .routers import Router, RouterSetup, make_router

#: ``requests.csv``'s and ``steps.csv``'s column of the replica (with more than one).
REPLICA_COLUMN = "replica"


@attrs.frozen(eq=False)
class DeploymentEnd:
    """A deployment run once its loop ended.

    Attributes:
        summary: the ``summary.json`` document (its ``deployment`` section per replica
            and for the router).
        rows: every request's row, in trace order.
        replica_of: ``[N], int64`` the replica each request went to (-1: never routed,
            a stopped run).
    """

    summary: dict[str, Any]
    rows: RequestRows
    replica_of: np.ndarray

    def request_columns(self, start: int = 0, stop: int | None = None) -> dict[str, np.ndarray]:
        """``requests.csv``'s columns of rows ``start:stop``, ``replica`` after
        ``request_id`` (``[stop - start]`` each)."""
        stop = self.rows.count if stop is None else min(stop, self.rows.count)
        columns = self.rows.columns(start, stop)
        ids = columns.pop("request_id")
        return {"request_id": ids, REPLICA_COLUMN: self.replica_of[start:stop], **columns}


@attrs.frozen(eq=False)
class _Engines:
    """What :func:`~stepplan.sim.results.outcome.run_summary` reads of a scheduler, over every
    replica: ``spec_steps`` (``[N], int64``) and the (shared) memory layout's pool."""

    spec_steps: np.ndarray
    pool: BlockPool | None


def run_deployment(
    table: RequestTable,
    config: SimConfig,
    store: StepStore,
    *,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    native: bool | None = None,
) -> DeploymentEnd:
    """Simulate ``table`` (prepared, as for ``run_steps``) on ``config.deployment``'s
    replicas behind its router; each replica's steps go to ``store`` a chunk at a time
    (a ``replica`` column first). ``stop`` ends the run before its next step, the steps
    in flight committed (``summary["complete"]`` false)."""
    wall_start = time.perf_counter()
    count = config.deployment.replicas
    layout = plan_memory(config, table)
    groups, tensor = config.scheduler.num_groups, config.parallel.tensor
    cost = CostModel.create(config.model, config.gpu, config.cost, groups, tensor)
    totals = StepTotals()

    def sink(index: int, steps: Mapping[str, np.ndarray]) -> None:
        totals.add(steps)
        size = steps["step"].size
        store.add_steps({REPLICA_COLUMN: np.full(size, index, np.int64), **steps})

    replicas = _replicas(table, config, layout, cost, sink, native)
    setup = RouterSetup(count, config.seed, table.prefix_offsets, table.prefix_blocks)
    router = make_router(config.deployment.router, setup)
    stopped = _run(replicas, router, table, progress, stop)
    ended(replicas, progress)
    wall_s = time.perf_counter() - wall_start
    rows, replica_of, engines = _gathered(table, replicas)
    summary = ended_summary(table, config, totals, rows, engines, wall_s, cost, stopped)
    summary["deployment"] = deployment_summary(replicas, router, config, summary["duration_s"])
    return DeploymentEnd(summary, rows, replica_of)


def ended(replicas: Iterable[Replica], progress: Progress | None) -> None:
    """Close the progress line and hand on every replica's steps still held."""
    if progress is not None:
        progress.close()
    for replica in replicas:
        replica.flush()


def ended_summary(
    table: RequestTable,
    config: SimConfig,
    totals: StepTotals,
    rows: RequestRows,
    engines: _Engines,
    wall_s: float,
    cost: CostModel,
    stopped: bool,
) -> dict[str, Any]:
    """The ``summary.json`` document of a deployment whose loop ended (``cost``: the
    cost model whose GPU the summary names)."""
    extra = {"gpu": gpu_summary(config.gpu, cost.profile.device, cost.conv_scale)}
    return run_summary(
        table,
        config,
        totals,
        rows,
        engines,  # type: ignore[arg-type]
        wall_s,
        None,
        extra,
        complete=not stopped,
    )


def _replicas(
    table: RequestTable,
    config: SimConfig,
    layout: MemoryLayout,
    cost: CostModel,
    sink: ReplicaSink,
    native: bool | None,
) -> list[Replica]:
    """The deployment's replicas; each draws acceptance with the run's seed plus its
    index (so that replicas' draws differ)."""
    plan_config = config.plan
    if cost.engine is not None:  # a profile of another model or planner would mislead
        cost.engine.check_setup(*engine_setup(config, plan_config))
    return [
        Replica(
            index,
            table,
            layout,
            config,
            plan_config,
            cost,
            make_acceptance(config.acceptance, config.seed + index),
            sink,
            native=native,
        )
        for index in range(config.deployment.replicas)
    ]


def _run(
    replicas: list[Replica],
    router: Router,
    table: RequestTable,
    progress: Progress | None,
    stop: threading.Event | None,
) -> bool:
    """The loop (see the module docstring); whether ``stop`` ended it."""
    arrivals = table.arrival_s.tolist()
    total, routed, steps = len(arrivals), 0, 0
    in_flight: list[tuple[float, int]] = []  # (step end, replica), a heap
    starts = [replica.start for replica in replicas]
    commits = [replica.commit for replica in replicas]
    pop, replace, inf = heapq.heappop, heapq.heapreplace, math.inf
    while True:
        next_arrival = arrivals[routed] if routed < total else inf
        if in_flight and in_flight[0][0] < next_arrival and (stop is None or not stop.is_set()):
            now, index = in_flight[0]
            if len(in_flight) == 1 or min(in_flight[1:3])[0] != now:
                # most steps: one replica's step ends, nothing else happens then, and
                # that replica steps again at once
                commits[index]()
                end = starts[index](now)
                if end is None:
                    pop(in_flight)
                else:
                    replace(in_flight, (end, index))
                    steps += 1
                continue
        now = in_flight[0][0] if in_flight and in_flight[0][0] <= next_arrival else next_arrival
        if now == inf:
            break
        ready = [pop(in_flight)[1] for _ in range(len(in_flight)) if in_flight[0][0] == now]
        for index in ready:
            commits[index]()
        while routed < total and arrivals[routed] <= now:
            index = router.choose(routed, replicas, now)
            replicas[index].route(routed)
            routed += 1
            if not replicas[index].stepping and index not in ready:
                ready.append(index)
        if stop is not None and stop.is_set():
            for _, index in in_flight:
                commits[index]()
            return True
        steps += _start(sorted(ready), starts, in_flight, now)
        if progress is not None:  # a sum over replicas: not every step (the fast path)
            finished = sum(replica.scheduler.num_finished for replica in replicas)
            progress.update(steps, finished, now)
    if sum(replica.scheduler.num_finished for replica in replicas) != total:
        raise replicas_stall_error(replicas, table)
    return False


def _start(
    ready: list[int],
    starts: list[Callable[[float], float | None]],
    in_flight: list[tuple[float, int]],
    now: float,
) -> int:
    """Start a step at ``now`` on each replica of ``ready`` (in order) that has one to
    run, onto the heap ``in_flight``; how many started."""
    started = 0
    for index in ready:
        end = starts[index](now)
        if end is not None:
            heapq.heappush(in_flight, (end, index))
            started += 1
    return started


def _gathered(
    table: RequestTable, replicas: list[Replica]
) -> tuple[RequestRows, np.ndarray, _Engines]:
    """Every request's row in trace order from the replicas' own, the replica of each,
    and the spec steps of each."""
    n = table.num_requests
    log = RequestLog(0)
    log.first_token_s, log.finish_s, log.last_emit_s = (np.full(n, np.nan) for _ in range(3))
    log.num_steps, log.drafted, log.accepted = (np.zeros(n, np.int64) for _ in range(3))
    memory = {name: np.zeros(n, np.int64) for name in replicas[0].scheduler.memory_columns()}
    replica_of = np.full(n, -1, np.int64)
    spec_steps = np.zeros(n, np.int64)
    gaps = []
    for replica in replicas:
        k, ids = replica.count, replica.request_ids[: replica.count]
        for name in ("first_token_s", "finish_s", "last_emit_s", "num_steps", "drafted"):
            getattr(log, name)[ids] = getattr(replica.log, name)[:k]
        log.accepted[ids] = replica.log.accepted[:k]
        for name, values in replica.scheduler.memory_columns().items():
            memory[name][ids] = values[:k]
        replica_of[ids] = replica.index
        spec_steps[ids] = replica.spec_steps()
        gaps.append(replica.log.gaps[: int(replica.log.size[0])])
    log.gaps = np.concatenate(gaps)
    log.size = np.array([log.gaps.size], np.int64)
    rows = RequestRows(table.arrival_s, table.prompt_tokens, table.output_tokens, log, memory)
    return rows, replica_of, _Engines(spec_steps, replicas[0].scheduler.pool)


def deployment_summary(
    replicas: list[Replica], router: Router, config: SimConfig, duration_s: float
) -> dict[str, Any]:
    """``summary.json``'s ``deployment`` section: each replica's requests, steps,
    utilisation, queue, KV usage and prefix hits, and the router's balance."""
    per_replica = []
    for replica in replicas:
        totals, k = replica.totals, replica.count
        busy = totals.sum("duration_s")
        prompt = int(replica.scheduler.prompt[:k].sum())
        cached = int(replica.scheduler.cached[:k].sum())
        finish = replica.log.finish_s[:k]
        ttft = replica.log.first_token_s[:k] - replica.scheduler.arrival[:k]
        done = ~np.isnan(finish)
        per_replica.append(
            {
                "replica": replica.index,
                "requests": k,
                "finished_requests": int(done.sum()),
                "steps": totals.count,
                "tokens": totals.counts["num_tokens"],
                "busy_s": busy,
                "utilisation": busy / duration_s if duration_s else 0.0,
                "mean_queue": math.fsum(replica.queue_busy) / busy if busy else 0.0,
                "peak_queue": replica.peak_waiting,
                "mean_kv_usage": totals.sum("kv_busy") / busy if busy else 0.0,
                "peak_kv_usage": totals.peak_kv_usage,
                "prefix_cache_hit_rate": cached / prompt if prompt else 0.0,
                "ttft_ms_mean": float(np.mean(ttft[done]) * 1e3) if done.any() else None,
            }
        )
    tokens = [entry["tokens"] for entry in per_replica]
    mean_tokens = sum(tokens) / len(tokens)
    return {
        "replicas": config.deployment.replicas,
        "router": config.deployment.router,
        "load_balance": max(tokens) / mean_tokens if mean_tokens else 1.0,
        "moved_by_prefix": router.moved,
        "per_replica": per_replica,
    }
