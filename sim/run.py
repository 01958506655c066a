"""The simulation loop: trace -> scheduler -> the planner (real) -> cost -> clock.

Each step the scheduler hands over a ``StepBatch``; the real planner compiles it
(timed with ``perf_counter_ns``); the cost model turns the plan into time; the
acceptance model decides the spec rows' outcome; the scheduler commits it and the
clock moves to the step's end. When nothing can run the clock jumps to the next
arrival. With ``cost.host_cost`` ``model`` or ``seed`` the clock never reads the
measured planner time, so the same trace, config and seed give the same requests
and step times bit for bit; ``measured`` feeds the planner's real time into the
clock and results then vary from run to run.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from tqdm import tqdm

from stepplan.planner import ExecutionPlan, PlanError, Planner, PlannerConfig

from .acceptance import AcceptanceModel, make_acceptance
from .capacity import gpu_summary, memory_summary, plan_memory
from .config import ConfigError, SimConfig
from .cost import CostModel, StepLoad
from .live import LiveStepper
from .memory import BlockPool
from .results import (
    GRAPH_KINDS,
    RequestLog,
    SimResult,
    request_columns,
    step_columns,
    summarize,
)
from .scheduler import ScheduledStep, Scheduler
from .traces import RequestTable

_GRAPH_CODES = {kind: code for code, kind in enumerate(GRAPH_KINDS)}  # steps.csv graph_kind
_PROGRESS_EVERY = 512  # steps between progress-bar refreshes


def planner_config(config: SimConfig) -> PlannerConfig:
    """The ``PlannerConfig`` the simulation compiles every step with; a setting the
    planner refuses is a :class:`ConfigError` naming it (``scheduler.num_spec_tokens``)."""
    try:
        return PlannerConfig(
            num_spec_tokens=config.scheduler.num_spec_tokens,
            graph_mode=config.planner.graph_mode,
            graph_sizes=config.planner.graph_sizes,
            max_num_seqs=config.scheduler.max_num_seqs,
            prefill_tile_tokens=config.planner.prefill_tile_tokens,
        )
    except PlanError as exc:
        section = "scheduler" if exc.field in ("num_spec_tokens", "max_num_seqs") else "planner"
        raise ConfigError(f"{section}.{exc}") from None


def prepare_requests(table: RequestTable, config: SimConfig) -> RequestTable:
    """The trace after the workload's window, limit and rate scaling (in that order)."""
    workload = config.workload
    if workload.start_s is not None or workload.end_s is not None:
        table = table.window(workload.start_s, workload.end_s)
    if workload.limit is not None:
        table = table.limit(workload.limit)
    if workload.rate_scale != 1.0:
        table = table.scale_rate(workload.rate_scale)
    if table.num_requests == 0:
        raise ValueError(f"{table.source}: no requests left after the window and limit")
    return table


def _record(
    plan: ExecutionPlan, start_s: float, plan_us: float, costs: tuple[float, ...]
) -> tuple[float, ...]:
    graph = plan.graph
    return (
        start_s,
        sum(costs),
        plan.num_spec_rows,
        plan.num_decode_rows,
        plan.num_prefill_rows,
        plan.num_spec_tokens,
        plan.num_decode_tokens,
        plan.num_prefill_tokens,
        _GRAPH_CODES[graph.kind] if graph else 0,
        graph.num_tokens if graph else 0,
        graph.num_rows if graph else 0,
        plan.padded_tokens - plan.num_tokens,
        plan.padded_rows - plan.num_rows,
        plan_us,
        *costs,
    )


def _accepted(
    step: ScheduledStep, scheduler: Scheduler, acceptance: AcceptanceModel, log: RequestLog
) -> np.ndarray:
    """``[R], int64`` accepted drafts per row (0 off the spec rows)."""
    accepted = np.zeros(step.request_ids.size, np.int64)
    if step.is_spec.any():
        ids = step.request_ids[step.is_spec]
        drafts = step.batch.num_draft_tokens[step.is_spec].astype(np.int64)
        drawn = acceptance.draw(ids, scheduler.spec_steps[ids], drafts)
        accepted[step.is_spec] = drawn
        log.record_spec(ids, drafts, drawn)
    return accepted


def _run_live(
    step: ScheduledStep,
    plan: ExecutionPlan,
    live: LiveStepper,
    log: RequestLog,
    costs: tuple[float, ...],
) -> tuple[np.ndarray, tuple[float, ...]]:
    """The live model's accepted drafts per row, and the step's cost terms."""
    outcome = live.run(step, plan)
    spec = step.is_spec
    if spec.any():
        drafts = step.batch.num_draft_tokens[spec].astype(np.int64)
        log.record_spec(step.request_ids[spec], drafts, outcome.accepted[spec])
    if live.measured_time:
        costs = (outcome.wall_s, 0.0, costs[2], 0.0)
    return outcome.accepted, costs


def simulate(
    table: RequestTable,
    config: SimConfig,
    *,
    progress: bool = False,
    live: LiveStepper | None = None,
) -> SimResult:
    """Simulate ``table`` (already windowed; see :func:`prepare_requests`) under
    ``config``. ``progress`` shows a tqdm bar of finished requests. With
    ``config.live.enabled`` the steps run on ``live`` (a new stepper when ``None``)."""
    wall_start = time.perf_counter()
    layout = plan_memory(config, table, live=config.live.enabled)
    scheduler = Scheduler(table, config.scheduler, BlockPool(layout, table))
    plan_config = planner_config(config)
    planner = Planner(plan_config)  # compile_plan's plans, keeping what repeats between steps
    if live is not None and not config.live.enabled:
        raise ValueError("live: a stepper was given but config.live.enabled is false")
    if config.live.enabled and live is None:
        live = LiveStepper.create(config, plan_config, table.prompt_tokens)
    cost = CostModel.create(config.model, config.gpu, config.cost, config.scheduler.num_groups)
    acceptance = make_acceptance(config.acceptance, config.seed)
    log = RequestLog(table.num_requests)
    records: list[tuple[float, ...]] = []
    clock = 0.0
    bar = tqdm(total=table.num_requests, unit="req", disable=not progress, leave=False)
    while not scheduler.done:
        step = scheduler.schedule(clock)
        if step is None:
            clock = max(clock, scheduler.next_arrival_s())
            if not np.isfinite(clock):
                raise RuntimeError("scheduler stalled: requests left but none can run")
            continue
        start = time.perf_counter_ns()
        plan = planner.compile(step.batch)
        plan_us = (time.perf_counter_ns() - start + step.batch_ns) * 1e-3
        costs = cost.step(plan, StepLoad(step.kv_tokens, step.attention_pairs), plan_us)
        if live is None:
            accepted = _accepted(step, scheduler, acceptance, log)
        else:
            accepted, costs = _run_live(step, plan, live, log, costs)
        emitted, finished = scheduler.commit(step, accepted)
        end = clock + sum(costs)
        log.record(step.request_ids, emitted, finished, end)
        records.append(_record(plan, clock, plan_us, costs) + step.memory.row())
        clock = end
        if len(records) % _PROGRESS_EVERY == 0:
            bar.update(scheduler.num_finished - bar.n)
    bar.close()
    wall_s = time.perf_counter() - wall_start
    summary = {"gpu": gpu_summary(config.gpu, cost.profile.device, cost.conv_scale)}
    return _result(table, config, records, log, scheduler, wall_s, live, summary)


def _result(
    table: RequestTable,
    config: SimConfig,
    records: list[tuple[float, ...]],
    log: RequestLog,
    scheduler: Scheduler,
    wall_s: float,
    live: LiveStepper | None = None,
    extra: dict[str, Any] | None = None,
) -> SimResult:
    steps = step_columns(records)
    requests = request_columns(table.arrival_s, table.prompt_tokens, table.output_tokens, log)
    requests.update(scheduler.memory_columns())
    itl_s = np.concatenate([np.zeros(0), *log.itl_s])
    trace: dict[str, Any] = {
        "path": table.source,
        "format": table.format,
        "requests": table.num_requests,
        "span_s": table.span_s,
        "skipped": table.skipped,
    }
    summary = summarize(
        config.to_dict(),
        trace,
        steps,
        requests,
        itl_s,
        int(scheduler.spec_steps.sum()),
        wall_s,
    )
    if scheduler.pool is not None:
        summary["memory"] = memory_summary(scheduler.pool.layout, steps, requests)
    summary.update(extra or {})
    summary["live"] = live is not None
    if live is not None:
        summary["live_run"] = live.summary()
    return SimResult(steps=steps, requests=requests, itl_s=itl_s, summary=summary)
