"""The memory model inside whole simulations: it changes nothing where memory never
binds, binds on long contexts, reports itself, and refuses what cannot fit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from golden_sim import GOLDEN, RUNS, digests, simulate_run

from stepplan.plots.memory import plot_memory
from stepplan.plots.report import report_figures
from stepplan.sim import cli
from stepplan.sim.memory_sizing import plan_memory
from stepplan.sim.results.records import STEP_RECORD
from stepplan.sim.results.schema import MEMORY_COLUMNS, STEPS
from stepplan.sim.results.sim_result import read_results, write_results
from stepplan.sim.run import simulate
from stepplan.sim.scheduler import StepMemory
from stepplan.sim.settings.config import SimConfig, with_settings
from stepplan.sim.traces import load_trace

MOONCAKE = Path(__file__).with_name("data") / "mooncake_slice.jsonl"
GOLDEN_RUNS = {run[0]: run for run in RUNS}


MEMORY_STEP_COLUMNS = tuple(column.name for column in MEMORY_COLUMNS)


def test_step_memory_fields_are_the_step_columns():
    assert tuple(a.name for a in StepMemory.__attrs_attrs__) == MEMORY_STEP_COLUMNS
    assert STEP_RECORD[-len(MEMORY_STEP_COLUMNS) :] == MEMORY_STEP_COLUMNS
    assert STEPS.names[-len(MEMORY_STEP_COLUMNS) :] == MEMORY_STEP_COLUMNS


def test_a_huge_kv_cache_equals_the_run_without_the_memory_model():
    # the golden digests were made before the simulator had a memory model
    name, trace, settings = GOLDEN_RUNS["synthetic-nospec-seed"]
    expected = json.loads(GOLDEN.read_text())[name]
    steps, requests = simulate_run(trace, {**settings, "memory.kv_cache_gib": 1e4})
    for table, columns in (("steps", steps), ("requests", requests)):
        got = digests(columns)
        # kv_usage is a share of the capacity, which a huge cache changes; all else holds
        want = {k: v for k, v in expected[table].items() if k != "kv_usage"}
        assert {k: got[k] for k in want} == want
    # and where the cache is small, the same run is not the same
    steps, requests = simulate_run(trace, {**settings, "memory.kv_cache_gib": 1.5})
    assert requests["num_preemptions"].sum() > 0
    assert steps["kv_usage"].max() > 0.99


@pytest.fixture(scope="module")
def bound():
    """The Mooncake slice in 5.5 GiB of cache, attention only: long contexts that do not
    all fit (with whole prompts admitted only where they fit, decoding's growth
    preempts: 3 times), and shared prefixes hit in 16-token KV blocks."""
    settings = {"memory.kv_cache_gib": 5.5, "memory.check": True, "model.conv_layers": 0}
    config = with_settings(SimConfig(), settings)
    return simulate(load_trace(MOONCAKE), config)


def test_long_contexts_preempt_and_every_request_finishes(bound):
    requests, steps, memory = bound.requests, bound.steps, bound.summary["memory"]
    assert np.isfinite(requests["finish_s"]).all()
    assert (
        memory["preemptions"] == requests["num_preemptions"].sum() == steps["num_preempted"].sum()
    )
    assert memory["preemptions"] > 0 and memory["recomputed_tokens"] > 0
    assert memory["peak_usage"] == steps["kv_usage"].max() <= 1.0
    assert memory["capacity_blocks"] * 16 * 65536 / 2**30 == pytest.approx(memory["capacity_gib"])
    assert (steps["kv_used_blocks"] <= memory["capacity_blocks"]).all()
    assert memory["prefix_caching"] and memory["cached_tokens"] > 0
    hit_rate = requests["cached_tokens"].sum() / requests["prompt_tokens"].sum()
    assert memory["prefix_cache_hit_rate"] == pytest.approx(hit_rate)
    assert (requests["cached_tokens"] % 16 == 0).all()


def test_prefix_caching_can_be_turned_off():
    config = with_settings(SimConfig(), {"memory.prefix_caching": False, "workload.limit": 30})
    result = simulate(load_trace(MOONCAKE), config)
    assert not result.summary["memory"]["prefix_caching"]
    assert result.summary["memory"]["prefix_cache_hit_rate"] == 0.0
    assert not result.requests["cached_tokens"].any()


def test_memory_limits_the_running_requests_through_their_state_blocks():
    """The hybrid model's conv states share the pool with its KV blocks (vLLM's layout):
    nothing is set apart for slots, and each running request holds ``1 + k`` state
    blocks per conv-state group, so the pool caps how many run at once."""
    trace = "synthetic:n=60,rate=200,prompt=uniform:16:200,output=uniform:1:50"
    settings = {"memory.kv_cache_gib": 0.1, "model.kv_bytes_per_token": 64, "workload.limit": 60}
    args = cli.build_parser().parse_args(["simulate", trace])
    config = cli.with_settings(cli.build_config(args), settings)
    table = cli.load_requests(args, config)
    layout = plan_memory(config, table)
    state_bytes = 8192 * 9 * 2  # one conv layer's state: C x (K-1) D x bf16
    # the smallest multiple of 16 tokens whose page (4 bytes a token a layer) holds it
    assert layout.block_size == 16 * -(-state_bytes // (16 * 4))
    assert layout.block_bytes == layout.block_size * 4 * 16  # a page of the 16 layers
    assert layout.num_blocks == int(0.1 * 2**30 // layout.block_bytes) - 1  # less the null
    assert layout.state_blocks == 1 + config.scheduler.num_spec_tokens
    assert layout.slots == config.scheduler.slots
    result = simulate(table, config)
    # every prompt fits one KV block: a running request holds it and its state blocks
    most = layout.num_blocks // (layout.state_blocks + 1)
    assert result.steps["num_rows"].max() == most < config.scheduler.max_num_seqs


def test_results_carry_the_memory_columns_and_the_figure(bound, tmp_path):
    folder = write_results(bound, tmp_path / "run")
    results = read_results(folder)
    for name in MEMORY_STEP_COLUMNS:
        np.testing.assert_array_equal(results.steps.column(name), bound.steps[name])
    for name in ("num_preemptions", "recomputed_tokens", "cached_tokens"):
        np.testing.assert_array_equal(results.requests.column(name), bound.requests[name])
    assert "KV cache and queue" in report_figures(results)
    figure = plot_memory(results)
    assert "preemption" in figure.axes[0].get_legend_handles_labels()[1][1]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            ["--set", "gpu.name=L40S", "--set", "model.params=40e9"],
            "memory: the model's weights (80.0 GB) leave no cache in 0.9 x 48 GB of the L40S",
        ),
        (["--set", "memory.kv_cache_gib=0.001"], "cannot hold one conv-state slot"),
        (["--set", "memory.kv_cache_gib=0.05"], "KV blocks, the cache holds"),
        (["--set", "memory.gpu_memory_utilization=1.5"], "must be in (0, 1], got 1.5"),
        (["--set", "memory.block_size=0"], "memory.block_size: must be positive"),
    ],
)
def test_memory_limits_are_one_line_before_any_work(settings, message, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["simulate", "--limit", "50", "--quiet", "--out", str(out), *settings]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not out.exists()


def test_a_block_size_that_splits_the_hashed_blocks_is_refused(capsys, tmp_path):
    argv = ["simulate", str(MOONCAKE), "--quiet", "--out", str(tmp_path / "o")]
    assert cli.main([*argv, "--set", "memory.block_size=48"]) == 2
    assert "48 does not divide the trace's 512-token hashed blocks" in capsys.readouterr().err
    assert (
        cli.main(
            [
                *argv,
                "--limit",
                "5",
                "--set",
                "memory.block_size=48",
                "--set",
                "memory.prefix_caching=false",
            ]
        )
        == 0
    )


#: 20 blocks of 4 tokens (1 byte of KV a token, no conv-state memory) for up to 4 live
#: requests of up to 63 positions each: preemptions are certain.
TIGHT_LIVE = {
    "model.params": 8.0e9,  # an 8B model's step times, so the six requests overlap
    "model.kv_bytes_per_token": 1,
    "model.conv_layers": 0,
    "memory.block_size": 4,
    "memory.kv_cache_gib": 80 / 2**30,
    "memory.check": True,
}


@pytest.mark.parametrize(
    "backend",
    [{}, pytest.param({"live.backend": "triton", "live.device": "cuda"}, marks=pytest.mark.gpu)],
)
def test_preemption_keeps_greedy_decoding_in_live_mode(backend):
    from test_sim_live import live_run

    # The reference runs on the same backend and device: CUDA draws other random weights.
    _, reference, _ = live_run(**backend)
    table, live, result = live_run(**TIGHT_LIVE, **backend)
    assert result.summary["memory"]["capacity_blocks"] == 20
    assert result.requests["num_preemptions"].sum() > 0
    for request_id in range(table.num_requests):
        np.testing.assert_array_equal(live.output(request_id), reference.output(request_id))


def test_the_mean_usage_does_not_depend_on_blas_threads():
    """Over 10,000 steps a BLAS dot product is split over its threads, so its last bits
    would follow the core count (a Ray worker runs BLAS on one thread); the summary's
    mean usage is the same number on any."""
    import os
    import subprocess
    import sys

    run = (
        "from stepplan.sim.settings.config import SimConfig\n"
        "from stepplan.sim.run import prepare_requests, simulate\n"
        "from stepplan.sim.workloads import parse_synthetic\n"
        "config = SimConfig()\n"
        "table = prepare_requests(parse_synthetic('synthetic:n=2000,rate=10'), config)\n"
        "result = simulate(table, config)\n"
        "print(len(result.steps['kv_usage']), repr(result.summary['memory']['mean_usage']))\n"
    )
    said = set()
    for threads in ("1", "4"):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
        done = subprocess.run([sys.executable, "-c", run], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        steps, mean = done.stdout.split()
        assert int(steps) > 10_000
        said.add(mean)
    assert len(said) == 1
