"""``--scheduler vllm``: the installed vLLM's scheduler deciding the steps, and the
step-by-step comparison with stepplan's (``docs/scheduler_vllm.md``)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from importlib import resources

import attrs
import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from stepplan.sim import admission
from stepplan.sim.acceptance import make_acceptance
from stepplan.sim.admission import AdmissionPolicy
from stepplan.sim.memory_sizing import plan_memory
from stepplan.sim.results.outcome import MemoryStore
from stepplan.sim.run import run_steps, simulate
from stepplan.sim.scheduler import Scheduler, vllm_engine_scheduler
from stepplan.sim.scheduler.state import ROWS, SPEC
from stepplan.sim.scheduler.vllm_engine_scheduler import (
    VllmEngineScheduler,
    VllmUnavailable,
    check_vllm,
    prompt_tokens,
)
from stepplan.sim.scheduler.vllm_requests import hashed_block_tokens
from stepplan.sim.scheduler_diff import compare_schedulers
from stepplan.sim.settings.config import ConfigError, SimConfig, with_settings
from stepplan.sim.traces import RequestTable, load_trace
from stepplan.sim.workloads import parse_synthetic

#: The tests that drive vLLM (CI installs it); the rest check the refusals without it.
requires_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"
)
WORKLOAD = "synthetic:n=80,rate=30,cv2=3,prompt=zipf:1.1:3000,output=uniform:1:60"
#: A cache small enough that stepplan's scheduler preempts (prompts up to 3,000 tokens).
SMALL_CACHE = {
    "memory.kv_cache_gib": 0.3,
    "scheduler.max_num_seqs": 16,
    "scheduler.max_num_batched_tokens": 1024,
}

#: The embedded trace's 7,435-token prompts in a cache of about 500 blocks, attention
#: only (a hybrid model's conv states share vLLM's pool: another memory split).
PREEMPTING = {
    "model.conv_layers": 0,
    "memory.kv_cache_gib": 0.6,
    "scheduler.max_num_seqs": 32,
    "scheduler.max_num_batched_tokens": 2048,
}


def _table(spec: str = WORKLOAD):
    return parse_synthetic(spec, seed=3)


def _embedded(limit: int = 300):
    """The first requests of the embedded Azure code trace."""
    path = resources.files("stepplan.sim").joinpath("data/azure_llm_2023_code.csv")
    return load_trace(str(path)).limit(limit)


def _vllm(config: SimConfig) -> SimConfig:
    return with_settings(config, {"scheduler.implementation": "vllm"})


def _drive(table, config: SimConfig):
    """Run ``table`` on the vLLM path step by step, checking the accounting each step;
    the scheduler at the end."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    layout = plan_memory(config, table)
    scheduler = VllmEngineScheduler(table, config.scheduler, layout, config.model)
    acceptance = make_acceptance(config.acceptance, config.seed)
    engine = scheduler.engine
    specs = [group.kv_cache_spec for group in engine.kv_cache_config.kv_cache_groups]
    attention = next(i for i, spec in enumerate(specs) if isinstance(spec, FullAttentionSpec))
    states = [i for i, spec in enumerate(specs) if isinstance(spec, MambaSpec)]
    size = specs[attention].block_size
    vllm_counts = {"drafts": 0, "accepted": 0}  # vLLM's own SpecDecodingStats, summed
    update = engine.update_from_output

    def counted(*inputs):
        outputs = update(*inputs)
        for output in outputs.values():
            stats = output.scheduler_stats and output.scheduler_stats.spec_decoding_stats
            if stats:
                vllm_counts["drafts"] += stats.num_draft_tokens
                vllm_counts["accepted"] += stats.num_accepted_tokens
        return outputs

    engine.update_from_output = counted
    drafted = accepted_total = placeholders = 0
    clock, steps = 0.0, 0
    while not scheduler.done:
        found = scheduler.schedule_rows(clock)
        if found is None:
            clock = scheduler.next_arrival_s()
            assert np.isfinite(clock), "stalled"
            continue
        count = found[0]
        rows = scheduler.rows
        ids, q = rows.ids[:count].copy(), rows.query_lens[:count].astype(np.int64)
        assert q.sum() <= config.scheduler.max_num_batched_tokens
        assert count <= config.scheduler.max_num_seqs
        reach = rows.computed[:count].astype(np.int64) + q
        padded = scheduler._placeholders(scheduler._scheduled, ids, (rows.flags[:count] & 2) != 0)
        last = table.prompt_tokens[ids] + table.output_tokens[ids] - 1
        assert (reach - padded <= last).all(), "past the last token"
        placeholders += int(padded.sum())
        for request, positions in zip(ids.tolist(), reach.tolist(), strict=True):
            held = engine.kv_cache_manager.get_block_ids(str(request))
            assert len(held[attention]) == -(-positions // size), "blocks cover the positions"
            for group in states:  # one conv state, and one per draft (vLLM's baseline)
                assert len(held[group]) == 1 + config.scheduler.num_spec_tokens
        slots = scheduler.slot[scheduler.slot > 0]
        assert np.unique(slots).size == slots.size, "slots shared"
        spec = (rows.flags[:count] & SPEC) != 0
        accepted = np.zeros(count, np.int64)
        if spec.any():
            drafts = rows.drafts[:count][spec].astype(np.int64)
            accepted[spec] = acceptance.draw(ids[spec], scheduler.spec_steps[ids[spec]], drafts)
            drafted += int(drafts.sum())
            accepted_total += int(accepted.sum())
        scheduler.commit_rows(accepted)
        assert int(scheduler.counters.values[ROWS]) == count
        clock += 0.01
        steps += 1
    # vLLM counted the same drafts and acceptances as the loop, its padded
    # placeholder drafts (all rejected) among the drafts
    assert vllm_counts["accepted"] == accepted_total
    assert vllm_counts["drafts"] == drafted + placeholders
    return scheduler, steps


@requires_vllm
@pytest.mark.parametrize("spec_tokens", [0, 3])
def test_every_request_finishes_with_its_output_length(spec_tokens):
    table = _table()
    config = with_settings(SimConfig(), {"scheduler.num_spec_tokens": spec_tokens, **SMALL_CACHE})
    scheduler, steps = _drive(table, config)
    assert steps > 0
    np.testing.assert_array_equal(scheduler.emitted, table.output_tokens)
    assert scheduler.engine.get_num_unfinished_requests() == 0
    assert (scheduler.slot == 0).all()
    # every block back in vLLM's pool (the null block aside)
    pool = scheduler.engine.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


@requires_vllm
def test_simulation_results_on_the_vllm_path():
    table = _table()
    result = simulate(table, _vllm(SimConfig()))
    requests = result.requests
    assert not np.isnan(requests["finish_s"]).any()
    np.testing.assert_array_equal(requests["output_tokens"], table.output_tokens)


@requires_vllm
@pytest.mark.parametrize(
    "settings",
    [
        {},  # speculation, chunked prefill
        {"scheduler.num_spec_tokens": 0, "scheduler.max_num_batched_tokens": 512},
    ],
)
def test_stepplan_agrees_with_vllm(settings):
    config = with_settings(SimConfig(), settings)
    diff = compare_schedulers(_embedded(), config, _vllm(config), ("stepplan", "vllm"))
    assert diff.agreement >= 0.99, diff.format()
    assert diff.sides[0]["ttft_ms_mean"] == pytest.approx(diff.sides[1]["ttft_ms_mean"])


@requires_vllm
def test_one_token_prompts_are_padded_as_vllm_pads_them():
    """Both pad an admitted request with one token left to ``1 + num_spec_tokens`` rows
    (placeholder drafts) when others run, and agree on every step of a workload whose
    1-token prompts meet running requests."""
    table = _table()
    diff = compare_schedulers(table, SimConfig(), _vllm(SimConfig()))
    assert diff.agreement == 1.0, diff.format()
    config = SimConfig().scheduler
    scheduler, padded, clock = Scheduler(table, config), 0, 0.0
    while not scheduler.done:
        step = scheduler.schedule(clock)
        if step is None:
            clock = scheduler.next_arrival_s()
            continue
        q = step.batch.query_lens
        one_token = table.prompt_tokens[step.request_ids] == 1
        padded += int(((q == 1 + config.num_spec_tokens) & ~step.decoding & one_token).sum())
        scheduler.commit(step, np.zeros(q.size, np.int64))
        clock += 0.01
    assert padded > 0


@requires_vllm
def test_preemption_agrees_under_vllms_whole_prompt_admission(monkeypatch):
    """Under a small cache both admit a request only when its whole prompt's blocks are
    free (vLLM's ``scheduler_reserve_full_isl``) and agree step for step, preemptions
    included; vLLM with that gate off admits by the first chunk and parts from them."""
    config = with_settings(SimConfig(), PREEMPTING)
    table = _embedded(300).scale_rate(4.0)
    diff = compare_schedulers(table, config, _vllm(config))
    assert diff.sides[0]["preemptions"] > 0
    assert diff.agreement == 1.0, diff.format()
    built = vllm_engine_scheduler._engine

    def by_first_chunk(*args):
        engine, *rest = built(*args)
        engine.scheduler_reserve_full_isl = False
        return (engine, *rest)

    monkeypatch.setattr(vllm_engine_scheduler, "_engine", by_first_chunk)
    ungated = compare_schedulers(table, config, _vllm(config))
    assert ungated.sides[1]["preemptions"] > ungated.sides[0]["preemptions"]
    assert ungated.first_divergence is not None


@requires_vllm
@pytest.mark.parametrize("gib", [0.6, 2.0, 20.0])
@pytest.mark.parametrize("spec_tokens", [0, 3])
def test_a_hybrid_models_pool_is_vllms(gib, spec_tokens):
    """vLLM's own planner is the reference for the hybrid model's shared pool: the
    same block size and block count (less its null block), and state blocks per
    running request as its conv-state group allocates them."""
    import tempfile

    config = with_settings(
        SimConfig(), {"memory.kv_cache_gib": gib, "scheduler.num_spec_tokens": spec_tokens}
    )
    table = _embedded(20)
    layout = plan_memory(config, table)
    with tempfile.TemporaryDirectory() as folder:
        engine, state, _ = vllm_engine_scheduler._engine(
            config.scheduler, layout, config.model.resolved(), folder
        )
    manager = engine.kv_cache_manager
    groups = engine.kv_cache_config.kv_cache_groups
    assert engine.kv_cache_config.num_blocks - 1 == layout.num_blocks
    assert {g.kv_cache_spec.block_size for g in groups if g is not groups[state]} == {
        layout.block_size
    }
    spec = groups[state].kv_cache_spec
    per_group = -(-(1 + spec.block_size * spec.num_speculative_blocks) // spec.block_size)
    assert per_group * sum(g is groups[state] for g in groups) == layout.state_blocks
    assert manager.block_pool.get_num_free_blocks() == layout.num_blocks


@requires_vllm
def test_preemption_agrees_on_the_hybrid_models_shared_pool():
    """A hybrid model under a small cache: conv states and KV blocks in vLLM's one
    pool, both admit and preempt alike on every step."""
    hybrid = {key: value for key, value in PREEMPTING.items() if key != "model.conv_layers"}
    config = with_settings(SimConfig(), hybrid)
    diff = compare_schedulers(_embedded(300).scale_rate(4.0), config, _vllm(config))
    assert diff.sides[0]["preemptions"] > 0
    assert diff.agreement == 1.0, diff.format()


@requires_vllm
def test_a_perturbed_budget_is_caught_at_its_first_divergent_step():
    """Negative control: vLLM with one token less of budget must part from stepplan
    exactly at the first step where stepplan fills its whole budget."""
    config = with_settings(SimConfig(), {"scheduler.max_num_batched_tokens": 512})
    table = _table()
    steps = simulate(table, config).steps
    tokens = (
        steps["num_prefill_tokens"] + steps["num_decode_tokens"] + steps["num_spec_decode_tokens"]
    )
    expected = int(np.flatnonzero(np.asarray(tokens) == 512)[0])
    perturbed = with_settings(_vllm(config), {"scheduler.max_num_batched_tokens": 511})
    diff = compare_schedulers(table, config, perturbed)
    assert diff.first_divergence == expected
    assert diff.agreeing_steps >= expected
    assert f"step {expected} A:" in "\n".join(diff.context)


#: The model without conv layers: prefix-cache hits are whole KV blocks, as vLLM's.
ATTENTION_ONLY = {"model.conv_layers": 0}


@requires_vllm
def test_prefix_caching_agrees_attention_only():
    """Mooncake's shared prefixes, attention only: both hit the same blocks on every
    step (vLLM's entries are cached when allocated, so a request admitted in the step
    that computes them hits them; a partial last hashed block shares its full blocks)."""
    config = with_settings(SimConfig(), ATTENTION_ONLY)
    table = load_trace("tests/data/mooncake_slice.jsonl").limit(150)
    diff = compare_schedulers(table, config, _vllm(config))
    assert diff.sides[0]["prefix_cached_tokens"] > 100_000
    assert diff.agreement == 1.0, diff.format()


@requires_vllm
def test_prefix_caching_agrees_on_the_hybrid_model():
    """Mooncake's shared prefixes on the hybrid model (vLLM's "align" mode): chunks end
    on 48-token blocks, states are kept only at a prompt's last block boundary and at a
    shared-prefix junction, and both hit the same blocks on every step."""
    config = SimConfig()
    table = load_trace("tests/data/mooncake_slice.jsonl").limit(100)
    diff = compare_schedulers(table, config, _vllm(config))
    assert diff.sides[0]["prefix_cached_tokens"] > 0
    assert diff.agreement == 1.0, diff.format()


def _sharing_one_system_prompt() -> RequestTable:
    """Three requests whose prompts start with the same 512-token hashed block: the
    first computes it alone; the other two arrive together once it has finished."""
    return RequestTable(
        arrival_s=np.array([0.0, 1.0, 1.0]),
        prompt_tokens=np.array([600, 700, 800], np.int64),
        output_tokens=np.array([2, 5, 5], np.int64),
        prefix_offsets=np.array([0, 2, 4, 6], np.int64),
        prefix_blocks=np.array([7, 100, 7, 101, 7, 102], np.int64),
    )


@requires_vllm
def test_a_state_kept_in_a_step_is_started_from_in_the_next():
    """Hybrid model, align mode: the first request keeps its conv state only at its
    prompt's last block, so the second finds the shared block cached for attention
    alone and computes it, keeping the state at that junction; vLLM's Mamba manager
    lets the third start from that state only in the next step (stepplan admitted it in
    the same step: 98.7% of steps agreed on a shared-prefix trace, 57.8% at a 512-token
    budget)."""
    config = SimConfig()
    table = _sharing_one_system_prompt()
    diff = compare_schedulers(table, config, _vllm(config), ("stepplan", "vllm"))
    assert diff.agreement == 1.0, diff.format()
    steps = _scheduled_steps(table, config)
    second = next(i for i, step in enumerate(steps) if any(r == 1 for r, _ in step))
    assert steps[second] == [(1, 480)]  # to the junction: the shared block's 10 blocks
    assert (2, 800 - 480 - 32) in steps[second + 1]  # from the state, to the last block
    assert diff.sides[0]["prefix_cached_tokens"] == 480


@requires_vllm
@pytest.mark.parametrize("gib", [8.0, 30.0])
def test_prefix_caching_agrees_on_the_hybrid_model_where_the_cache_binds(gib):
    """The hybrid model caching prefixes in a cache smaller than the working set
    (``memory.align_state_blocks``: conv states as blocks of vLLM's one pool, running,
    left behind and kept, evicted with the attention blocks): every step agrees.
    8 GiB preempts, 30 GiB evicts cached prefixes and still hits; with the conv-state
    slots reserved apart the slice agrees on 16% and 73% of steps."""
    config = with_settings(
        SimConfig(), {"memory.kv_cache_gib": gib, "memory.align_state_blocks": True}
    )
    table = load_trace("tests/data/mooncake_slice.jsonl")
    diff = compare_schedulers(table, config, _vllm(config))
    if gib == 8.0:
        assert diff.sides[0]["preemptions"] > 0
    else:
        assert diff.sides[0]["prefix_cached_tokens"] > 0
    assert diff.agreement == 1.0, diff.format()


def _rehashed(table: RequestTable, scale: int, offset: int) -> RequestTable:
    """``table`` with every prefix hash ``h`` made ``h * scale + offset`` (the same
    sharing, other values)."""
    blocks = table.prefix_blocks.astype(object) * scale + offset
    return attrs.evolve(table, prefix_blocks=blocks.astype(np.int64))


#: Hash values as traces may carry them: small and sequential (Mooncake's), 64-bit
#: (equal modulo 2**30: a token id of ``h mod 2**30`` made every block one token),
#: negative.
REHASHED = [(1, 0), (1 << 40, 987_654_321), (-7919, -1)]


@requires_vllm
@pytest.mark.parametrize(("scale", "offset"), REHASHED[1:])
def test_prefix_caching_agrees_whatever_the_hash_values(scale, offset):
    """The slice at 8 GiB with 2 drafts (evictions, a preemption), its hashes 64-bit or
    negative: vLLM sees the same sharing, every step agrees."""
    table = _rehashed(load_trace("tests/data/mooncake_slice.jsonl"), scale, offset)
    config = with_settings(
        SimConfig(), {"memory.kv_cache_gib": 8.0, "scheduler.num_spec_tokens": 2}
    )
    diff = compare_schedulers(table, config, _vllm(config))
    assert diff.agreement == 1.0, diff.format()


@requires_vllm
def test_tracked_state_blocks_count_as_vllms_free_queue():
    """After every schedule stepplan's free blocks plus its evictable cached ones are
    vLLM's free queue, and its cached ones the queue's hashed blocks (the slice at
    30 GiB, memory.align_state_blocks): running, left and kept state blocks and
    copies are counted block for block (dropping the commit-time caching of a
    finishing request's last blocks still agrees step for step here, not in counts)."""
    config = with_settings(
        SimConfig(), {"memory.kv_cache_gib": 30.0, "memory.align_state_blocks": True}
    )
    table = load_trace("tests/data/mooncake_slice.jsonl")
    ours, theirs, our_steps, their_steps = _free_queue_counts(table, config)
    assert our_steps == their_steps
    assert len(ours) == len(theirs) > 400
    assert any(cached for _, cached in ours)
    assert ours == theirs


@st.composite
def hashed_traces(draw):
    """Small traces whose requests share prefixes of 64-token hashed blocks (a family's
    requests share every hash id, so a shared id is a shared prefix), prompts that end
    inside a hashed block, and arrivals together so that one step admits several."""
    n = draw(st.integers(2, 12))
    prompts = draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
    families = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    hashes = [
        [f * 1000 + j for j in range(-(-p // 64))] for f, p in zip(families, prompts, strict=True)
    ]
    offsets = np.cumsum([0] + [len(h) for h in hashes]).astype(np.int64)
    table = RequestTable(
        arrival_s=np.sort(
            draw(st.lists(st.sampled_from([0.0, 0.01, 0.3]), min_size=n, max_size=n))
        ),
        prompt_tokens=np.array(prompts, np.int64),
        output_tokens=np.array(draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))),
        prefix_offsets=offsets,
        prefix_blocks=np.array([b for h in hashes for b in h], np.int64),
    )
    run = {
        **ATTENTION_ONLY,
        "memory.prefix_block_tokens": 64,
        "scheduler.num_spec_tokens": draw(st.integers(0, 3)),
        "scheduler.max_num_seqs": 8,  # vLLM wants a budget of at least max_num_seqs
        "scheduler.max_num_batched_tokens": draw(st.sampled_from([64, 200, 2048])),
    }
    return table, with_settings(SimConfig(), run)


@requires_vllm
@settings(max_examples=15, deadline=None)
@given(hashed_traces())
def test_prefix_hits_are_vllms_block_for_block(case):
    """vLLM's KV-cache manager is the reference: the same hits, step for step, on
    prompts sharing whole and partial hashed blocks, admitted together or apart."""
    table, config = case
    diff = compare_schedulers(table, config, _vllm(config))
    assert diff.agreement == 1.0, diff.format()
    assert diff.sides[0]["prefix_cached_tokens"] == diff.sides[1]["prefix_cached_tokens"]


def _families(prompts, families, arrivals, outputs) -> RequestTable:
    """Requests of the same family share every 64-token hashed block of their prompts."""
    hashes = [
        [f * 1000 + j for j in range(-(-p // 64))] for f, p in zip(families, prompts, strict=True)
    ]
    return RequestTable(
        arrival_s=np.array(arrivals, float),
        prompt_tokens=np.array(prompts, np.int64),
        output_tokens=np.array(outputs, np.int64),
        prefix_offsets=np.cumsum([0] + [len(h) for h in hashes]).astype(np.int64),
        prefix_blocks=np.array([b for h in hashes for b in h], np.int64),
    )


def _tight_cache(spec_tokens: int, gib: float) -> SimConfig:
    """Attention only, 64-token hashed blocks, a cache of 20-51 blocks that evicts."""
    run = {
        **ATTENTION_ONLY,
        "memory.prefix_block_tokens": 64,
        "memory.kv_cache_gib": gib,
        "memory.check": True,
        "scheduler.num_spec_tokens": spec_tokens,
        "scheduler.max_num_seqs": 8,
        "scheduler.max_num_batched_tokens": 64,
    }
    return with_settings(SimConfig(), run)


@st.composite
def evicting_traces(draw):
    """Small traces of two families in a tight cache: prompts of whole hashed blocks
    (a fully cached one computes its last block again) or not, with drafts or not."""
    n = draw(st.integers(2, 7))
    aligned = draw(st.booleans())
    lengths = st.integers(1, 4).map(lambda b: 64 * b) if aligned else st.integers(1, 300)
    table = _families(
        draw(st.lists(lengths, min_size=n, max_size=n)),
        draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)),
        sorted(draw(st.lists(st.sampled_from([0.0, 0.01, 0.3]), min_size=n, max_size=n))),
        draw(st.lists(st.integers(1, 39), min_size=n, max_size=n)),
    )
    config = _tight_cache(draw(st.integers(0, 2)), draw(st.sampled_from([0.02, 0.03, 0.05])))
    return table, config


def _free_queue_counts(table, config) -> tuple[list, list, list, list]:
    """Each side's ``(free + evictable, evictable)`` blocks after every schedule and
    its steps' (request, tokens) pairs: stepplan's, then vLLM's (its free queue and the
    hashed blocks in it). stepplan's side steps in Python, its specification."""
    theirs, ours = [], []
    built, schedule_rows = vllm_engine_scheduler._engine, Scheduler.schedule_rows

    def counted(*args):
        engine, *rest = built(*args)
        schedule, pool = engine.schedule, engine.kv_cache_manager.block_pool

        def schedule_and_count(*inputs):
            out = schedule(*inputs)
            queue = pool.free_block_queue.get_all_free_blocks()
            theirs.append((len(queue), sum(block.block_hash is not None for block in queue)))
            return out

        engine.schedule = schedule_and_count
        return (engine, *rest)

    def schedule_counted(self, now_s):
        found = schedule_rows(self, now_s)
        ours.append((self.pool.free + self.pool.cached_blocks, self.pool.cached_blocks))
        return found

    with pytest.MonkeyPatch.context() as patch:  # undone before the next example
        patch.setattr(vllm_engine_scheduler, "_engine", counted)
        patch.setattr(Scheduler, "schedule_rows", schedule_counted)
        our_steps = _scheduled_steps(table, config, native=False)
        their_steps = _scheduled_steps(table, _vllm(config))
    return ours, theirs, our_steps, their_steps


@requires_vllm
@settings(max_examples=12, deadline=None)
@given(evicting_traces())
@example(
    # drafts: vLLM caches the blocks accepted drafts fill after the step's output, so a
    # finishing request's last block goes to the free queue's tail, cached (stepplan
    # freed it to the head: the counts parted at the 10th schedule)
    (
        _families([154, 226, 285, 11], [0, 1, 1, 0], [0.0, 0.0, 0.01, 0.3], [33, 11, 16, 26]),
        _tight_cache(2, 0.03),
    ),
)
@example(
    # whole cached prompts: each computes its last block again and vLLM caches that
    # copy under the same hash (stepplan kept it private: parted at the 20th schedule)
    (
        _families([192, 192, 128, 256], [0, 1, 0, 0], [0.0, 0.01, 0.01, 0.3], [27, 30, 13, 27]),
        _tight_cache(0, 0.05),
    ),
)
def test_the_evictable_blocks_are_vllms_after_every_schedule(case):
    """Attention only, a cache that evicts: after every schedule stepplan's free and
    evictable blocks are vLLM's free queue, its evictable ones the queue's hashed
    blocks, and every step schedules the same tokens (commit-time caching with drafts,
    and copies of blocks computed again under a cached hash, as vLLM 0.33 keeps them)."""
    table, config = case
    try:
        plan_memory(config, table)
    except ConfigError:  # the longest request needs more blocks than the cache holds
        assume(False)
    ours, theirs, our_steps, their_steps = _free_queue_counts(table, config)
    assert ours == theirs
    assert our_steps == their_steps


@pytest.mark.parametrize(("scale", "offset"), REHASHED)
def test_equal_hash_blocks_give_equal_tokens(scale, offset):
    table = _rehashed(load_trace("tests/data/mooncake_slice.jsonl"), scale, offset)
    offsets, blocks = table.prefix_offsets, table.prefix_blocks
    ids = hashed_block_tokens(table)
    first = [prompt_tokens(table, r, 512, ids) for r in range(table.num_requests)]
    for r in range(table.num_requests):
        assert len(first[r]) == table.prompt_tokens[r]
    for r in range(table.num_requests):
        for s in range(r):
            mine, theirs = blocks[offsets[r] : offsets[r + 1]], blocks[offsets[s] : offsets[s + 1]]
            shared = 0
            while shared < min(mine.size, theirs.size) and mine[shared] == theirs[shared]:
                shared += 1
            length = min(shared * 512, table.prompt_tokens[r], table.prompt_tokens[s])
            assert first[r][:length] == first[s][:length]
            if length < min(table.prompt_tokens[r], table.prompt_tokens[s]):
                assert first[r][length] != first[s][length]


def test_an_unsupported_vllm_is_one_line(monkeypatch):
    monkeypatch.setattr(vllm_engine_scheduler, "vllm_version", lambda: "0.9.1")
    with pytest.raises(VllmUnavailable, match=r"drives vLLM 0\.33 only; vLLM 0\.9\.1"):
        check_vllm()
    monkeypatch.setattr(vllm_engine_scheduler, "vllm_version", lambda: None)
    with pytest.raises(VllmUnavailable, match="not installed: pip install"):
        check_vllm()


def test_without_vllm_the_command_says_how_to_install_it(monkeypatch, capsys, tmp_path):
    from stepplan.sim import cli

    monkeypatch.setattr(vllm_engine_scheduler, "vllm_version", lambda: None)
    out = tmp_path / "run"
    assert cli.main(["simulate", "--scheduler", "vllm", "--limit", "5", "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [
        "stepplan: error: --scheduler vllm needs vLLM, which is not installed: "
        "pip install 'vllm==0.33.*' einops"
    ]
    assert not out.exists()


@requires_vllm
def test_a_vllm_whose_scheduler_interface_moved_is_one_line(monkeypatch, capsys, tmp_path):
    from stepplan.sim import cli

    monkeypatch.setitem(sys.modules, "vllm.v1.request", None)  # the module is gone
    out = tmp_path / "run"
    assert cli.main(["simulate", "--scheduler", "vllm", "--limit", "5", "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1
    assert error[0].startswith("stepplan: error: --scheduler vllm drives vLLM 0.33; the installed")
    assert "lacks its scheduler interface" in error[0] and "pip install 'vllm==0.33.*'" in error[0]
    assert not out.exists()


def test_the_package_imports_without_loading_vllm():
    code = (
        "import sys, stepplan.sim.cli, stepplan.sim.scheduler_diff;"
        "print(any(name.split('.')[0] in ('vllm', 'torch') for name in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@requires_vllm
def test_summary_names_the_vllm_that_scheduled(tmp_path):
    from stepplan.sim import cli

    out = tmp_path / "run"
    assert (
        cli.main(["simulate", "--quiet", "--scheduler", "vllm", "--limit", "20", "--out", str(out)])
        == 0
    )
    document = json.loads((out / "summary.json").read_text())
    assert document["provenance"]["vllm"] == vllm_engine_scheduler.vllm_version()
    assert document["config"]["scheduler"]["implementation"] == "vllm"


def _scheduled_steps(
    table, config: SimConfig, native: bool | None = None
) -> list[list[tuple[int, int]]]:
    """Every step's (request, tokens) pairs, ascending by request, read by an observer
    (``native``: ``run_steps``'s)."""
    steps: list[list[tuple[int, int]]] = []

    def observe(event) -> None:
        step = event.step
        pairs = zip(step.request_ids.tolist(), step.batch.query_lens.tolist(), strict=True)
        steps.append(sorted(pairs))

    run_steps(table, config, MemoryStore(), observer=observe, native=native)
    return steps


@requires_vllm
def test_a_test_only_admission_policy_is_caught_at_its_first_divergent_step(monkeypatch):
    """Negative control: a stepplan policy that admits the newest request first (a rule
    of this test only) parts from vLLM exactly at the first step where its decision
    differs from first come first served, which agrees with vLLM on every step."""
    newest = AdmissionPolicy("newest-first", "latest arrival first", _newest_first)
    monkeypatch.setitem(admission.POLICIES, newest.name, newest)
    config = with_settings(SimConfig(), {"scheduler.max_num_batched_tokens": 512})
    with attrs.validators.disabled():  # the policy is not among the configurable names
        policy = attrs.evolve(config.scheduler, policy=newest.name)
    changed = attrs.evolve(config, scheduler=policy)
    table = _table()
    fcfs_steps, newest_steps = (_scheduled_steps(table, c) for c in (config, changed))
    expected = next(
        i for i, (a, b) in enumerate(zip(fcfs_steps, newest_steps, strict=False)) if a != b
    )
    assert expected > 0
    assert compare_schedulers(table, config, _vllm(config)).agreement == 1.0
    diff = compare_schedulers(table, changed, _vllm(config))
    assert diff.first_divergence == expected, diff.format()
    assert diff.agreeing_steps >= expected
    assert f"step {expected} A:" in "\n".join(diff.context)


def _newest_first(requests) -> np.ndarray:
    return -np.arange(requests.num_requests, dtype=np.int64)
