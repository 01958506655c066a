"""One engine instance of a deployment: its scheduler, memory, planner, cost model and
stepper, over the requests the router sends it.

The router hands requests over one at a time, in arrival order, so a replica's requests
are its own trace, sorted by arrival, that grows as the run goes: request ``k`` of the
replica is its ``k``-th arrival (:attr:`Replica.request_ids` maps it to the trace's
row). The scheduler's per-request arrays are sized for the whole trace, and a row not
routed yet arrives at ``inf``, so the scheduler and the compiled stepper run on them as
they run on a trace given whole. A step is planned and timed when it starts
(:meth:`Replica.start`) and committed when the clock reaches its end
(:meth:`Replica.commit`): in between, the router sees the replica as it was when
the step began.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from stepplan.planner import Planner, PlannerConfig, StepBatch

from ..acceptance import AcceptanceModel
from ..memory_sizing import MemoryLayout
from ..results.records import RequestLog, RequestRows, StepTable, step_columns
from ..results.summary import StepTotals
from ..run import _Loop  # the single engine's step, planned and timed the same way
from ..scheduler import Scheduler
from ..settings.config import SimConfig
from ..state_blocks import block_pool
from ..stepper import Stepper
from ..timing.cost import CostModel
from ..traces import RequestTable

#: Takes a chunk of a replica's steps (``schema.STEPS_IN_MEMORY`` columns, ``[k]``
#: each, views valid during the call) with the replica's index.
ReplicaSink = Callable[[int, Mapping[str, np.ndarray]], None]


class Replica:
    """One engine instance over the requests routed to it (see the module docstring).

    Args:
        index: its number in the deployment (``steps.csv``'s ``replica``).
        table: the whole trace (requests are copied from it as they are routed).
        layout: the memory split, the same for every replica.
        config: the run's settings. plan_config: the planner's settings.
        cost: the cost model (pure: shared by the replicas).
        acceptance: this replica's acceptance model.
        sink: where its steps go, a chunk at a time.
        native: as :func:`~stepplan.sim.run.run_steps`'s.
        preloads: its requests come with their prompts computed elsewhere
            (``Scheduler.preloaded``: a disaggregated deployment's decode pool).
    """

    def __init__(
        self,
        index: int,
        table: RequestTable,
        layout: MemoryLayout,
        config: SimConfig,
        plan_config: PlannerConfig,
        cost: CostModel,
        acceptance: AcceptanceModel,
        sink: ReplicaSink,
        *,
        native: bool | None = None,
        preloads: bool = False,
    ) -> None:
        n = table.num_requests
        self.index = index
        self._source = table
        self.request_ids = np.zeros(n, np.int64)  # trace row of local request k
        self.count = 0  # requests routed here
        self.busy_until = math.inf  # end of the step in flight (inf: none)
        self._pending: tuple[float, tuple] | None = None
        self._prompt_sum = np.zeros(n + 1, np.int64)  # prompt tokens of the first k
        hashes = table.prefix_offsets is not None and table.prefix_blocks is not None
        self._offsets = np.zeros(n + 1, np.int64) if hashes else None
        self._blocks = np.zeros(table.prefix_blocks.size, np.int64) if hashes else None  # type: ignore[union-attr]
        shell = RequestTable(np.zeros(n), np.ones(n), np.ones(n), self._offsets, self._blocks)
        scheduler = Scheduler(shell, config.scheduler, block_pool(layout, shell))
        # writable in place of the shell's read-only rows: routing fills them
        scheduler.arrival = np.full(n, np.inf)
        scheduler.prompt = np.zeros(n, np.int64)
        scheduler.output = np.zeros(n, np.int64)
        scheduler.takes_preloaded = preloads
        self.scheduler = scheduler
        self.totals = StepTotals()
        self.queue_busy: list[float] = []  # per chunk: sum of num_waiting * duration_s
        self.peak_waiting = 0
        log = RequestLog(n)
        memory = scheduler.memory_columns()
        rows = RequestRows(scheduler.arrival, scheduler.prompt, scheduler.output, log, memory)

        def handed_on(records: np.ndarray, first: int) -> None:
            steps = step_columns(records, first)
            self.totals.add(steps)
            waiting = steps["num_waiting"]
            self.queue_busy.append(float((waiting * steps["duration_s"]).sum()))
            if waiting.size:
                self.peak_waiting = max(self.peak_waiting, int(waiting.max()))
            sink(index, steps)

        steps = StepTable(handed_on)
        stepper = Stepper(scheduler, acceptance, log, steps, native=native)
        parts = (scheduler, Planner(plan_config), cost, acceptance, None, log, None, None)
        self._loop = _Loop(*parts, steps, stepper, StepTotals(), rows)
        self.log, self.rows = log, rows
        # bound once: the loop calls them every step
        self._schedule, self._plan = scheduler.schedule_rows, self._loop.plan_step
        self._finish = stepper.finish
        self._seconds_per_token = _prefill_seconds_per_token(plan_config, cost, config)

    # -- what routers read (routers.ReplicaView) --------------------------------------

    @property
    def outstanding(self) -> int:
        """Requests routed here and not finished."""
        return self.count - self.scheduler.num_finished

    @property
    def kv_usage(self) -> float:
        """Share of the KV blocks running requests hold (running share of the slots
        without a memory model)."""
        pool = self.scheduler.pool
        if pool is None or pool.capacity <= 0:
            return self.scheduler.running.size / max(1, self.scheduler.slot_capacity)
        return pool.used_blocks / pool.capacity

    def cached_prefix(self, hashes: Sequence[int]) -> int:
        """The leading run of ``hashes`` its prefix cache holds (0 without caching)."""
        pool = self.scheduler.pool
        if pool is None or not pool.caching:
            return 0
        return pool.hashes_cached(list(hashes))

    def predicted_wait_s(self, now_s: float) -> float:
        """What is left of the step in flight, plus the prompt tokens of the requests
        routed and never admitted at the cost model's full-prefill rate."""
        admitted = self.scheduler.next_admit
        queued = int(self._prompt_sum[self.count] - self._prompt_sum[admitted])
        left = self.busy_until - now_s if self._pending is not None else 0.0
        return max(0.0, left) + queued * self._seconds_per_token

    # -- what the loop does -----------------------------------------------------------

    def route(self, request: int) -> None:
        """Take trace row ``request`` as this replica's next request."""
        source, k = self._source, self.count
        scheduler = self.scheduler
        prompt = int(source.prompt_tokens[request])
        scheduler.arrival[k] = source.arrival_s[request]
        scheduler.prompt[k] = prompt
        scheduler.output[k] = source.output_tokens[request]
        scheduler.target[k] = prompt
        self._prompt_sum[k + 1] = self._prompt_sum[k] + prompt
        if self._offsets is not None and source.prefix_offsets is not None:
            start, stop = source.prefix_offsets[request], source.prefix_offsets[request + 1]
            first = self._offsets[k]
            self._offsets[k + 1] = first + stop - start
            self._blocks[first : first + stop - start] = source.prefix_blocks[start:stop]  # type: ignore[index]
            pool = scheduler.pool
            if pool is not None and pool.caching:
                pool.hashed[k] = pool.layout.cacheable_entries(int(stop - start), prompt)
        self.request_ids[k] = request
        self.count = k + 1

    @property
    def stepping(self) -> bool:
        """A step is in flight."""
        return self._pending is not None

    def start(self, clock: float) -> float | None:
        """Schedule, plan and time a step at ``clock``: its end (also
        :attr:`busy_until`), or ``None`` when nothing can run."""
        found = self._schedule(clock)
        if found is None:
            return None
        end, record = self._plan(found, clock)
        self._pending = (end, record)
        self.busy_until = end
        return end

    def commit(self) -> None:
        """Finish the step in flight: its tokens, finished requests and record."""
        assert self._pending is not None, "no step in flight"
        end, record = self._pending
        self._finish(end, record)
        self._pending = None
        self.busy_until = math.inf

    @property
    def num_steps(self) -> int:
        """Steps started (the one in flight included)."""
        return len(self._loop.table) + (self._pending is not None)

    def flush(self) -> None:
        """Hand on the steps still held."""
        self._loop.table.flush()

    def spec_steps(self) -> np.ndarray:
        """``[count], int64`` spec steps of each of its requests."""
        return self.scheduler.spec_steps[: self.count]


def _prefill_seconds_per_token(
    plan_config: PlannerConfig, cost: CostModel, config: SimConfig
) -> float:
    """The cost model's time per prompt token of a step that prefills a whole token
    budget from scratch (what a queued prompt costs a replica); planned apart from the
    replica's planner, which keeps what repeats between its own steps."""
    budget = config.scheduler.max_num_batched_tokens
    groups = config.scheduler.num_groups
    batch = StepBatch(
        query_lens=np.array([budget], np.int32),
        num_computed_tokens=np.zeros(1, np.int32),
        slots=np.ones(1 if groups == 1 else (groups, 1), np.int32),
        num_draft_tokens=np.full(1, -1, np.int32),
        num_accepted_tokens=np.ones(1, np.int32),
    )
    plan = Planner(plan_config).compile(batch)
    terms = cost.terms(plan, budget, budget * (budget + 1) / 2, 0.0)
    return sum(terms) / budget
