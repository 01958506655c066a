"""The KV block pool, preemption by recompute and the prefix cache, at the scheduler level.

Random traces run with the accounting check on (``MemoryLayout.check``) and an
independent tracker; hand-built cases pin the preemption order and the hit counts.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.sim.memory import COPY, BlockPool
from stepplan.sim.memory_sizing import MemoryLayout
from stepplan.sim.scheduler import Scheduler
from stepplan.sim.settings.config import SchedulerConfig
from stepplan.sim.state_blocks import block_pool
from stepplan.sim.traces import RequestTable


def make_table(arrivals, prompts, outputs, hashes=None) -> RequestTable:
    offsets = blocks = None
    if hashes is not None:
        offsets = np.concatenate([[0], np.cumsum([len(h) for h in hashes])]).astype(np.int64)
        blocks = np.array([b for h in hashes for b in h], np.int64)
    return RequestTable(
        arrival_s=arrivals,
        prompt_tokens=prompts,
        output_tokens=outputs,
        prefix_offsets=offsets,
        prefix_blocks=blocks,
    )


def make_layout(
    num_blocks,
    *,
    block_size=1,
    slots=8,
    prefix=False,
    prefix_block_tokens=4,
    align=0,
    state=0,
    state_groups=0,
    attention_groups=1,
):
    # entries as plan_memory makes them: a KV block, or an aligned block in align mode;
    # state_groups: conv states as tracked blocks of the pool (memory.align_state_blocks),
    # whose KV block is the aligned block
    return MemoryLayout(
        budget_bytes=float(num_blocks),
        budget_source="test",
        weights_bytes=0.0,
        slots=slots,
        configured_slots=slots,
        slot_bytes=0,
        block_size=block_size,
        block_bytes=1.0,
        num_blocks=num_blocks,
        prefix_caching=prefix,
        prefix_block_tokens=prefix_block_tokens,
        check=True,
        entry_tokens=(align or block_size) if prefix else prefix_block_tokens,
        state_blocks=state,
        align_tokens=align if prefix else 0,
        attention_groups=attention_groups,
        align_state_blocks=bool(state_groups),
        state_groups=state_groups,
    )


class Run:
    """Drives a scheduler to the end with random acceptance, tracking independently
    what each request committed and what it must have lost or been saved."""

    def __init__(self, table, config, layout, seed=0) -> None:
        n = table.num_requests
        self.table, self.config = table, config
        self.pool = block_pool(layout, table) if layout is not None else None
        self.scheduler = Scheduler(table, config, self.pool)
        self.rng = np.random.default_rng(seed)
        self.state = np.zeros(n, np.int64)  # committed tokens of the current admission
        self.committed = np.zeros(n, np.int64)  # over the whole life
        self.recomputed = np.zeros(n, np.int64)
        self.cached = np.zeros(n, np.int64)
        self.emitted = np.zeros(n, np.int64)
        self.preempted: list[int] = []  # preempted requests, in order
        self.steps = 0

    def run(self, max_steps: int = 20_000) -> Run:
        clock = 0.0
        scheduler = self.scheduler
        while not scheduler.done:
            before = scheduler.preemptions.copy()
            step = scheduler.schedule(clock)
            self.preempted += _preempted_in_order(scheduler, before)
            if step is None:
                arrival = scheduler.next_arrival_s()
                assert np.isfinite(arrival) and arrival > clock, "stalled"
                clock = arrival
                continue
            self._observe(step)
            clock += 0.01
            self.steps += 1
            assert self.steps < max_steps, "no progress"
        return self

    def _observe(self, step) -> None:
        if self.pool is not None:
            assert self.pool.used_blocks <= self.pool.capacity
            assert step.memory.kv_used_blocks == self.pool.used_blocks
        ids = step.request_ids
        computed = step.batch.num_computed_tokens.astype(np.int64)
        moved = computed != self.state[ids]
        for request, start in zip(ids[moved].tolist(), computed[moved].tolist(), strict=True):
            lost = int(self.state[request])  # a (re)admission: a cache hit or a recompute
            self.recomputed[request] += max(0, lost - start)
            self.cached[request] += max(0, start - lost)
            self.state[request] = start
        drafts = step.batch.num_draft_tokens.astype(np.int64)
        accepted = np.where(step.is_spec, self.rng.integers(0, np.maximum(drafts, 0) + 1), 0)
        emitted, _ = self.scheduler.commit(step, accepted)
        q = step.batch.query_lens.astype(np.int64)
        done = np.where(step.is_spec, accepted + 1, q)
        # a prefill padded with vLLM's placeholder drafts computes its prompt's rest only
        prompt_left = self.table.prompt_tokens[ids] + self.emitted[ids] - computed
        done = np.where(step.decoding, done, np.minimum(done, prompt_left))
        self.state[ids] += done
        self.committed[ids] += done
        self.emitted[ids] += emitted


def _preempted_in_order(scheduler, before) -> list[int]:
    # within one step preemption runs from the end of the running list; the queue's
    # front holds the last one preempted
    count = int((scheduler.preemptions - before).sum())
    return list(reversed(scheduler.resumed[:count]))


@st.composite
def workloads(draw, tracked=False):
    # tracked: always conv states as tracked blocks of the pool (align_state_blocks)
    n = draw(st.integers(1, 10))
    prompts = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    arrivals = sorted(
        draw(st.lists(st.sampled_from([0.0, 0.02, 0.1, 0.5]), min_size=n, max_size=n))
    )
    block_size = draw(st.sampled_from([1, 2, 4]))
    prefix = tracked or draw(st.booleans())
    prefix_block_tokens = block_size * draw(st.sampled_from([1, 2, 4]))
    hashes = None
    if prefix:  # requests of one family share every block id, so a shared id is a shared prefix
        families = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
        hashes = [
            [family * 1000 + j for j in range(-(-p // prefix_block_tokens))]
            for family, p in zip(families, prompts, strict=True)
        ]
    table = make_table(arrivals, prompts, outputs, hashes)
    # align mode (a hybrid model caching prefixes): entries of 1-3 KV blocks, which
    # need not divide the hashed blocks
    align = block_size * draw(st.integers(1, 3)) * (tracked or draw(st.booleans()))
    spec_tokens = draw(st.integers(0, 3))
    # conv states in the pool (vLLM's hybrid layout): untracked where no prefix is
    # cached; in align mode tracked block by block (memory.align_state_blocks), 1-2
    # state groups and 1-2 attention groups, the KV block the aligned block
    on = prefix and align and (tracked or draw(st.booleans()))
    state_groups = draw(st.integers(1, 2)) if on else 0
    state = state_groups * (1 + spec_tokens) if prefix else draw(st.integers(0, 4))
    groups = draw(st.integers(1, 2)) if state_groups else 1
    if state_groups:
        block_size = align
    probe = make_layout(1, block_size=block_size, state=state, attention_groups=groups)
    longest = int(probe.blocks_for(table.prompt_tokens + table.output_tokens - 1).max())
    # a request its hit leaves one token takes placeholder drafts past its last position
    # (vLLM's padding): a pool only as large as the longest request may never admit it;
    # tracked, a request also holds a hit's state and the state it left a step longer
    layout = make_layout(
        longest + spec_tokens + 2 * state_groups + draw(st.integers(0, 8)),
        block_size=block_size,
        slots=draw(st.integers(1, 6)),
        prefix=prefix,
        prefix_block_tokens=prefix_block_tokens,
        align=align,
        state=state,
        state_groups=state_groups,
        attention_groups=groups,
    )
    config = SchedulerConfig(
        max_num_seqs=draw(st.integers(1, 6)),
        # check_config refuses a budget below Q: a padded one-token prompt never fits it
        # and align mode one below an aligned block: no prefill chunk could run
        max_num_batched_tokens=draw(st.integers(max(1 + spec_tokens, align), 64)),
        num_spec_tokens=spec_tokens,
    )
    return table, config, layout, draw(st.integers(0, 2**16))


@settings(max_examples=150, deadline=None)
@given(workloads())
def test_every_request_finishes_with_nothing_leaked(workload):
    table, config, layout, seed = workload
    run = Run(table, config, layout, seed).run()
    scheduler, pool = run.scheduler, run.pool
    np.testing.assert_array_equal(run.emitted, table.output_tokens)
    np.testing.assert_array_equal(scheduler.emitted, table.output_tokens)
    assert pool.used_blocks == 0 and pool.free + pool.cached_blocks == pool.capacity
    assert not pool.held.any() and not scheduler.slot.any()
    # every position but the last output token once, plus recomputes, less cache hits
    lifetime = table.prompt_tokens + table.output_tokens - 1
    np.testing.assert_array_equal(run.committed, lifetime + run.recomputed - run.cached)
    np.testing.assert_array_equal(scheduler.recomputed, run.recomputed)
    np.testing.assert_array_equal(scheduler.cached, run.cached)
    assert scheduler.preemptions.sum() == len(run.preempted)
    if not layout.prefix_caching:
        assert not run.cached.any()


@settings(max_examples=150, deadline=None)
@given(workloads(tracked=True))
def test_tracked_state_blocks_finish_with_nothing_leaked(workload):
    # the same with conv states as tracked blocks of the pool (memory.align_state_blocks):
    # the accounting check holds every step, and at the end only cached entries hold blocks
    test_every_request_finishes_with_nothing_leaked.hypothesis.inner_test(workload)
    pool = Run(*workload).run().pool
    assert not pool.states and pool.cached_blocks == pool.capacity - pool.free


def test_a_huge_pool_changes_nothing():
    rng = np.random.default_rng(3)
    n = 40
    table = make_table(
        np.sort(rng.uniform(0, 2, n)), rng.integers(1, 300, n), rng.integers(1, 60, n)
    )
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128, num_spec_tokens=2)
    with_pool = Run(table, config, make_layout(10**9, block_size=16, slots=8), seed=1).run()
    plain = Run(table, config, None, seed=1).run()  # no memory model at all
    assert with_pool.steps == plain.steps
    np.testing.assert_array_equal(with_pool.committed, plain.committed)
    assert not with_pool.scheduler.preemptions.any()


def overload_run():
    """Three 4-token prompts of 6 output tokens in 14 one-token blocks: see the test."""
    table = make_table([0.0] * 3, [4, 4, 4], [6, 6, 6])
    config = SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=100, num_spec_tokens=0)
    return Run(table, config, make_layout(14, block_size=1, slots=3)).run()


def test_overload_preempts_the_most_recently_admitted_first():
    # step 1 admits all three (12 blocks); step 2: r0 and r1 grow to 5 positions, r2
    # finds no block and, being the last running, preempts itself; step 5: r0 grows
    # to 8 and preempts r1 (7 blocks); r1 and r2 return once r0 finishes, and r2
    # preempts itself once more when r1 takes the last block.
    run = overload_run()
    assert run.preempted == [2, 1, 2]
    np.testing.assert_array_equal(run.scheduler.preemptions, [0, 1, 2])
    # r1 lost its 4 + 3 tokens once; r2 its 4, then 4 + 1 after resuming
    np.testing.assert_array_equal(run.recomputed, [0, 7, 9])
    np.testing.assert_array_equal(run.scheduler.recomputed, [0, 7, 9])


def test_a_resumed_request_prefills_its_prompt_and_output_and_then_emits():
    table = make_table([0.0] * 3, [4, 4, 4], [6, 6, 6])
    config = SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=100, num_spec_tokens=0)
    pool = BlockPool(make_layout(14, block_size=1, slots=3), table)
    scheduler = Scheduler(table, config, pool)
    resumed_rows = []
    clock = 0.0
    while not scheduler.done:
        step = scheduler.schedule(clock)
        rows = zip(step.request_ids.tolist(), step.batch.query_lens.tolist(), strict=True)
        for row, (request, q) in enumerate(rows):
            if scheduler.preemptions[request] and not step.decoding[row]:
                resumed_rows.append((request, int(step.batch.num_computed_tokens[row]), q))
                assert step.emits_first[row]
        scheduler.commit(step, np.zeros(step.request_ids.size, np.int64))
        clock += 0.01
    # r1 was preempted with 4 tokens emitted (7 computed): it prefills 4 + 4 from 0 and
    # emits its 5th; r2 with 1 emitted (4 + 1), and again with 2 (4 + 2)
    assert resumed_rows == [(1, 0, 8), (2, 0, 5), (2, 0, 6)]


def test_prefix_cache_hits_count_whole_entries():
    # blocks of 8 tokens hashed, KV blocks (entries) of 4
    hashes = [[1, 2, 3], [1, 2, 9], [1, 2], [1, 5, 6]]
    prompts = [20, 17, 16, 24]
    table = make_table([0.0, 10.0, 20.0, 30.0], prompts, [2, 2, 2, 2], hashes)
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, num_spec_tokens=0)
    layout = make_layout(200, block_size=4, prefix=True, prefix_block_tokens=8)
    run = Run(table, config, layout).run()
    # r0 caches its five full blocks; r1 hits four (16 of 17 tokens); r2's 16 tokens
    # are four blocks, but one token must be computed, so it hits three and computes
    # the fourth again, cached as a copy of entry 5 (vLLM keeps both blocks under the
    # hash); r3 shares only the first hashed block's two, and caches four of its own
    np.testing.assert_array_equal(run.cached, [0, 16, 12, 8])
    np.testing.assert_array_equal(run.scheduler.cached, [0, 16, 12, 8])
    # entry j of hash h is h * 2 + j
    copy = (COPY, 1, 5)
    assert run.pool.entries == dict.fromkeys([2, 3, 4, 5, 6, 10, 11, 12, 13, copy], 0)
    assert run.pool.copies == {5: [copy]}
    assert run.pool.cached_blocks == 10 * layout.entry_blocks == 10


def test_unreferenced_entries_are_evicted_tail_first():
    table = make_table([0.0, 0.0, 0.0], [16, 16, 16], [1, 1, 1], [[1, 2], [7, 8], [1, 2]])
    layout = make_layout(8, block_size=4, prefix=True, prefix_block_tokens=8)
    pool = BlockPool(layout, table)  # an entry is one 4-token block, h * 2 + j
    ids = np.array([0], np.int64)
    assert pool.admit(0, [], 16, 16) and pool.held[0] == 4
    pool.register(ids, np.array([16]), np.array([16]), np.array([0]))  # both hashed blocks
    assert pool.entries == {2: 1, 3: 1, 4: 1, 5: 1} and pool.free == 4
    pool.release(ids)
    assert list(pool.lru) == [5, 4, 3, 2] and pool.used_blocks == 0  # the tail is oldest
    assert pool.admit(1, [], 24, 24) and pool.free == 0  # 6 blocks: entries 5, 4 evicted
    assert list(pool.lru) == [3, 2]
    assert pool.grow(1, 28) and list(pool.lru) == [2] and pool.free == 0  # entry 3 evicted
    assert pool.lookup(2, 16) == [2]  # its second block is gone
    assert pool.lookup(0, 17) == [2]
    assert not pool.grow(1, 64)  # 16 blocks: more than the pool, nothing changes
    assert pool.held[1] == 7 and list(pool.lru) == [2]


def test_admission_never_overtakes_a_request_that_does_not_fit():
    table = make_table([0.0, 0.005, 0.005], [10, 12, 2], [5, 1, 1])
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=100, num_spec_tokens=0)
    scheduler = Scheduler(table, config, BlockPool(make_layout(20, block_size=1), table))
    step = scheduler.schedule(0.0)
    scheduler.commit(step, np.zeros(1, np.int64))
    step = scheduler.schedule(0.01)  # request 1 needs 12 of the 9 free blocks
    assert step.request_ids.tolist() == [0] and step.memory.num_waiting == 2


@pytest.mark.parametrize("blocks", [10, 12])
def test_the_accounting_check_catches_a_leak(blocks):
    table = make_table([0.0], [8], [2])
    pool = BlockPool(make_layout(blocks, block_size=1), table)
    scheduler = Scheduler(table, SchedulerConfig(num_spec_tokens=0), pool)
    step = scheduler.schedule(0.0)
    scheduler.commit(step, np.zeros(1, np.int64))
    pool.free -= 1  # a block lost
    with pytest.raises(AssertionError, match="leaked"):
        scheduler.schedule(0.1)


@settings(max_examples=200, deadline=None)
@given(
    held=st.lists(st.integers(0, 9), min_size=1, max_size=30),
    grow=st.lists(st.integers(-20, 40), min_size=1, max_size=30),
    free=st.integers(0, 60),
    block_size=st.sampled_from([1, 3, 16]),
)
def test_growing_a_few_rows_in_python_equals_numpy(held, grow, free, block_size):
    rows = min(len(held), len(grow))
    table = make_table([0.0] * rows, [1] * rows, [1] * rows)
    pools = []
    for few_rows in (0, 64):  # numpy's path, then the plain-Python one
        pool = BlockPool(make_layout(10**6, block_size=block_size), table)
        pool.held[:] = held[:rows]
        pool.free = free
        positions = np.maximum(np.array(held[:rows]) * block_size + grow[:rows], 0)
        ids = np.arange(rows, dtype=np.int64)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("stepplan.sim.memory._FEW_ROWS", few_rows)
            pools.append((pool.grow_all(ids, positions), pool.free, pool.held.tolist()))
    assert pools[0] == pools[1]


@pytest.mark.parametrize("policy", ["fcfs", "shortest-prompt"])
def test_admission_waits_until_the_whole_prompt_fits(policy):
    """vLLM 0.33 admits a request only when the free blocks hold its whole prompt,
    though it allocates its first chunk only: in 12 blocks r0 takes 8, and r1 (an
    8-token prompt whose first chunk of 2 would fit) waits until r0 has finished."""
    table = make_table([0.0, 0.0], [8, 8], [2, 2])
    config = SchedulerConfig(
        max_num_seqs=2, max_num_batched_tokens=10, num_spec_tokens=0, policy=policy
    )
    scheduler = Scheduler(table, config, BlockPool(make_layout(12, slots=2), table))
    admitted = []
    clock = 0.0
    while not scheduler.done:
        step = scheduler.schedule(clock)
        admitted.append(step.request_ids.tolist())
        scheduler.commit(step, np.zeros(step.request_ids.size, np.int64))
        clock += 0.01
    assert admitted == [[0], [0], [1], [1]]
    assert scheduler.preemptions.sum() == 0


def test_entries_are_hits_in_the_step_that_allocates_them_and_whole_kv_blocks():
    # attention only (no kept state): an entry is one 4-token KV block of an 8-token
    # hashed block. r0's 14 tokens fill three entries (its second hashed block is
    # partial, 6 tokens: one full KV block), registered when step 0 allocates them;
    # r1, admitted later in that step, hits all three: 12 tokens, as vLLM would
    table = make_table([0.0, 0.0], [14, 16], [2, 2], [[1, 2], [1, 2]])
    layout = make_layout(200, block_size=4, prefix=True, prefix_block_tokens=8)
    assert layout.entry_tokens == 4 and layout.entry_blocks == 1
    pool = BlockPool(layout, table)
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, num_spec_tokens=0)
    step = Scheduler(table, config, pool).schedule(0.0)
    assert step.request_ids.tolist() == [0, 1]
    assert step.batch.query_lens.tolist() == [14, 4]
    assert step.batch.num_computed_tokens.tolist() == [0, 12]
    # keys: hash * 2 + index of the KV block in its hashed block; r1 fills the last
    assert pool.entries == {2: 2, 3: 2, 4: 2, 5: 1}
    assert pool.entry_keys(1, 1, 4) == [3, 4, 5]


def test_a_preempted_request_hits_its_own_output_blocks():
    # vLLM caches every full block, output tokens' too: a request that lost its blocks
    # finds them again, past its prompt's trace hashes (keyed (request, index))
    table = make_table([0.0], [8], [9], [[1]])
    layout = make_layout(8, block_size=4, prefix=True, prefix_block_tokens=8)
    pool = BlockPool(layout, table)
    ids = np.array([0], np.int64)
    assert pool.admit(0, [], 8, 8)
    pool.register(ids, np.array([8]), np.array([8]), np.array([0]))
    assert pool.grow(0, 16)  # decoding with drafts: 13 tokens known, 16 positions
    pool.register(ids, np.array([16]), np.array([8]), np.array([5]))
    assert list(pool.entries) == [2, 3, (0, 2)]  # the drafts' block is not full of known tokens
    pool.release(ids)
    assert list(pool.lru) == [(0, 2), 3, 2]
    assert pool.lookup(0, 13) == [2, 3, (0, 2)]  # 12 of its 13 tokens
