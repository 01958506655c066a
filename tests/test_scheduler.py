"""Scheduler invariants under drawn workloads, and hand-checked schedules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.planner import PlannerConfig, compile_plan
from stepplan.sim.acceptance import FixedLength, PerPosition
from stepplan.sim.scheduler import Scheduler
from stepplan.sim.settings.config import SchedulerConfig
from stepplan.sim.traces import RequestTable


def table(arrivals, prompts, outputs) -> RequestTable:
    order = np.argsort(arrivals, kind="stable")
    return RequestTable(
        arrival_s=np.asarray(arrivals, float)[order],
        prompt_tokens=np.asarray(prompts)[order],
        output_tokens=np.asarray(outputs)[order],
    )


class Tracker:
    """Independent bookkeeping of what the scheduler must have done."""

    def __init__(self, requests: RequestTable) -> None:
        n = requests.num_requests
        self.requests = requests
        self.committed = np.zeros(n, np.int64)
        self.emitted = np.zeros(n, np.int64)
        self.next_accepted = np.ones(n, np.int64)
        self.finished = np.zeros(n, bool)
        self.admitted: list[int] = []


def check_step(step, config: SchedulerConfig, tracker: Tracker, now: float) -> None:
    batch, ids = step.batch, step.request_ids
    req = tracker.requests
    q = batch.query_lens.astype(np.int64)
    assert len(set(ids.tolist())) == ids.size, "a request twice in one step"
    assert not tracker.finished[ids].any(), "a finished request scheduled"
    assert (req.arrival_s[ids] <= now).all(), "scheduled before arrival"
    assert q.sum() <= config.max_num_batched_tokens
    assert ids.size <= min(config.max_num_seqs, config.slots)
    assert (q >= 1).all()
    slots = batch.slots
    assert slots.shape == (config.num_groups, ids.size)
    assert ((slots >= 1) & (slots <= config.slots)).all()
    assert len(set(slots[0].tolist())) == ids.size
    np.testing.assert_array_equal(batch.num_computed_tokens, tracker.committed[ids])
    spec = batch.num_draft_tokens >= 0
    np.testing.assert_array_equal(spec, step.is_spec)
    left = req.output_tokens[ids] - tracker.emitted[ids]
    drafts = batch.num_draft_tokens[spec]
    assert (drafts <= config.num_spec_tokens).all()
    assert (drafts <= left[spec] - 1).all(), "drafts past the end of the output"
    np.testing.assert_array_equal(batch.num_accepted_tokens[spec], tracker.next_accepted[ids][spec])
    prompt_left = req.prompt_tokens[ids] - tracker.committed[ids]
    in_prompt = prompt_left > 0
    # vLLM's placeholder drafts: a last prompt token padded to 1 + k rows, nothing else
    padded = in_prompt & (q > prompt_left)
    assert (prompt_left[padded] == 1).all(), "prefill past the prompt"
    assert (q[padded] == 1 + config.num_spec_tokens).all(), "padded to other than 1 + k"
    assert not (spec & in_prompt).any(), "a spec row still in its prompt"
    if config.num_spec_tokens:
        assert spec[~in_prompt].all(), "a decoding request left spec mode"


def apply_outcome(step, accepted, tracker: Tracker, emitted, finished) -> None:
    batch, ids = step.batch, step.request_ids
    req = tracker.requests
    spec = step.is_spec
    q = batch.query_lens.astype(np.int64)
    decoding = tracker.committed[ids] >= req.prompt_tokens[ids]
    reach = tracker.committed[ids] + np.where(spec, accepted + 1, q)
    tracker.committed[ids] = np.where(decoding, reach, np.minimum(reach, req.prompt_tokens[ids]))
    completes = ~decoding & (tracker.committed[ids] == req.prompt_tokens[ids])
    expected_emitted = np.where(decoding, accepted + 1, completes)
    np.testing.assert_array_equal(emitted, expected_emitted)
    tracker.emitted[ids] += expected_emitted
    tracker.next_accepted[ids[spec]] = accepted[spec] + 1
    done = tracker.emitted[ids] >= req.output_tokens[ids]
    np.testing.assert_array_equal(done, finished)
    tracker.finished[ids[done]] = True


def drive(requests: RequestTable, config: SchedulerConfig, acceptance, step_s: float = 0.01):
    """Run the scheduler to the end, checking every step; returns (scheduler, tracker, steps)."""
    scheduler = Scheduler(requests, config)
    tracker = Tracker(requests)
    plan_config = PlannerConfig(
        num_spec_tokens=config.num_spec_tokens, max_num_seqs=config.max_num_seqs
    )
    clock, steps = 0.0, 0
    limit = 10 * int(requests.prompt_tokens.sum() + requests.output_tokens.sum()) + 100
    while not scheduler.done:
        assert steps < limit, "no progress"
        step = scheduler.schedule(clock)
        if step is None:
            assert scheduler.running.size == 0
            clock = scheduler.next_arrival_s()
            continue
        check_step(step, config, tracker, clock)
        new = [int(i) for i in step.request_ids if int(i) not in tracker.admitted]
        tracker.admitted.extend(new)
        compile_plan(step.batch, plan_config)  # every step's batch compiles
        accepted = np.zeros(step.request_ids.size, np.int64)
        if step.is_spec.any():
            ids = step.request_ids[step.is_spec]
            drafts = step.batch.num_draft_tokens[step.is_spec].astype(np.int64)
            accepted[step.is_spec] = acceptance.draw(ids, scheduler.spec_steps[ids], drafts)
        emitted, finished = scheduler.commit(step, accepted)
        apply_outcome(step, accepted, tracker, emitted, finished)
        clock += step_s
        steps += 1
    return scheduler, tracker, steps


workloads = st.integers(1, 10).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(0, 0.2), min_size=n, max_size=n),
        st.lists(st.integers(1, 40), min_size=n, max_size=n),
        st.lists(st.integers(1, 20), min_size=n, max_size=n),
    )
)
configs = st.builds(
    SchedulerConfig,
    max_num_seqs=st.integers(1, 6),
    max_num_batched_tokens=st.integers(1, 48),
    num_spec_tokens=st.integers(0, 4),
    slot_capacity=st.one_of(st.none(), st.integers(1, 6)),
    num_groups=st.integers(1, 2),
)


@settings(max_examples=150, deadline=None)
@given(workloads, configs, st.floats(0, 1), st.integers(0, 2**16))
def test_invariants_hold_for_drawn_workloads(workload, config, p, seed):
    requests = table(*workload)
    scheduler, tracker, _ = drive(requests, config, PerPosition((p,), seed))
    # every position of prompt and output but the last output token committed exactly once
    expected = requests.prompt_tokens + requests.output_tokens - 1
    np.testing.assert_array_equal(tracker.committed, expected)
    np.testing.assert_array_equal(scheduler.computed, expected)
    np.testing.assert_array_equal(scheduler.emitted, requests.output_tokens)
    assert tracker.finished.all()
    assert scheduler.running.size == 0
    assert sorted(tracker.admitted) == tracker.admitted, "admission is first come first served"
    assert (scheduler.slot == 0).all(), "finished requests keep a slot"
    assert sorted(scheduler._free_slots[: scheduler._num_free].tolist()) == list(
        range(1, config.slots + 1)
    )


def test_spec_schedule_by_hand():
    # prompt 10, output 5, Q = 4, 2 drafts accepted per step
    requests = table([0.0], [10], [5])
    config = SchedulerConfig(num_spec_tokens=3)
    scheduler = Scheduler(requests, config)
    step = scheduler.schedule(0.0)
    assert step.batch.query_lens.tolist() == [10] and not step.is_spec[0]
    assert scheduler.commit(step, np.zeros(1, np.int64))[0].tolist() == [1]
    step = scheduler.schedule(0.0)  # first decode is spec, 3 drafts, first accepted count 1
    assert step.batch.num_draft_tokens.tolist() == [3]
    assert step.batch.num_accepted_tokens.tolist() == [1]
    emitted, finished = scheduler.commit(
        step, FixedLength(3.0).draw(step.request_ids, np.zeros(1, np.int64), np.full(1, 3))
    )
    assert emitted.tolist() == [3] and not finished[0]
    step = scheduler.schedule(0.0)  # one token left: a spec row with 0 drafts
    assert step.batch.num_draft_tokens.tolist() == [0]
    assert step.batch.query_lens.tolist() == [1]
    assert step.batch.num_accepted_tokens.tolist() == [3]
    emitted, finished = scheduler.commit(step, np.zeros(1, np.int64))
    assert emitted.tolist() == [1] and finished[0]
    assert scheduler.computed.tolist() == [14] and scheduler.done


def test_chunked_prefill_and_budget_trims_drafts():
    requests = table([0.0, 0.0], [3, 10], [9, 2])
    scheduler = Scheduler(requests, SchedulerConfig(max_num_batched_tokens=6, num_spec_tokens=3))
    step = scheduler.schedule(0.0)
    assert step.request_ids.tolist() == [0, 1]
    assert step.batch.query_lens.tolist() == [3, 3]  # request 1 gets the remaining budget
    scheduler.commit(step, np.zeros(2, np.int64))
    step = scheduler.schedule(0.0)
    # running first: request 0 asks 1 + 3 drafts, request 1 gets the 2 tokens left
    assert step.batch.query_lens.tolist() == [4, 2]
    assert step.batch.num_draft_tokens.tolist() == [3, -1]
    scheduler.commit(step, np.zeros(2, np.int64))
    step = scheduler.schedule(0.0)
    assert step.batch.query_lens.tolist() == [4, 2]  # 1 + 3 drafts, then prefill 2 of 5 left
    step_budget = SchedulerConfig(max_num_batched_tokens=2, num_spec_tokens=3)
    scheduler = Scheduler(table([0.0], [1], [9]), step_budget)
    scheduler.commit(scheduler.schedule(0.0), np.zeros(1, np.int64))
    step = scheduler.schedule(0.0)
    assert step.batch.num_draft_tokens.tolist() == [1]  # the budget trims 3 drafts to 1


def test_slot_capacity_holds_requests_back_and_slots_are_reused():
    requests = table([0.0, 0.0, 0.0], [2, 2, 2], [1, 1, 1])
    scheduler = Scheduler(requests, SchedulerConfig(max_num_seqs=4, slot_capacity=1))
    seen = []
    while not scheduler.done:
        step = scheduler.schedule(0.0)
        assert step.request_ids.size == 1
        seen.append((int(step.request_ids[0]), int(step.batch.slots[0, 0])))
        scheduler.commit(step, np.zeros(1, np.int64))
    assert seen == [(0, 1), (1, 1), (2, 1)]


def test_waits_for_arrivals():
    requests = table([0.0, 5.0], [4, 4], [2, 2])
    scheduler = Scheduler(requests, SchedulerConfig())
    scheduler.commit(scheduler.schedule(0.0), np.zeros(1, np.int64))
    scheduler.commit(scheduler.schedule(0.1), np.zeros(1, np.int64))
    assert scheduler.schedule(0.2) is None
    assert scheduler.next_arrival_s() == 5.0
    assert scheduler.schedule(5.0).request_ids.tolist() == [1]


@pytest.mark.parametrize("groups", [1, 3])
def test_groups_share_the_slot_index(groups):
    requests = table([0.0, 0.0], [3, 3], [2, 2])
    step = Scheduler(requests, SchedulerConfig(num_groups=groups)).schedule(0.0)
    assert step.batch.slots.shape == (groups, 2)
    assert (step.batch.slots == step.batch.slots[0]).all()
