"""Prefill-decode disaggregation: a prefill pool and a decode pool of replicas on one
clock (``[disaggregation]``, ``settings/config_disaggregation.py``).

The rules, as vLLM's disaggregated serving runs a request:

- A request is routed (the deployment's router) to a prefill replica, which runs it as a
  request of one output token: its prompt prefills in chunks among the replica's other
  requests, and the step that computes its last prompt token gives its first token
  (its TTFT ends there). A request of one output token is then finished.
- Its state crosses the link (``settings/links.py``): its KV blocks, ``ceil(prompt /
  block_size)`` blocks of ``block_size x kv_bytes_per_token`` bytes (every attention
  layer, every rank), and one conv state (every conv layer's history,
  ``memory_sizing.ModelFootprint.kept_state_bytes``), in ``latency + bytes / bandwidth``.
  Transfers do not queue for the link.
- At the end of the transfer it is routed to a decode replica, which admits it with its
  prompt computed (``Scheduler.preloaded``): its first step feeds the first token (one
  position past the prompt) and gives the second; it decodes the rest of its output
  there. A decode replica holds the blocks of the whole context from its admission, as
  a co-located engine would, and a preempted request computes its context again there.

So with the ``instant`` link the prefill pool runs the same steps as a co-located
deployment given every request with one output token, and the decode pool as one given
each request at its first token with its prompt already computed
(``tests/test_disaggregated.py``). The compiled stepper takes computed prompts as the
Python scheduler does (the test holds them equal).

Replicas are numbered over both pools (prefill first): ``steps.csv``'s ``replica`` and
``pool`` columns say whose step a row is; ``requests.csv`` has each request's
``prefill_replica``, ``replica`` (its decode replica, -1 when it had one token),
``transfer_bytes`` and ``transfer_s``.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from ..acceptance import make_acceptance
from ..live import engine_setup
from ..memory_sizing import gpu_summary, model_footprint, plan_memory
from ..progress import Progress
from ..results.outcome import StepStore
from ..results.records import RequestLog, RequestRows
from ..results.summary import StepTotals
from ..scheduler.state import FINISHED, ROWS
from ..settings.config import SimConfig
from ..settings.config_disaggregation import prefill_pool_config
from ..settings.links import KV_LINKS, KvLink
from ..stall import replicas_stall_error
from ..timing.cost import CostModel
from ..timing.pricing import deployment_dollars
from ..traces import RequestTable
from .loop import REPLICA_COLUMN, _Engines, deployment_summary, ended, ended_summary
from .replica import Replica, ReplicaSink
from .routers import Router, RouterSetup, make_router

#: ``steps.csv``'s column naming the pool of a step's replica.
POOL_COLUMN = "pool"
PREFILL, DECODE = "prefill", "decode"


def transfer_bytes(config: SimConfig, prompt_tokens: np.ndarray) -> np.ndarray:
    """``[N], float64`` the bytes each request's state takes over the link: the KV
    blocks of its prompt (``prompt_tokens``: ``[N], int64``) and one conv state."""
    footprint = model_footprint(config.model, config.scheduler.num_spec_tokens)
    block = config.memory.block_size
    blocks = -(-np.asarray(prompt_tokens, np.int64) // block)
    return blocks * (block * footprint.kv_bytes_per_token) + float(footprint.kept_state_bytes)


@attrs.frozen(eq=False)
class _Pool:
    """One pool: its settings, replicas, router and cost model."""

    name: str
    config: SimConfig
    replicas: list[Replica]
    router: Router
    cost: CostModel

    @property
    def gpus(self) -> int:
        return len(self.replicas) * self.config.parallel.gpus_per_replica


def _pool(
    name: str,
    first: int,
    table: RequestTable,
    config: SimConfig,
    sink: ReplicaSink,
    native: bool | None,
    preloads: bool = False,
) -> _Pool:
    """A pool of ``config.deployment.replicas`` replicas over ``table``, numbered from
    ``first`` (each draws acceptance with the run's seed plus its number); ``preloads``:
    its requests come with their prompts computed."""
    layout = plan_memory(config, table)
    groups, tensor = config.scheduler.num_groups, config.parallel.tensor
    cost = CostModel.create(config.model, config.gpu, config.cost, groups, tensor)
    if cost.engine is not None:  # a profile of another model or planner would mislead
        cost.engine.check_setup(*engine_setup(config, config.plan))
    replicas = []
    for index in range(first, first + config.deployment.replicas):
        acceptance = make_acceptance(config.acceptance, config.seed + index)
        replica = Replica(
            index,
            table,
            layout,
            config,
            config.plan,
            cost,
            acceptance,
            sink,
            native=native,
            preloads=preloads,
        )
        replicas.append(replica)
    setup = RouterSetup(len(replicas), config.seed, table.prefix_offsets, table.prefix_blocks)
    return _Pool(name, config, replicas, make_router(config.deployment.router, setup), cost)


@attrs.frozen(eq=False)
class DisaggregatedEnd:
    """A disaggregated run once its loop ended.

    Attributes:
        summary: the ``summary.json`` document (its ``disaggregation`` section per pool).
        rows: every request's row, in trace order (first token from its prefill
            replica, the rest from its decode replica).
        columns: ``requests.csv``'s pool columns, ``[N]`` each: ``prefill_replica``,
            ``replica`` (int64), ``transfer_bytes``, ``transfer_s`` (float64; NaN for
            a request of one token, which is not transferred).
        decoded: ``[N], int64`` the tokens each request's decode replica gave (0 for a
            request of one token).
    """

    summary: dict[str, Any]
    rows: RequestRows
    columns: dict[str, np.ndarray]
    decoded: np.ndarray

    def request_columns(self, start: int = 0, stop: int | None = None) -> dict[str, np.ndarray]:
        """``requests.csv``'s columns of rows ``start:stop`` (``[stop - start]`` each)."""
        stop = self.rows.count if stop is None else min(stop, self.rows.count)
        columns = self.rows.columns(start, stop)
        ids = columns.pop("request_id")
        pools = {name: values[start:stop] for name, values in self.columns.items()}
        return {"request_id": ids, **pools, **columns}


def run_disaggregated(
    table: RequestTable,
    config: SimConfig,
    store: StepStore,
    *,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    native: bool | None = None,
) -> DisaggregatedEnd:
    """Simulate ``table`` (prepared, as for ``run_steps``) on a prefill pool and a decode
    pool (the module docstring); each replica's steps go to ``store`` a chunk at a time,
    ``replica`` and ``pool`` columns first. ``stop`` ends the run before its next step."""
    wall_start = time.perf_counter()
    totals = StepTotals()
    first_decode = config.disaggregation.prefill_replicas

    def sink(index: int, steps: Mapping[str, np.ndarray]) -> None:
        totals.add(steps)
        size = steps["step"].size
        pool = np.full(size, PREFILL if index < first_decode else DECODE)
        store.add_steps(
            {REPLICA_COLUMN: np.full(size, index, np.int64), POOL_COLUMN: pool, **steps}
        )

    prefill, decode = _pools(table, config, sink, native)
    link = KV_LINKS[config.disaggregation.link]
    sizes = transfer_bytes(config, table.prompt_tokens)
    handoff = _Handoff(link, sizes, table.prompt_tokens, table.output_tokens)
    stopped = _run(prefill, decode, handoff, table, progress, stop)
    ended((*prefill.replicas, *decode.replicas), progress)
    rows, columns, engines = _gathered(table, prefill, decode, handoff)
    wall_s = time.perf_counter() - wall_start
    summary = ended_summary(table, config, totals, rows, engines, wall_s, decode.cost, stopped)
    output = int(table.output_tokens[~np.isnan(rows.log.finish_s)].sum())
    summary["dollars"] = _dollars(output, summary, (prefill, decode))
    summary["disaggregation"] = _pools_summary((prefill, decode), link, columns)
    summary["deployment"] = _replicas_summary((prefill, decode), summary["duration_s"])
    decoded = np.zeros(table.num_requests, np.int64)
    for replica in decode.replicas:
        decoded[replica.request_ids[: replica.count]] = replica.scheduler.emitted[: replica.count]
    return DisaggregatedEnd(summary, rows, columns, decoded)


def _pools(
    table: RequestTable, config: SimConfig, sink: ReplicaSink, native: bool | None
) -> tuple[_Pool, _Pool]:
    """The prefill pool over the trace's requests with one output token each, and the
    decode pool over them with the first token joined to the prompt (numbered after)."""
    n = table.num_requests
    offsets, blocks = table.prefix_offsets, table.prefix_blocks
    prompt, output = table.prompt_tokens, table.output_tokens
    one_token = RequestTable(table.arrival_s, prompt, np.ones(n, np.int64), offsets, blocks)
    rest = RequestTable(np.zeros(n), prompt + 1, np.maximum(output - 1, 1), offsets, blocks)
    prefill_config = prefill_pool_config(config)
    prefill = _pool(PREFILL, 0, one_token, prefill_config, sink, native)
    decode = _pool(DECODE, len(prefill.replicas), rest, config, sink, native, preloads=True)
    return prefill, decode


def _replicas_summary(pools: tuple[_Pool, _Pool], duration_s: float) -> dict[str, Any]:
    """``summary.json``'s ``deployment`` section over both pools, each replica's entry
    naming its pool."""
    per_replica = []
    for pool in pools:
        section = deployment_summary(pool.replicas, pool.router, pool.config, duration_s)
        per_replica += [{POOL_COLUMN: pool.name, **entry} for entry in section["per_replica"]]
    return {
        "replicas": len(per_replica),
        "router": pools[1].config.deployment.router,
        "per_replica": per_replica,
    }


class _Handoff:
    """The requests between the pools: when each left its prefill replica, when it
    reaches the decode pool, and the transfers still under way (a heap)."""

    def __init__(
        self, link: KvLink, sizes: np.ndarray, prompt: np.ndarray, output: np.ndarray
    ) -> None:
        n = sizes.size
        self.link, self.sizes, self.prompt, self.output = link, sizes, prompt, output
        self.seconds = np.full(n, np.nan)  # transfer time per request
        self.prefill_of = np.full(n, -1, np.int64)
        self.under_way: list[tuple[float, int]] = []  # (arrival at the decode pool, request)
        self.transferred = 0
        self.one_token = 0  # requests finished at their prefill

    def prefilled(self, replica: Replica, end: float) -> None:
        """After a prefill replica's step ending at ``end``: send on the requests it
        finished (their first token), those with more than one token to give."""
        scheduler = replica.scheduler
        rows = int(scheduler.counters.values[ROWS])
        local = scheduler.rows.ids[:rows]
        done = local[scheduler.emitted[local] >= scheduler.output[local]]
        for request in replica.request_ids[done].tolist():
            self.prefill_of[request] = replica.index
            if self.output[request] > 1:
                seconds = self.link.transfer_s(float(self.sizes[request]))
                self.seconds[request] = seconds
                heapq.heappush(self.under_way, (end + seconds, request))
                self.transferred += 1
            else:
                self.one_token += 1

    def hand_on(self, now: float, decode: _Pool) -> int:
        """Route the first transfer to end (at ``now``) to a decode replica, which takes
        it with its prompt computed; that replica's place in its pool."""
        request = heapq.heappop(self.under_way)[1]
        index = decode.router.choose(request, decode.replicas, now)
        replica = decode.replicas[index]
        local = replica.count
        replica.route(request)
        replica.scheduler.arrival[local] = now
        replica.scheduler.preloaded[local] = int(self.prompt[request])
        return index


def _run(
    prefill: _Pool,
    decode: _Pool,
    handoff: _Handoff,
    table: RequestTable,
    progress: Progress | None,
    stop: threading.Event | None,
) -> bool:
    """One clock over both pools: at each time the steps ending then commit (lowest
    replica first), then the trace's arrivals are routed to the prefill pool and the
    finished transfers to the decode pool, then every free replica with work steps.
    Whether ``stop`` ended it."""
    replicas = [*prefill.replicas, *decode.replicas]
    first_decode = len(prefill.replicas)
    arrivals = table.arrival_s.tolist()
    total, routed, steps = len(arrivals), 0, 0
    in_flight: list[tuple[float, int]] = []
    inf = math.inf
    while True:
        next_arrival = arrivals[routed] if routed < total else inf
        if handoff.under_way:
            next_arrival = min(next_arrival, handoff.under_way[0][0])
        now = in_flight[0][0] if in_flight and in_flight[0][0] <= next_arrival else next_arrival
        if now == inf:
            break
        ready = _commit_ending(now, in_flight, replicas, first_decode, handoff)
        while routed < total and arrivals[routed] <= now:
            index = prefill.router.choose(routed, prefill.replicas, now)
            prefill.replicas[index].route(routed)
            routed += 1
            if not prefill.replicas[index].stepping and index not in ready:
                ready.append(index)
        while handoff.under_way and handoff.under_way[0][0] <= now:
            index = first_decode + handoff.hand_on(now, decode)
            if not replicas[index].stepping and index not in ready:
                ready.append(index)
        if stop is not None and stop.is_set():
            for _, index in in_flight:
                replicas[index].commit()
            return True
        for index in sorted(ready):
            end = replicas[index].start(now)
            if end is not None:
                heapq.heappush(in_flight, (end, index))
                steps += 1
        if progress is not None:
            finished = sum(r.scheduler.num_finished for r in decode.replicas)
            progress.update(steps, finished + handoff.one_token, now)
    prefilled = sum(int(r.scheduler.counters.values[FINISHED]) for r in prefill.replicas)
    decoded = sum(r.scheduler.num_finished for r in decode.replicas)
    if prefilled != total or decoded != handoff.transferred:
        raise replicas_stall_error(replicas, table)
    return False


def _commit_ending(
    now: float,
    in_flight: list[tuple[float, int]],
    replicas: list[Replica],
    first_decode: int,
    handoff: _Handoff,
) -> list[int]:
    """Commit the steps ending at ``now`` (lowest replica first), sending on what the
    prefill replicas finished; those replicas, free again."""
    ready = []
    while in_flight and in_flight[0][0] == now:
        ready.append(heapq.heappop(in_flight)[1])
    ready.sort()
    for index in ready:
        replica = replicas[index]
        finished = replica.scheduler.num_finished
        replica.commit()
        if index < first_decode and replica.scheduler.num_finished > finished:
            handoff.prefilled(replica, now)
    return ready


def _gathered(
    table: RequestTable, prefill: _Pool, decode: _Pool, handoff: _Handoff
) -> tuple[RequestRows, dict[str, np.ndarray], _Engines]:
    """Every request's row in trace order: its first token from the prefill pool, the
    rest from the decode pool; the pool columns; the decode pool's spec steps."""
    n = table.num_requests
    log = RequestLog(0)
    log.first_token_s, log.finish_s, log.last_emit_s = (np.full(n, np.nan) for _ in range(3))
    log.num_steps, log.drafted, log.accepted = (np.zeros(n, np.int64) for _ in range(3))
    memory = {
        name: np.zeros(n, np.int64) for name in prefill.replicas[0].scheduler.memory_columns()
    }
    decode_of = np.full(n, -1, np.int64)
    spec_steps = np.zeros(n, np.int64)
    second = np.full(n, np.nan)  # the decode pool's first token: the request's second
    for replica in prefill.replicas:
        k, ids = replica.count, replica.request_ids[: replica.count]
        for name in ("first_token_s", "finish_s", "last_emit_s"):
            getattr(log, name)[ids] = getattr(replica.log, name)[:k]
        log.num_steps[ids] += replica.log.num_steps[:k]
        for name, values in replica.scheduler.memory_columns().items():
            memory[name][ids] += values[:k]
    gaps = []
    for replica in decode.replicas:
        k, ids = replica.count, replica.request_ids[: replica.count]
        for name in ("finish_s", "last_emit_s"):
            getattr(log, name)[ids] = getattr(replica.log, name)[:k]
        second[ids] = replica.log.first_token_s[:k]
        log.num_steps[ids] += replica.log.num_steps[:k]
        log.drafted[ids] = replica.log.drafted[:k]
        log.accepted[ids] = replica.log.accepted[:k]
        for name, values in replica.scheduler.memory_columns().items():
            memory[name][ids] += values[:k]
        decode_of[ids] = replica.index
        spec_steps[ids] = replica.spec_steps()
        gaps.append(replica.log.gaps[: int(replica.log.size[0])])
    handed = ~np.isnan(second)
    # the gap from the first token to the second spans the transfer
    gaps.append((second - log.first_token_s)[handed])
    log.gaps = np.concatenate(gaps)
    log.size = np.array([log.gaps.size], np.int64)
    rows = RequestRows(table.arrival_s, table.prompt_tokens, table.output_tokens, log, memory)
    columns = {
        "prefill_replica": handoff.prefill_of,
        REPLICA_COLUMN: decode_of,
        "transfer_bytes": np.where(np.isnan(handoff.seconds), np.nan, handoff.sizes),
        "transfer_s": handoff.seconds,
    }
    return rows, columns, _Engines(spec_steps, decode.replicas[0].scheduler.pool)


def _dollars(
    output_tokens: int, summary: dict[str, Any], pools: tuple[_Pool, _Pool]
) -> dict[str, Any]:
    """The summary's ``dollars`` over both pools' GPUs, each at its own price (its
    ``price_per_gpu_hour`` the mean over them; ``disaggregation.pools`` has each)."""
    prices = [pool.config.gpu.resolved().price_per_hour for pool in pools]
    gpus = sum(pool.gpus for pool in pools)
    per_hour = None
    if None not in prices:
        per_hour = sum(price * pool.gpus for price, pool in zip(prices, pools, strict=True))  # type: ignore[operator]
    return deployment_dollars(
        None if per_hour is None else per_hour / gpus,
        gpus,
        summary["duration_s"],
        output_tokens,
        summary["goodput"]["requests"],
    )


def _finite(value: float) -> float | None:
    """``value``, or ``None`` for an infinite one (JSON has no infinity)."""
    return None if math.isinf(value) else value


def _pools_summary(
    pools: tuple[_Pool, _Pool], link: KvLink, columns: dict[str, np.ndarray]
) -> dict[str, Any]:
    """``summary.json``'s ``disaggregation`` section: the link and its transfers, and
    per pool its GPU (figures, interconnect, price), replicas and queue."""
    seconds = columns["transfer_s"]
    moved = ~np.isnan(seconds)
    section: dict[str, Any] = {
        "link": {
            "name": link.name,
            "part": link.part,
            "bw_bytes_s": _finite(link.bw_bytes_s),
            "latency_us": link.latency_us,
            "source": "settings/links.py (docs/presets.md, KV transfer links)",
        },
        "transfers": {
            "requests": int(moved.sum()),
            "bytes_total": float(columns["transfer_bytes"][moved].sum()),
            "seconds_mean": float(seconds[moved].mean()) if moved.any() else None,
            "seconds_max": float(seconds[moved].max()) if moved.any() else None,
        },
        "pools": {},
    }
    for pool in pools:
        gpu = pool.config.gpu.resolved()
        busy = [replica.totals.sum("duration_s") for replica in pool.replicas]
        queued = [math.fsum(replica.queue_busy) for replica in pool.replicas]
        price = gpu.price_per_hour
        section["pools"][pool.name] = {
            "gpu": gpu.name,
            "tensor": pool.config.parallel.tensor,
            "replicas": len(pool.replicas),
            "gpus": pool.gpus,
            "price_per_gpu_hour": price,
            "usd_per_hour": None if price is None else price * pool.gpus,
            "gpu_figures": gpu_summary(
                pool.config.gpu, pool.cost.profile.device, pool.cost.conv_scale
            ),
            "requests": sum(replica.count for replica in pool.replicas),
            "mean_queue": math.fsum(queued) / math.fsum(busy) if math.fsum(busy) else 0.0,
            "peak_queue": max(replica.peak_waiting for replica in pool.replicas),
        }
    return section
