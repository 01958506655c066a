"""The simulation loop: trace -> scheduler -> the planner (real) -> cost -> clock.

Each step the scheduler hands over a ``StepBatch``; the real planner compiles it
(timed with ``perf_counter_ns``; where the step's time reads only the plan's shape, the
planner checks and packs the same rows without making the batch or the plan objects,
``Planner.shape_of_rows``); the cost model turns the plan into time; the
acceptance model decides the spec rows' outcome; the scheduler commits it and the
clock moves to the step's end. When nothing can run the clock jumps to the next
arrival; with none ahead, or none that changes what an empty engine admits, the run
stops with one line naming the request that does not fit (``stall.py``). A ``stop``
event, checked before every step, ends the run early with what it has
(``summary["complete"]`` false; requests not finished have no finish time).
With ``cost.host_cost`` ``model`` or ``seed`` the clock never reads the measured
planner time, so the same trace, config and seed give the same requests and step
times bit for bit; ``measured`` feeds the planner's real time into the clock and
results then vary from run to run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from stepplan.planner import ExecutionPlan, Planner, PlanShape, StepBatch

from .acceptance import AcceptanceModel, make_acceptance
from .admission import check_policy
from .live import LiveOutcome, LiveStepper, engine_setup
from .memory_sizing import gpu_summary, plan_memory
from .progress import Progress
from .results.outcome import MemoryStore, RunEnd, StepStore, run_summary
from .results.records import RequestLog, RequestRows, StepTable, step_columns
from .results.schema import GRAPH_KINDS
from .results.sim_result import SimResult
from .results.summary import StepTotals
from .scheduler import ScheduledStep, Scheduler
from .scheduler.implementations import make_scheduler
from .settings.config import SimConfig
from .stall import stall_error
from .stepper import Stepper
from .timing.cost import CostModel, PlanTerms, StepCost, StepLoad
from .traces import RequestTable, TraceError

_GRAPH_CODES = {kind: code for code, kind in enumerate(GRAPH_KINDS)}  # steps.csv graph_kind
#: The longest span of arrivals a run takes: 30 days. Longer is a broken row (a date of
#: another year, a time in the wrong unit) or a rate scale far off, not a workload.
MAX_SPAN_S = 30 * 86400
_KEPT_SHAPES = 4096  # plan shapes whose record fields a loop keeps (all let go when full)


def prepare_requests(table: RequestTable, config: SimConfig) -> RequestTable:
    """The trace after the workload's window and limit, less the requests longer than
    ``model.max_model_len``, rate-scaled (in that order); a :class:`TraceError` when
    nothing is left, a :class:`ConfigError` when the admission policy orders by what the
    trace lacks."""
    workload = config.workload
    if workload.start_s is not None or workload.end_s is not None:
        window = table.window(workload.start_s, workload.end_s)
        if window.num_requests == 0:
            low = "-inf" if workload.start_s is None else workload.start_s
            high = "inf" if workload.end_s is None else workload.end_s
            raise TraceError(
                table.source,
                None,
                f"no requests arrive in the window [{low}, {high}) s: "
                f"they arrive from {table.arrival_s[0]:.6g} to {table.arrival_s[-1]:.6g} s",
            )
        table = window
    if workload.limit is not None:
        table = table.limit(workload.limit)
    chosen, max_len = table.num_requests, config.model.resolved().max_model_len
    table = table.within_model_len(max_len)
    if table.num_requests == 0:
        raise TraceError(
            table.source,
            None,
            f"all {chosen} requests exceed model.max_model_len = "
            f"{max_len} tokens (prompt + output); raise it with --max-model-len",
        )
    check_span(table)
    if workload.rate_scale != 1.0:
        scaled = table.scale_rate(workload.rate_scale)
        if scaled.span_s > MAX_SPAN_S:
            source, line, _ = table.where(table.num_requests - 1)
            raise TraceError(
                source,
                line,
                f"workload.rate_scale = {workload.rate_scale:g} stretches "
                f"{_duration(table.span_s)} of arrivals to {_duration(scaled.span_s)}; "
                f"{_SPAN_BOUND}: use a rate scale of at least {table.span_s / MAX_SPAN_S:.3g}",
            )
        table = scaled
    check_policy(table, config.scheduler.policy)
    return table


_SPAN_BOUND = f"a run may span at most 30 days ({MAX_SPAN_S:,} s) of arrivals"


def check_span(table: RequestTable) -> None:
    """Refuse arrivals spread over more than :data:`MAX_SPAN_S`, naming the request that
    stands out: the first or the last, whichever is further from the median."""
    span = table.span_s
    if span <= MAX_SPAN_S:
        return
    arrival, last = table.arrival_s, table.num_requests - 1
    median = float(arrival[last // 2])
    first_far = median - arrival[0] > arrival[last] - median
    source, line, what = table.where(0 if first_far else last)
    gap = float(median - arrival[0] if first_far else arrival[last] - median)
    side = "before" if first_far else "after"
    fix = "correct the row, or choose a window (--start-s, --end-s)"
    if table.lines is None:
        fix = "a higher rate or fewer requests keeps within it"
    raise TraceError(
        source,
        line,
        f"{what}arrives {_duration(gap)} {side} most of the trace, which then spans "
        f"{_duration(span)}; {_SPAN_BOUND}: {fix}",
    )


def _duration(seconds: float) -> str:
    """``seconds`` in a unit a person reads at once."""
    for unit, size in (("years", 365.25 * 86400), ("days", 86400.0), ("h", 3600.0)):
        if seconds >= size:
            return f"{seconds / size:,.3g} {unit}"
    return f"{seconds:.3g} s"


def _record(
    plan: ExecutionPlan | PlanShape, start_s: float, plan_us: float, terms: tuple[float, ...]
) -> tuple[float, ...]:
    """The step's record up to its memory row (``records.STEP_RECORD``'s order)."""
    return (start_s, sum(terms), *_plan_fields(plan), plan_us, *terms)  # sum: StepCost.total


def _plan_fields(plan: ExecutionPlan | PlanShape) -> tuple[int, ...]:
    """The fields of a step's record that its plan alone decides, from ``num_spec_rows``
    to ``padded_rows`` (``records.STEP_RECORD``'s order)."""
    graph = plan.graph
    return (
        plan.num_spec_rows,
        plan.num_decode_rows,
        plan.num_prefill_rows,
        plan.num_spec_decode_tokens,
        plan.num_decode_tokens,
        plan.num_prefill_tokens,
        _GRAPH_CODES[graph.kind] if graph else 0,
        graph.num_tokens if graph else 0,
        graph.num_rows if graph else 0,
        plan.padded_tokens - plan.num_tokens,
        plan.padded_rows - plan.num_rows,
    )


def _run_live(
    step: ScheduledStep,
    plan: ExecutionPlan,
    live: LiveStepper,
    log: RequestLog,
    costs: StepCost,
    plan_us: float,
) -> tuple[np.ndarray, StepCost, LiveOutcome]:
    """The live model's accepted drafts per row, and the step's cost terms: measured, the
    engine's whole step (the runner's call as ``model``, the planner's as ``host``)."""
    outcome = live.run(step, plan)
    spec = step.is_spec
    if spec.any():
        drafts = step.batch.num_draft_tokens[spec].astype(np.int64)
        log.record_spec(step.request_ids[spec], drafts, outcome.accepted[spec])
    if live.measured_time:
        costs = StepCost(model=outcome.wall_s, host=plan_us * 1e-6)
    return outcome.accepted, costs, outcome


@attrs.frozen(eq=False)
class StepEvent:
    """One step as the loop ran it, for an observer (``stepplan fidelity`` keeps these).

    Attributes:
        index: the step's number. start_s: when it began on the simulated clock.
        step: the scheduler's batch. plan: its compiled plan. plan_us: measured planning.
        costs: its time, by term.
        accepted: ``[R], int64`` accepted drafts per row.
        outcome: the live engine's result, ``None`` without live mode.
    """

    index: int
    start_s: float
    step: ScheduledStep
    plan: ExecutionPlan
    plan_us: float
    costs: StepCost
    accepted: np.ndarray
    outcome: LiveOutcome | None


def simulate(table: RequestTable, config: SimConfig, **options: Any) -> SimResult:
    """Simulate ``table`` (already windowed; see :func:`prepare_requests`) under
    ``config``, every step kept in memory, as a :class:`SimResult`; ``options`` are
    :func:`run_steps`'s (``progress``, ``live``, ``stop``, ``acceptance``, ``durations``,
    ``observer``, ``native``). With ``config.deployment.replicas`` above 1 the requests go
    to that many replicas (``deployment/loop.py``; ``progress``, ``stop`` and ``native``
    only), and both tables have a ``replica`` column."""
    store = MemoryStore()
    if config.disaggregation.enabled:
        from .deployment.disaggregated import run_disaggregated  # it builds on this module

        split = run_disaggregated(table, config, store, **options)
        itl_s = split.rows.log.itl_s
        return SimResult(store.table(), split.request_columns(), itl_s, split.summary)
    if config.deployment.replicas > 1:
        from .deployment.loop import run_deployment  # it builds on this module

        deployed = run_deployment(table, config, store, **options)
        itl_s = deployed.rows.log.itl_s
        return SimResult(store.table(), deployed.request_columns(), itl_s, deployed.summary)
    end = run_steps(table, config, store, **options)
    return SimResult(store.table(), end.rows.columns(), end.log.itl_s, end.summary)


def run_steps(
    table: RequestTable,
    config: SimConfig,
    store: StepStore,
    *,
    progress: Progress | None = None,
    live: LiveStepper | None = None,
    stop: threading.Event | None = None,
    acceptance: AcceptanceModel | None = None,
    durations: Sequence[float] | None = None,
    observer: Callable[[StepEvent], None] | None = None,
    native: bool | None = None,
    keep_gaps: bool = True,
) -> RunEnd:
    """Simulate ``table`` under ``config``, handing the steps to ``store`` chunk by chunk
    (``outcome.py``). ``progress`` hears of every step. With ``config.live.enabled`` the
    steps run on ``live`` (a new stepper when ``None``). When ``stop`` is set the run ends
    before its next step with the steps so far (``summary["complete"]`` false).
    ``acceptance`` replaces the config's acceptance model; ``durations`` replays step
    times (step ``i`` lasts ``durations[i]`` seconds, its ``engine`` term);
    ``observer`` sees every step (:class:`StepEvent`). ``native``: ``None`` steps on the
    compiled stepper where it is installed, ``False`` in Python only, ``True`` requires
    the compiled one (``sim/stepper.py``; the results are the same). Without
    ``keep_gaps`` the summary consumes the log's inter-token gaps (no copy of them)."""
    wall_start = time.perf_counter()
    loop = _Loop.create(table, config, store, live, acceptance, durations, observer, native)
    scheduler = loop.scheduler
    clock = 0.0
    stopped = False
    # the hot loop: a few calls per step (bench/RESULTS.md, "Simulator speed")
    schedule, run_step = scheduler.schedule_rows, loop.run_step
    idle_at = -1.0  # the clock of the last schedule that found nothing since a step ran
    while not scheduler.done:
        if progress is not None:
            progress.update(len(loop.table), scheduler.num_finished, clock)
        if stop is not None and stop.is_set():
            stopped = True
            break
        found = schedule(clock)
        if found is None:
            ahead = scheduler.next_arrival_s()
            if clock < ahead < np.inf:
                clock = ahead
                continue
            # nothing to wait for: one more try (a schedule that preempted everything
            # admits the next time), then the state would only repeat
            if idle_at == clock:
                raise stall_error(scheduler, clock)
            idle_at = clock
            continue
        clock = run_step(found, clock)
        idle_at = -1.0
    if progress is not None:
        progress.close()
    loop.table.flush()
    wall_s = time.perf_counter() - wall_start
    extra = {"gpu": gpu_summary(config.gpu, loop.cost.profile.device, loop.cost.conv_scale)}
    parts = (table, config, loop.totals, loop.rows, scheduler, wall_s, loop.live, extra)
    summary = run_summary(*parts, complete=not stopped, keep_gaps=keep_gaps)
    return RunEnd(summary, loop.rows, loop.log)


@attrs.define(eq=False)
class _Loop:
    """What the steps of one simulation share, and what they recorded so far
    (``table``: one row of ``steps.csv`` per step)."""

    scheduler: Scheduler
    planner: Planner
    cost: CostModel
    acceptance: AcceptanceModel
    live: LiveStepper | None
    log: RequestLog
    durations: Sequence[float] | None
    observer: Callable[[StepEvent], None] | None
    table: StepTable
    stepper: Stepper
    totals: StepTotals
    rows: RequestRows
    #: Whether a step's time needs only its plan's shape: neither the engine profile
    #: (which reads the batch) nor measured host cost (the clock then reads what
    #: compiling the engine's batch costs) is in use.
    shape_only: bool = attrs.field(init=False)
    #: What a step reads of the shapes the planner hands out again for a repeated shape,
    #: by identity: ``id(shape) -> (shape, _plan_fields(shape), cost.plan_terms(shape))``
    #: (the shape held, so that its id is no other object's).
    _shapes: dict[int, tuple[PlanShape, tuple[int, ...], PlanTerms]] = attrs.field(
        factory=dict, init=False
    )
    #: The planner's ``rows_shapes`` of the scheduler's rows, made at the first step.
    _shape_of: Callable[[int], PlanShape] | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self.shape_only = self.cost.engine is None and self.cost.cost.host_cost != "measured"

    @classmethod
    def create(
        cls,
        table: RequestTable,
        config: SimConfig,
        store: StepStore,
        live: LiveStepper | None,
        acceptance: AcceptanceModel | None,
        durations: Sequence[float] | None,
        observer: Callable[[StepEvent], None] | None,
        native: bool | None = None,
    ) -> _Loop:
        """The loop's parts for ``simulate``'s arguments, every setting checked."""
        layout = plan_memory(config, table, live=config.live.enabled)
        scheduler = make_scheduler(table, config, layout)
        if config.scheduler.implementation != "stepplan":
            native = False  # the compiled stepper binds to stepplan's scheduler's arrays
        plan_config = config.plan
        planner = Planner(plan_config)  # compile_plan's plans, keeping what repeats between steps
        if live is not None and not config.live.enabled:
            raise ValueError("live: a stepper was given but config.live.enabled is false")
        if config.live.enabled and live is None:
            live = LiveStepper.create(config, plan_config, table)
        groups, tensor = config.scheduler.num_groups, config.parallel.tensor
        cost = CostModel.create(config.model, config.gpu, config.cost, groups, tensor)
        if cost.engine is not None:  # a profile of another model or planner would mislead
            cost.engine.check_setup(*engine_setup(config, plan_config))
        acceptance = acceptance or make_acceptance(config.acceptance, config.seed)
        log, totals = RequestLog(table.num_requests), StepTotals()
        memory = scheduler.memory_columns()
        rows = RequestRows(table.arrival_s, table.prompt_tokens, table.output_tokens, log, memory)

        def handed_on(records: np.ndarray, first: int) -> None:
            steps = step_columns(records, first)
            totals.add(steps)
            store.add_steps(steps)
            store.add_requests(rows)

        store.start(rows)
        steps = StepTable(handed_on)
        stepper = Stepper(scheduler, acceptance, log, steps, native=native)
        parts = (scheduler, planner, cost, acceptance, live, log, durations, observer)
        return cls(*parts, steps, stepper, totals, rows)

    def run_step(self, found: tuple[int, int, float], clock: float) -> float:
        """Plan, time and finish the step in ``scheduler.rows`` (``found``: its rows,
        KV tokens and attention pairs) that starts at ``clock``; its end."""
        if self.live is not None or self.observer is not None:
            return self._run_scheduled(self.scheduler.scheduled_step(), clock)
        end, record = self.plan_step(found, clock)
        self.stepper.finish(end, record)
        return end

    def plan_step(self, found: tuple[int, int, float], clock: float) -> tuple[float, tuple]:
        """Plan and time the step in ``scheduler.rows`` that starts at ``clock``: its end
        and its record, for :meth:`Stepper.finish` (a deployment's replica finishes it
        when the clock reaches its end)."""
        count, kv_tokens, attention_pairs = found
        rows = self.scheduler.rows
        groups = self.scheduler.config.num_groups
        if not self.shape_only:
            slots = rows.slots[:count]
            inputs = (  # positional, in StepBatch's field order: the cheapest call
                rows.query_lens[:count],
                rows.computed[:count],
                slots if groups == 1 else np.broadcast_to(slots, (groups, count)),
                rows.drafts[:count],
                rows.accepted[:count],
            )
            start = time.perf_counter_ns()
            plan = self.planner.compile(StepBatch(*inputs))
            plan_us = (time.perf_counter_ns() - start) * 1e-3
            terms = self._terms(plan, kv_tokens, attention_pairs, plan_us)
            record = _record(plan, clock, plan_us, terms)
            return clock + record[1], record
        # the same checks and counts, no batch or plan made (nor views of the rows)
        if self._shape_of is None:
            slots = rows.slots
            self._shape_of = self.planner.rows_shapes(
                rows.query_lens,
                rows.computed,
                slots if groups == 1 else np.broadcast_to(slots, (groups, slots.size)),
                rows.drafts,
                rows.accepted,
            )
        start = time.perf_counter_ns()
        shape = self._shape_of(count)
        plan_us = (time.perf_counter_ns() - start) * 1e-3
        kept = self._shapes.get(id(shape))
        if kept is None or kept[0] is not shape:
            if len(self._shapes) >= _KEPT_SHAPES:
                self._shapes.clear()
            kept = (shape, _plan_fields(shape), self.cost.plan_terms(shape))
            self._shapes[id(shape)] = kept
        if self.durations is None:
            terms = self.cost.step_terms(kept[2], shape, kv_tokens, attention_pairs, plan_us)
        else:
            terms = _replayed(self.durations, len(self.table)).terms()
        total = sum(terms)  # StepCost.total
        return clock + total, (clock, total, *kept[1], plan_us, *terms)

    def _terms(
        self, plan: ExecutionPlan | PlanShape, kv_tokens: int, pairs: float, plan_us: float
    ) -> tuple[float, ...]:
        """The step's cost terms (replayed durations where given)."""
        if self.durations is not None:
            return _replayed(self.durations, len(self.table)).terms()
        return self.cost.terms(plan, kv_tokens, pairs, plan_us)

    def _run_scheduled(self, step: ScheduledStep, clock: float) -> float:
        """:meth:`run_step` for a live engine or an observer, on a :class:`ScheduledStep`."""
        start = time.perf_counter_ns()
        plan = self.planner.compile(step.batch)
        plan_us = (time.perf_counter_ns() - start + step.batch_ns) * 1e-3
        costs = self.cost.step(plan, StepLoad(step.kv_tokens, step.attention_pairs), plan_us)
        outcome, accepted = None, None
        if self.live is not None:
            accepted, costs, outcome = _run_live(step, plan, self.live, self.log, costs, plan_us)
        if self.durations is not None:
            costs = _replayed(self.durations, len(self.table))
        end = clock + costs.total
        self.stepper.finish(end, _record(plan, clock, plan_us, costs.terms()), accepted)
        if self.observer is not None:
            index = len(self.table) - 1
            accepted = self.scheduler.rows.drawn[: step.request_ids.size].copy()
            self.observer(StepEvent(index, clock, step, plan, plan_us, costs, accepted, outcome))
        return end


def _replayed(durations: Sequence[float], index: int) -> StepCost:
    """Step ``index``'s replayed time (its ``engine`` term)."""
    if index >= len(durations):
        raise ValueError(
            f"durations: the replay took more than the {len(durations)} recorded steps"
        )
    return StepCost(engine=float(durations[index]))
