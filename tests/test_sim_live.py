"""Live mode: the simulator drives the hybrid model (attention included); its tokens are
plain greedy decoding of each prompt."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.executor.model.dense import dense_logits
from stepplan.sim import cli
from stepplan.sim.live import LiveStepper, pad_drafts, request_prompt
from stepplan.sim.run import prepare_requests, simulate
from stepplan.sim.settings.config import ConfigError, SimConfig, with_settings
from stepplan.sim.workloads import parse_synthetic

# Prompts longer than the token budget (chunked prefill), outputs long enough for spec steps.
WORKLOAD = "synthetic:n=6,rate=200,prompt=uniform:2:40,output=uniform:1:24"
SETTINGS = {
    "live.enabled": True,
    "model.name": "tiny",
    "scheduler.max_num_seqs": 4,
    "scheduler.max_num_batched_tokens": 20,
    "scheduler.num_spec_tokens": 3,
    "planner.graph_mode": "mixed",
    "planner.graph_sizes": [1, 2, 4, 8, 16],
}
# bf16 on CUDA: flash attention, and with it CUDA graphs per bucket.
GPU_SETTINGS = {"live.backend": "triton", "live.device": "cuda", "live.dtype": "bfloat16"}


def live_run(seed: int = 0, **settings):
    config = with_settings(SimConfig(seed=seed), {**SETTINGS, **settings})
    table = prepare_requests(parse_synthetic(WORKLOAD, seed=4), config)
    live = LiveStepper.create(config, config.plan, table)
    return table, live, simulate(table, config, live=live)


@pytest.fixture(scope="module")
def reference_run():
    return live_run()


def greedy_continues(live: LiveStepper, request_id: int) -> bool:
    """Whether the output is the dense model's greedy decoding of the prompt.

    One causal pass of the dense oracle (no cache, no plan) over prompt + output checks
    every output token at once, with the runner's own weights.
    """
    prompt, output = live.prompt(request_id), live.output(request_id)
    runner = live.runner
    weights = runner.weights
    stream = torch.as_tensor(np.concatenate([prompt, output]))
    with torch.no_grad():
        greedy = dense_logits(weights, runner.shape, stream).argmax(dim=-1).cpu().numpy()
    return bool((greedy[prompt.size - 1 : -1] == output).all())


def test_every_request_emits_its_trace_output_length(reference_run):
    table, live, result = reference_run
    for request_id in range(table.num_requests):
        assert live.output(request_id).size == table.output_tokens[request_id]
        assert live.prompt(request_id).size == table.prompt_tokens[request_id]
    assert not np.isnan(result.requests["finish_s"]).any()


def test_live_tokens_equal_plain_greedy_decoding(reference_run):
    table, live, result = reference_run
    steps = result.steps
    assert steps["num_spec_rows"].sum() > 0 and steps["num_prefill_rows"].sum() > 0
    chunked = steps["num_prefill_tokens"] >= SETTINGS["scheduler.max_num_batched_tokens"]
    assert chunked.any(), "the workload should split a prompt over steps"
    for request_id in range(table.num_requests):
        assert greedy_continues(live, request_id), request_id


@settings(max_examples=20, deadline=None)
@given(
    budget=st.integers(6, 48),
    max_num_seqs=st.integers(1, 4),
    spec=st.integers(0, 3),
    mode=st.sampled_from(["none", "full", "mixed"]),
    groups=st.integers(1, 2),
)
def test_any_schedule_keeps_greedy_decoding(
    reference_run, budget, max_num_seqs, spec, mode, groups
):
    _, reference_live, _ = reference_run
    table, live, _ = live_run(
        **{
            "scheduler.max_num_batched_tokens": budget,
            "scheduler.max_num_seqs": max_num_seqs,
            "scheduler.num_spec_tokens": spec,
            "scheduler.num_groups": groups,
            "planner.graph_mode": mode,
        }
    )
    for request_id in range(table.num_requests):
        np.testing.assert_array_equal(live.output(request_id), reference_live.output(request_id))


def test_acceptance_summary_is_the_live_verification(reference_run):
    _, _, result = reference_run
    summary, requests = result.summary, result.requests
    acceptance = summary["acceptance"]
    assert summary["live"] is True and summary["config"]["live"]["enabled"] is True
    assert summary["live_run"]["backend"] == "reference" and summary["live_run"]["reproducible"]
    assert acceptance["accepted_tokens"] == requests["accepted_tokens"].sum()
    assert acceptance["drafted_tokens"] == result.steps["num_spec_decode_tokens"].sum() - (
        result.steps["num_spec_rows"].sum()
    )
    assert 0 < acceptance["accepted_tokens"] < acceptance["drafted_tokens"]
    # Every emitted token beyond the first is one spec step's bonus or an accepted draft.
    emitted_after_first = (requests["output_tokens"] - 1).sum()
    assert emitted_after_first == acceptance["spec_steps"] + acceptance["accepted_tokens"]


def test_same_seed_same_results_with_model_time(reference_run):
    table, live, result = reference_run
    _, again_live, again = live_run()
    for name in ("finish_s", "accepted_tokens", "num_steps"):
        np.testing.assert_array_equal(result.requests[name], again.requests[name])
    np.testing.assert_array_equal(result.steps["duration_s"], again.steps["duration_s"])
    for request_id in range(table.num_requests):
        np.testing.assert_array_equal(live.output(request_id), again_live.output(request_id))


def test_measured_time_is_the_engines_step():
    _, live, result = live_run(**{"live.time": "measured"})
    steps = result.steps
    assert (steps["conv_s"] == 0).all() and (steps["launch_s"] == 0).all()
    assert (steps["model_s"] > 0).all()
    assert steps["model_s"].sum() == pytest.approx(live.model_wall_s)
    # the rest of the engine's step: the planner's measured time
    np.testing.assert_allclose(steps["host_s"], steps["plan_us"] * 1e-6)
    assert result.summary["live_run"]["reproducible"] is False


def test_a_warm_start_changes_no_token(reference_run):
    """The warm start's steps write junk into slots before serving; no request reads it."""
    table, live, _ = reference_run
    config = with_settings(SimConfig(seed=0), SETTINGS)
    warmed = LiveStepper.create(config, config.plan, table)
    warmed.warm_start(SETTINGS["scheduler.max_num_batched_tokens"])
    assert warmed.warm_start_steps > 0
    simulate(table, config, live=warmed)
    for request_id in range(table.num_requests):
        np.testing.assert_array_equal(live.output(request_id), warmed.output(request_id))
    assert warmed.summary()["warm_start"]["steps"] == warmed.warm_start_steps


def test_prompts_are_seeded_by_run_and_request():
    first = request_prompt(0, 3, 50, 64)
    assert first.min() >= 0 and first.max() < 64
    np.testing.assert_array_equal(first, request_prompt(0, 3, 50, 64))
    assert not np.array_equal(first, request_prompt(1, 3, 50, 64))
    assert not np.array_equal(first, request_prompt(0, 4, 50, 64))


def test_missing_drafts_repeat_the_last_one():
    assert pad_drafts([5, 6], 4, 9) == [5, 6, 6, 6]
    assert pad_drafts([], 3, 9) == [9, 9, 9]
    assert pad_drafts([1, 2, 3], 2, 9) == [1, 2]
    assert pad_drafts([], 0, 9) == []


def test_layer_groups_and_presets():
    table = parse_synthetic(WORKLOAD, seed=4)
    config = with_settings(SimConfig(), {**SETTINGS, "scheduler.num_groups": 3})
    with pytest.raises(ConfigError, match=r"live: num_groups: must be in 1\.\.2"):
        simulate(table, config)  # tiny has two conv layers
    result = simulate(table, with_settings(config, {"scheduler.num_groups": 2}))
    assert result.summary["live_run"]["model"] == "tiny"
    assert result.summary["live_run"]["shape"]["num_heads"] == 4
    with pytest.raises(ConfigError, match=r"model\.name: unknown model 'nope' \(known: hybrid-8b"):
        simulate(table, with_settings(config, {"model.name": "nope"}))


def test_cli_live_run(tmp_path, capsys):
    out = tmp_path / "live"
    argv = ["simulate", WORKLOAD, "--live", "--quiet", "--out", str(out), "--limit", "4"]
    argv += ["--set", "model.name=tiny"]
    argv += ["--max-num-seqs", "4", "--max-num-batched-tokens", "20"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == ""
    assert {"requests.csv", "steps.csv", "summary.json"} <= {p.name for p in out.iterdir()}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["live"] is True and summary["requests"] == 4
    assert "model_wall_s" not in summary["live_run"]  # measured: in measured.json
    measured = json.loads((out / "measured.json").read_text())
    assert measured["live_run"]["model_wall_s"] > 0
    assert summary["config"]["live"]["time"] == "model"


def test_cli_refuses_cuda_without_a_gpu(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    argv = ["simulate", WORKLOAD, "--live", "--live-device", "cuda", "--out", str(tmp_path)]
    argv += ["--set", "model.name=tiny"]
    assert cli.main(argv) == 2
    assert "live.device: cuda" in capsys.readouterr().err


def test_simulate_without_live_never_imports_the_executor(tmp_path):
    code = (
        "import sys\n"
        "from stepplan.sim import cli\n"
        f"assert cli.main(['simulate', {WORKLOAD!r}, '--quiet', '--out', {str(tmp_path)!r}]) == 0\n"
        "loaded = [m for m in sys.modules if m.startswith('stepplan.executor') or m == 'torch']\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_triton_kernels_interpreted_on_the_cpu(reference_run):
    """The executor's kernel path (Triton's interpreter here) in live mode, 3 requests."""
    if torch.cuda.is_available():
        pytest.skip("the GPU test runs the kernels compiled")
    table, live, _ = live_run(**{"live.backend": "triton", "workload.limit": 3})
    _, reference_live, _ = reference_run
    for request_id in range(table.num_requests):
        np.testing.assert_array_equal(live.output(request_id), reference_live.output(request_id))


@pytest.mark.gpu
def test_triton_on_cuda_serves_every_request_with_graphs():
    table, live, result = live_run(**GPU_SETTINGS)
    assert live.runner.captured_graphs, "the mixed graph mode should replay CUDA graphs"
    for request_id in range(table.num_requests):
        assert live.output(request_id).size == table.output_tokens[request_id]
    assert result.summary["live_run"]["device_name"] != "cpu"
    assert result.summary["live_run"]["attention"] == "flash"


@pytest.mark.gpu
def test_cli_live_run_on_cuda_with_measured_time(tmp_path):
    out = tmp_path / "live"
    argv = ["simulate", WORKLOAD, "--live", "--live-backend", "triton", "--live-device", "cuda"]
    argv += ["--live-time", "measured", "--quiet", "--out", str(out), "--graph-mode", "mixed"]
    argv += ["--max-num-seqs", "4", "--max-num-batched-tokens", "20", "--graph-sizes", "1,2,4,8,16"]
    argv += ["--set", "model.name=tiny", "--set", "live.dtype=bfloat16"]
    assert cli.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["live_run"]["time"] == "measured" and summary["live_run"]["device"].startswith(
        "cuda"
    )
