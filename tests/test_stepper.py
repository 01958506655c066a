"""The compiled stepper changes nothing: every simulation steps to the same results on it
as in Python alone (``sim/stepper.py``'s specification), byte for byte."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from golden_sim import MOONCAKE, PINNED, RUNS
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from stepplan.sim import cli
from stepplan.sim.acceptance import PerPosition, load_replay
from stepplan.sim.memory import BlockPool
from stepplan.sim.run import simulate
from stepplan.sim.settings.config import ConfigError, SimConfig, with_settings
from stepplan.sim.state_blocks import StateBlockPool
from stepplan.sim.stepper import load_stepper
from stepplan.sim.traces import RequestTable, load_trace
from stepplan.sim.workloads import parse_synthetic

COMPILED = load_stepper() is not None
needs_compiled = pytest.mark.skipif(not COMPILED, reason="the compiled stepper is not built")


def test_the_compiled_stepper_is_built():
    """The install builds it (as it builds the planner's packer, whose tests need it): a
    failed build must fail here, not pass by skipping every parity test below."""
    from stepplan.sim.stepper import _stepper_module

    module, why = _stepper_module()
    assert module is not None, why


def assert_same(native, python):
    """Two results equal in every column but the measured planner time, and in the gaps."""
    for table in ("steps", "requests"):
        a, b = getattr(native, table), getattr(python, table)
        assert a.keys() == b.keys()
        for name in a:
            if name != "plan_us":
                np.testing.assert_array_equal(a[name], b[name], err_msg=f"{table}.{name}")
    np.testing.assert_array_equal(native.itl_s, python.itl_s)


def both(table, config, **kwargs):
    return simulate(table, config, native=True, **kwargs), simulate(
        table, config, native=False, **kwargs
    )


def golden_config(trace, run_settings):
    args = cli.build_parser().parse_args(["simulate", *([trace] if trace else [])])
    config = cli.with_settings(cli.build_config(args), {**PINNED, **run_settings})
    return cli.load_requests(args, config), config


@needs_compiled
@pytest.mark.parametrize(("name", "trace", "run_settings"), RUNS, ids=[r[0] for r in RUNS])
def test_golden_runs_step_alike_compiled_and_in_python(name, trace, run_settings):
    table, config = golden_config(trace, run_settings)
    assert_same(*both(table, config))


class Drawn(PerPosition):
    """An acceptance model the compiled stepper does not know: Python draws for it."""


@needs_compiled
def test_an_acceptance_model_of_the_caller_is_drawn_in_python():
    table, config = golden_config(*RUNS[2][1:])
    config = with_settings(config, {"scheduler.num_spec_tokens": 3})
    native, python = both(table, config)
    assert_same(native, python)
    model = Drawn(config.acceptance.probs, config.seed)
    assert_same(simulate(table, config, acceptance=model, native=True), native)


@needs_compiled
def test_replayed_acceptance_steps_alike(tmp_path):
    path = tmp_path / "accepted.jsonl"
    path.write_text('{"accepted": [0, 3, 1]}\n{"accepted": [2]}\n{"accepted": [1, 0]}\n')
    table = parse_synthetic("synthetic:n=60,rate=30,prompt=uniform:8:600,output=uniform:1:90")
    settings_ = {"acceptance.model": "replay", "acceptance.trace": str(path)}
    config = with_settings(SimConfig(), settings_)
    native, python = both(table, config)
    assert_same(native, python)
    assert_same(simulate(table, config, acceptance=load_replay(path)), native)


LENGTHS = st.sampled_from(["uniform:1:40", "uniform:16:300", "zipf:1.2:1500", "fixed:200"])


@st.composite
def synthetic_runs(draw):
    """A small synthetic workload and settings that bind: few slots, small budgets and
    caches, every acceptance model, layer groups, the memory check on."""
    n, rate = draw(st.integers(8, 40)), draw(st.sampled_from([5000.0, 500.0, 50.0, 0.5]))
    spec = f"synthetic:n={n},rate={rate},cv2={draw(st.sampled_from([0.5, 1, 4]))}"
    spec += f",prompt={draw(LENGTHS)},output={draw(LENGTHS)}"
    model = draw(st.sampled_from(["per-position", "fixed"]))
    run_settings = {
        "scheduler.num_spec_tokens": draw(st.integers(0, 4)),
        "scheduler.max_num_seqs": draw(st.sampled_from([8, 3, 1, 12])),
        "scheduler.max_num_batched_tokens": draw(st.sampled_from([512, 8192, 100, 16])),
        "scheduler.slot_capacity": draw(st.sampled_from([1024, 5, 2])),
        "scheduler.num_groups": draw(st.sampled_from([1, 2])),
        # a few dozen KV blocks of 16 tokens (the slots take much of it), or the H200's share
        "memory.kv_cache_gib": draw(st.sampled_from([0.1, 0.05, 0.2, None])),
        "memory.check": True,
        "planner.graph_mode": draw(st.sampled_from(["none", "full", "mixed"])),
        "acceptance.model": "fixed" if model == "fixed" else None,
        "acceptance.length": draw(st.sampled_from([1.0, 2.5, 4.0])) if model == "fixed" else None,
        "seed": draw(st.integers(0, 3)),
    }
    return spec, run_settings, draw(st.integers(0, 5))


@needs_compiled
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(synthetic_runs())
def test_binding_synthetic_runs_step_alike(run):
    assert_synthetic_run_steps_alike(run)


def assert_synthetic_run_steps_alike(run: tuple[str, dict, int]) -> None:
    """A drawn ``(spec, settings, seed)`` run gives the same results compiled and in
    Python; a run whose cache cannot hold its longest request is not an example."""
    spec, run_settings, seed = run
    try:
        config = with_settings(SimConfig(), run_settings)
        native, python = both(parse_synthetic(spec, seed=seed), config)
    except ConfigError:
        assume(False)
    assert_same(native, python)


CROWD = "synthetic:n=40,rate=5000,cv2=4,prompt=uniform:16:300,output=uniform:16:300"


@needs_compiled
@pytest.mark.parametrize("spec_tokens", [0, 3])
@pytest.mark.parametrize("budget", [64, 512])
@pytest.mark.parametrize(
    "gib", [0.07, 0.1]
)  # 22 to 33 blocks of 48 tokens: preemptions by the dozen
def test_preempting_runs_step_alike(spec_tokens, budget, gib):
    config = with_settings(
        SimConfig(),
        {
            "memory.kv_cache_gib": gib,
            "memory.check": True,
            "scheduler.max_num_seqs": 12,
            "scheduler.num_spec_tokens": spec_tokens,
            "scheduler.max_num_batched_tokens": budget,
            "scheduler.num_groups": 2,
        },
    )
    native, python = both(parse_synthetic(CROWD), config)
    assert_same(native, python)
    # states in the pool (4 blocks a request at 3 drafts, 1 without) and whole prompts admitted
    assert native.requests["num_preemptions"].sum() >= 20


@needs_compiled
@settings(max_examples=20, deadline=None)
@given(
    st.integers(20, 150),
    st.sampled_from([4.0, 5.0, 8.0, 1e3]),
    st.integers(0, 4),
    st.sampled_from([1, 8, 64]),
    st.sampled_from([None, 0, 8]),
)
def test_prefix_cached_runs_step_alike(limit, gib, spec_tokens, max_num_seqs, conv_layers):
    # conv_layers 0: attention only, whose prefix-cache entries are single KV blocks;
    # None: the hybrid model, whose chunks and entries follow vLLM's align mode, its
    # conv states blocks of the pool; 8: three attention groups to one conv group
    layers = {} if conv_layers is None else {"model.conv_layers": conv_layers}
    config = with_settings(
        SimConfig(),
        {
            "workload.limit": limit,
            "memory.kv_cache_gib": gib,
            "memory.check": True,
            "scheduler.num_spec_tokens": spec_tokens,
            "scheduler.max_num_seqs": max_num_seqs,
            **layers,
        },
    )
    # memory.check walks every cached entry each step: fewer requests keep Python's side
    # short (attention-only entries are 32 per hashed block, three groups' 3 per entry)
    table = load_trace(MOONCAKE).limit(min(limit, {None: 80, 0: 50, 8: 40}[conv_layers]))
    try:
        native, python = both(table, config)
    except ConfigError:
        assume(False)
    assert_same(native, python)
    assert native.summary["memory"]["prefix_caching"]


@needs_compiled
@pytest.mark.parametrize(("tracked", "block_size"), [(True, 48), (False, 16)])
@pytest.mark.parametrize(
    ("gib", "spec_tokens", "shown"), [(50.0, 3, "cached"), (8.0, 0, "preempted")]
)
def test_aligned_prefix_caching_steps_alike(gib, spec_tokens, shown, tracked, block_size):
    # the hybrid model caching Mooncake's prefixes in vLLM's align mode: hits, kept
    # states and junctions alike (50 GiB), and evictions and preemptions (8 GiB); its
    # conv states as blocks of the one pool (the default: copies, left state blocks
    # and kept states as entries of their own) or as slots reserved apart
    config = with_settings(
        SimConfig(),
        {
            "memory.kv_cache_gib": gib,
            "memory.check": True,
            "memory.align_state_blocks": tracked,
            "scheduler.num_spec_tokens": spec_tokens,
        },
    )
    native, python = both(load_trace(MOONCAKE).limit(150), config)
    assert_same(native, python)
    column = {"cached": "cached_tokens", "preempted": "num_preemptions"}[shown]
    assert native.requests[column].sum() > 0
    assert native.summary["memory"]["block_size"] == block_size


def _bursts_sharing_system_prompts() -> RequestTable:
    """48 requests in bursts of four, each prompt one of three system prompts (1-3
    hashed blocks) and a block of its own: a burst's later requests hit a junction's
    state that an earlier one keeps in the same step."""
    rng = np.random.default_rng(5)
    systems = [[1000 * s + j for j in range(s + 1)] for s in range(3)]
    ids = [systems[int(rng.integers(3))] + [10**6 + r] for r in range(48)]
    prompts = [512 * (len(h) - 1) + int(rng.integers(1, 512)) for h in ids]
    return RequestTable(
        arrival_s=np.repeat(np.arange(12) * 0.5, 4),
        prompt_tokens=np.array(prompts, np.int64),
        output_tokens=rng.integers(1, 40, 48),
        prefix_offsets=np.cumsum([0] + [len(h) for h in ids]).astype(np.int64),
        prefix_blocks=np.array([b for h in ids for b in h], np.int64),
    )


@needs_compiled
@pytest.mark.parametrize("pool_class", [StateBlockPool, BlockPool])
def test_a_state_kept_in_the_step_defers_admission_alike(monkeypatch, pool_class):
    # align mode: a hit ending on a conv state kept in the step being scheduled stops
    # admission (vLLM's Mamba manager); the compiled stepper and Python alike, conv
    # states as blocks of the pool (StateBlockPool) or as slots apart (BlockPool)
    deferred = []
    admit = pool_class.admit

    def counted(pool, request, hits, positions, whole):
        deferred.append(bool(hits) and hits[-1] in pool.states_this_step)
        return admit(pool, request, hits, positions, whole)

    monkeypatch.setattr(pool_class, "admit", counted)
    tracked = pool_class is StateBlockPool
    config = with_settings(
        SimConfig(),
        {
            "memory.check": True,
            "memory.align_state_blocks": tracked,
            "scheduler.num_spec_tokens": 2,
        },
    )
    native, python = both(_bursts_sharing_system_prompts(), config)
    assert_same(native, python)
    assert any(deferred)  # the Python run met the rule
    assert native.requests["cached_tokens"].sum() > 0


@needs_compiled
def test_the_compiled_stepper_runs_where_built():
    table, config = golden_config(None, {"workload.limit": 30})
    seen = []
    result = simulate(table, config, native=True, observer=seen.append)
    assert len(seen) == result.steps["step"].size
    accepted = np.concatenate([event.accepted for event in seen])
    assert accepted.sum() == result.requests["accepted_tokens"].sum()
    assert_same(result, simulate(table, config, native=False))
    assert attrs.has(type(seen[0]))
