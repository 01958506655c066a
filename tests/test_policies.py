"""Admission policies (``sim/admission.py``): each admits in its order, the age limit bounds
how long a request is passed over, the compiled stepper follows the Python scheduler
under every policy, and first come first served is the scheduler it always was."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from golden_sim import MOONCAKE, RUNS
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_stepper import (
    assert_same,
    assert_synthetic_run_steps_alike,
    both,
    golden_config,
    needs_compiled,
    synthetic_runs,
)

from stepplan.sim import cli
from stepplan.sim.admission import POLICIES, admission_rank
from stepplan.sim.run import simulate
from stepplan.sim.settings.config import ConfigError, SimConfig, with_settings
from stepplan.sim.traces import FORMATS, RequestTable, TraceError, load_trace, write_trace
from stepplan.sim.workloads import parse_synthetic

#: One request runs at a time and finishes in the step that admits it (one output token),
#: so the order of first tokens is the order of admission.
ONE_AT_A_TIME = {
    "scheduler.max_num_seqs": 1,
    "scheduler.num_spec_tokens": 0,
    "cost.host_cost": "model",
}


def admission_order(table: RequestTable, policy: str, native: bool = False) -> list[int]:
    config = with_settings(SimConfig(), {**ONE_AT_A_TIME, "scheduler.policy": policy})
    result = simulate(table, config, native=native)
    return np.argsort(result.requests["first_token_s"], kind="stable").tolist()


def first_steps(table: RequestTable, config: SimConfig, native: bool) -> np.ndarray:
    """``[N], float64`` when each request was first scheduled (its admission)."""
    admitted = np.full(table.num_requests, np.nan)

    def observe(event) -> None:
        ids = event.step.request_ids
        fresh = ids[np.isnan(admitted[ids])]
        admitted[fresh] = event.start_s

    simulate(table, config, native=native, observer=observe)
    return admitted


HAND_BUILT = RequestTable(
    arrival_s=[0.0, 0.0, 0.0, 0.0, 0.0],
    prompt_tokens=[300, 100, 200, 50, 400],
    output_tokens=[1, 1, 1, 1, 1],
    priority=[2, 0, 1, 0, 3],
    source="hand-built",
)


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=needs_compiled)])
@pytest.mark.parametrize(
    ("policy", "order"),
    [
        ("fcfs", [0, 1, 2, 3, 4]),
        ("priority", [1, 3, 2, 0, 4]),  # the tie of 1 and 3 goes in arrival order
        ("shortest-prompt", [3, 1, 2, 0, 4]),
    ],
)
def test_each_policy_admits_in_its_order(policy, order, native):
    assert admission_order(HAND_BUILT, policy, native) == order


def test_every_policy_has_a_hand_built_order():
    assert set(POLICIES) == {"fcfs", "priority", "shortest-prompt"}


def test_the_rank_is_a_permutation_with_ties_in_arrival_order():
    rank = admission_rank(HAND_BUILT, "priority")
    assert rank.tolist() == [3, 0, 2, 1, 4]
    assert not rank.flags.writeable
    assert admission_rank(HAND_BUILT, "fcfs") is None


def starving_trace(shorts: int = 60) -> RequestTable:
    """A long prompt arriving just after a short one, then a stream of short ones, each
    arriving before the request running ahead of it finishes."""
    arrival = [0.0, 1e-6, *np.arange(1, shorts + 1) * 1e-4]
    prompt = [16, 4000, *[16] * shorts]
    return RequestTable(arrival, prompt, np.ones(len(prompt), np.int64), source="starving")


def test_shortest_prompt_first_starves_a_long_prompt_without_an_age_limit():
    order = admission_order(starving_trace(), "shortest-prompt")
    assert order[-1] == 1


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=needs_compiled)])
def test_the_age_limit_bounds_the_wait_by_one_step(native):
    table = starving_trace()
    limit = 0.02  # several steps: shorter prompts pass the long one over until then
    config = with_settings(
        SimConfig(),
        {
            **ONE_AT_A_TIME,
            "scheduler.policy": "shortest-prompt",
            "scheduler.policy_age_limit_s": limit,
        },
    )
    result = simulate(table, config, native=native)
    longest_step = float(result.steps["duration_s"].max())
    admitted = first_steps(table, config, native)
    waited = admitted - table.arrival_s
    # capacity frees every step, and only request 0 is older: once aged, the long prompt
    # goes when the step it aged in ends
    assert limit < waited[1] <= limit + longest_step
    order = np.argsort(admitted, kind="stable").tolist()
    assert 2 < order.index(1) < len(order) - 1
    never_overtaken_once_aged(table, admitted, limit)


def never_overtaken_once_aged(table: RequestTable, admitted: np.ndarray, limit: float) -> None:
    """No request is admitted at a time when an older request has waited past ``limit``
    and is still waiting (admitted later)."""
    for late in range(table.num_requests):
        younger = np.arange(late + 1, table.num_requests)
        overtaking = younger[admitted[younger] < admitted[late]]
        aged = admitted[overtaking] - table.arrival_s[late] > limit
        assert not aged.any(), (late, overtaking[aged])


POLICY_NAMES = st.sampled_from(sorted(POLICIES))


@st.composite
def policy_runs(draw):
    spec, run_settings, seed = draw(synthetic_runs())
    spec += f",priority={draw(st.integers(1, 4))}"
    limit = draw(st.sampled_from([None, 0.0, 0.01, 0.5]))
    run_settings = {
        **run_settings,
        "scheduler.policy": draw(POLICY_NAMES),
        "scheduler.policy_age_limit_s": limit,
    }
    return spec, run_settings, seed


@needs_compiled
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy_runs())
def test_every_policy_steps_alike_compiled_and_in_python(run):
    assert_synthetic_run_steps_alike(run)


@needs_compiled
@settings(max_examples=15, deadline=None)
@given(st.integers(20, 150), POLICY_NAMES, st.sampled_from([5.0, 8.0, 1e3]))
def test_every_policy_steps_alike_with_the_prefix_cache(limit, policy, gib):
    table = load_trace(MOONCAKE).limit(limit)
    priority = np.arange(table.num_requests) * 7 % 5  # priorities the slice lacks
    table = attrs.evolve(table, priority=priority)
    config = with_settings(
        SimConfig(),
        {
            "memory.kv_cache_gib": gib,
            "memory.check": True,
            "scheduler.policy": policy,
            "scheduler.policy_age_limit_s": 5.0,
        },
    )
    try:
        native, python = both(table, config)
    except ConfigError:
        assume(False)  # the cache cannot hold its longest request
    assert_same(native, python)
    assert native.summary["memory"]["prefix_caching"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy_runs())
def test_no_request_overtakes_one_past_the_age_limit(run):
    spec, run_settings, seed = run
    limit = run_settings["scheduler.policy_age_limit_s"]
    assume(limit is not None)
    table = parse_synthetic(spec, seed=seed)
    try:
        config = with_settings(SimConfig(), {**run_settings, "memory.check": False})
        admitted = first_steps(table, config, native=False)
    except ConfigError:
        assume(False)
    never_overtaken_once_aged(table, admitted, limit)


@pytest.mark.parametrize(("name", "trace", "run_settings"), RUNS[:3], ids=[r[0] for r in RUNS[:3]])
def test_fcfs_with_an_age_limit_is_todays_scheduler(name, trace, run_settings):
    # arrival order already admits the oldest first: the limit changes nothing
    table, config = golden_config(trace, run_settings)
    limited = with_settings(config, {"scheduler.policy_age_limit_s": 0.0})
    assert_same(simulate(table, limited), simulate(table, config))


def test_a_trace_column_gives_the_priorities(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens,Priority\n")
    with path.open("a") as file:
        file.write("0.5,100,1,3\n0.0,200,1,-2\n0.2,50,1,2.0\n")
    table = load_trace(path)
    assert table.priority.tolist() == [-2, 2, 3]  # sorted by arrival with the rows
    assert admission_order(table, "priority") == [0, 1, 2]
    jsonl = tmp_path / "trace.jsonl"
    jsonl.write_text('{"timestamp": 0, "input_length": 9, "output_length": 1, "priority": 1}\n')
    assert load_trace(jsonl).priority.tolist() == [1]
    assert load_trace(tmp_path / "trace.csv").limit(2).priority.tolist() == [-2, 2]


@pytest.mark.parametrize("fmt", FORMATS)
def test_priorities_survive_writing_and_reading_every_format(fmt, tmp_path):
    table = parse_synthetic("synthetic:n=30,rate=2,priority=5", seed=4)
    path = tmp_path / f"trace.{fmt}"
    write_trace(table, path, fmt)
    np.testing.assert_array_equal(load_trace(path, fmt).priority, table.priority)


def test_a_bad_priority_names_the_line(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens,priority\n0,1,1,high\n")
    with pytest.raises(TraceError, match=r"trace.csv:2.*priority: 'high' is not an integer"):
        load_trace(path)


def test_a_synthetic_field_gives_the_priorities_and_leaves_the_rest():
    plain = parse_synthetic("synthetic:n=50,rate=3")
    ranked = parse_synthetic("synthetic:n=50,rate=3,priority=4")
    assert plain.priority is None
    assert set(ranked.priority.tolist()) <= {0, 1, 2, 3}
    np.testing.assert_array_equal(plain.arrival_s, ranked.arrival_s)
    np.testing.assert_array_equal(plain.prompt_tokens, ranked.prompt_tokens)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy", "priority"], "scheduler.policy: priority needs priorities"),
        (["--set", "scheduler.policy=lifo"], "scheduler.policy: must be one of"),
        (["--policy-age-limit-s", "-1"], "scheduler.policy_age_limit_s: must be >= 0"),
        (["synthetic:n=5,priority=0"], "priority: '0' is not a number of levels"),
    ],
)
def test_bad_policy_settings_are_one_line(argv, message, tmp_path, capsys):
    out = tmp_path / "run"
    code = cli.main(["simulate", "--limit", "20", "--quiet", "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize("command", ["capacity", "sweep"])
def test_a_policy_the_trace_cannot_order_is_refused_before_the_runs(command, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [command, "--limit", "20", "--policy", "priority", "--out", str(out)]
    if command == "sweep":
        sweep = tmp_path / "sweep.toml"
        sweep.write_text(
            '[settings]\nworkload.limit = 20\nscheduler.policy = "priority"\n'
            "[grid]\nworkload.rate_scale = [1.0, 2.0]\n"
        )
        argv = [command, str(sweep), "--out", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "scheduler.policy: priority needs priorities" in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_the_policy_has_one_home_in_toml(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[scheduler]\npolicy = "shortest-prompt"\npolicy_age_limit_s = 2.5\n')
    args = cli.build_parser().parse_args(["simulate", "--config", str(path)])
    config = cli.build_config(args)
    assert (config.scheduler.policy, config.scheduler.policy_age_limit_s) == (
        "shortest-prompt",
        2.5,
    )
    args = cli.build_parser().parse_args(["simulate", "--config", str(path), "--policy", "fcfs"])
    assert cli.build_config(args).scheduler.policy == "fcfs"
