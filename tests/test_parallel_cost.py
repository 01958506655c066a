"""Tensor parallelism per replica and dollars: what a rank holds, what its all-reduces
cost, that one rank changes nothing, and what the deployment costs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from golden_sim import GOLDEN, digests, simulate_run
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.planner import PlannerConfig, StepBatch, compile_plan
from stepplan.plots.report import build_report, format_value
from stepplan.sim import cli
from stepplan.sim.memory_sizing import model_footprint
from stepplan.sim.run import simulate
from stepplan.sim.settings import presets
from stepplan.sim.settings.config import (
    ConfigError,
    CostConfig,
    GpuConfig,
    ModelConfig,
    SimConfig,
    check_config,
    with_settings,
)
from stepplan.sim.settings.gpus import GPU_PRESETS
from stepplan.sim.sweep.records import metric
from stepplan.sim.timing.cost import CostModel
from stepplan.sim.timing.parallel import split_model, split_problem
from stepplan.sim.timing.pricing import deployment_dollars

WORKLOAD = "synthetic:n=60,rate=40,prompt=uniform:16:3000,output=uniform:1:60"
HYBRID_8B = presets.MODEL_PRESETS["hybrid-8b"]


def run(settings_: dict, workload: str = WORKLOAD) -> dict:
    args = cli.build_parser().parse_args(["simulate", workload])
    config = check_config(cli.with_settings(cli.build_config(args), settings_))
    return simulate(cli.load_requests(args, config), config)


def prefill_plan(tokens: int):
    """One compute-bound prefill step of ``tokens`` tokens, eager (no padding)."""
    batch = StepBatch(
        query_lens=np.array([tokens], np.int32),
        num_computed_tokens=np.zeros(1, np.int32),
        slots=np.array([1], np.int32),
        num_draft_tokens=np.array([-1], np.int32),
        num_accepted_tokens=np.ones(1, np.int32),
    )
    return compile_plan(batch, PlannerConfig(num_spec_tokens=0, graph_mode="none"))


# ------------------------------------------------------------------ memory per rank


def norm_bytes(model: ModelConfig) -> float:
    model = model.resolved()
    return (2 * model.layers + 1) * model.hidden_size * model.dtype_bytes


@pytest.mark.parametrize("ranks", [1, 2, 4, 8])
def test_a_rank_holds_its_share_of_the_weights_and_the_norms_whole(ranks):
    model = ModelConfig()
    whole = presets.weight_bytes(HYBRID_8B)
    footprint = model_footprint(model, 3, ranks)
    copied = norm_bytes(model) if ranks > 1 else whole  # 8 KV heads: none copied up to 8
    assert footprint.weights_bytes == pytest.approx((whole - copied) / ranks + copied)
    # the shards over every rank, plus the copied part once, are the whole model
    share = split_model(model, ranks)
    assert (share.weights_bytes - share.copied_bytes) * ranks + share.copied_bytes == (
        pytest.approx(whole)
    )
    one = model_footprint(model, 3, 1)
    assert footprint.kv_bytes_per_token * ranks == one.kv_bytes_per_token
    assert footprint.slot_bytes * ranks == one.slot_bytes
    assert footprint.kept_state_bytes * ranks == one.kept_state_bytes


def test_weights_halve_at_two_ranks_plus_the_norms():
    whole = presets.weight_bytes(HYBRID_8B)
    half = model_footprint(ModelConfig(), 3, 2).weights_bytes
    assert half == pytest.approx(whole / 2 + norm_bytes(ModelConfig()) / 2)
    assert whole / 2 < half < whole / 2 + 1e6  # the norms are a few hundred KB


def test_more_ranks_than_kv_heads_copy_them():
    tiny = ModelConfig(name="tiny")  # 4 query heads, 2 KV heads of 8 dims
    share = split_model(tiny, 4)
    assert share.kv_bytes_per_token == tiny.resolved().kv_bytes_per_token / 2
    kv_proj = 2 * 32 * (2 * 8)  # k and v of a layer: hidden x (KV heads x head_dim)
    # two attention layers, float32; a rank holds half the KV heads, not a quarter
    copied_kv = 2 * kv_proj * (1 / 2 - 1 / 4) * 4
    assert share.copied_bytes == pytest.approx(norm_bytes(tiny) + copied_kv)


def test_the_cache_grows_as_the_weights_split():
    budgets = {}
    for ranks in (1, 2, 4):
        memory = run({"parallel.tensor": ranks, "gpu.name": "H100"}).summary["memory"]
        budgets[ranks] = memory
        weights = model_footprint(ModelConfig(), 3, ranks).weights_bytes
        assert memory["budget_gib"] * 2**30 == pytest.approx(80e9 * 0.9 - weights)
    # per rank: more budget and smaller blocks, so more than ranks-fold the blocks
    assert budgets[2]["capacity_blocks"] > 2 * budgets[1]["capacity_blocks"]
    assert budgets[4]["capacity_blocks"] > 2 * budgets[2]["capacity_blocks"]


def test_a_model_too_large_for_one_gpu_fits_on_two_when_the_arithmetic_says_so(capsys):
    big = {"gpu.name": "L40S", "model.params": 2.2e10}  # 44 GB of weights, 43.2 GB usable
    with pytest.raises(ConfigError, match=r"weights \(44\.0 GB\) leave no cache"):
        run(big)
    summary = run({**big, "parallel.tensor": 2}).summary
    too_big = {"gpu.name": "L40S", "model.params": 4.4e10, "parallel.tensor": 2}
    with pytest.raises(ConfigError) as refused:
        run(too_big)
    # the refusal names the figures: a rank's weights against the GPU's usable memory
    assert str(refused.value).startswith(
        "memory: a GPU's weights at parallel.tensor = 2 (44.0 GB) leave no cache in "
        "0.9 x 48 GB of the L40S; raise memory.gpu_memory_utilization or parallel.tensor"
    )
    assert run({**too_big, "parallel.tensor": 4}).summary["memory"]["capacity_blocks"] > 0
    assert summary["memory"]["weights_gib"] * 2**30 == pytest.approx(
        model_footprint(ModelConfig(params=2.2e10), 3, 2).weights_bytes
    )
    assert summary["memory"]["capacity_blocks"] > 0


# ------------------------------------------------------------------ the step's time


@pytest.mark.parametrize("gpu", ["H100", "A100", "L40S"])
@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_the_allreduce_is_a_ring_over_the_presets_link(gpu, ranks):
    preset = GPU_PRESETS[gpu]
    plan = prefill_plan(1000)
    cost = CostModel.create(ModelConfig(), GpuConfig(name=gpu), CostConfig(), tensor=ranks)
    message = plan.padded_tokens * 4096 * 2  # [tokens, hidden] in bf16
    steps = 2 * (ranks - 1)
    one = steps * preset.link_latency_us * 1e-6 + steps / ranks * message / preset.link_bw_bytes_s
    assert cost.allreduce_s(plan) == pytest.approx(2 * 32 * one, rel=1e-12)


def test_the_link_figures_are_the_datasheets_per_direction():
    bidirectional = {"H100": 900e9, "H200": 900e9, "A100": 600e9, "B200": 1800e9, "L40S": 64e9}
    for name, total in bidirectional.items():
        assert GPU_PRESETS[name].link_bw_bytes_s == total / 2


def test_two_ranks_prefill_faster_than_one_all_reduce_included():
    plan = prefill_plan(8192)
    kv, pairs = 8192, 8192 * (8192 + 1) / 2
    terms = {}
    for ranks in (1, 2):
        cost = CostModel.create(ModelConfig(), GpuConfig(name="H100"), CostConfig(), tensor=ranks)
        terms[ranks] = cost.terms(plan, kv, pairs, 0.0)
    model_1, model_2 = terms[1][0], terms[2][0]
    allreduce_2 = terms[2][5]
    assert terms[1][5] == 0.0 and allreduce_2 > 0.0
    # compute-bound: a rank does half the FLOPs (and the copied norms' share)
    assert model_2 == pytest.approx(model_1 / 2, rel=1e-4)
    assert sum(terms[2]) < sum(terms[1])
    assert sum(terms[2]) > model_2 + allreduce_2  # the all-reduce is part of the step


def test_one_rank_gives_the_golden_results():
    name, trace, settings_ = (
        "bundled-mixed-q2-groups2",
        None,
        {
            "workload.limit": 600,
            "planner.graph_mode": "mixed",
            "scheduler.num_spec_tokens": 2,
            "scheduler.num_groups": 2,
        },
    )
    steps, requests = simulate_run(trace, {**settings_, "parallel.tensor": 1})
    golden = json.loads(GOLDEN.read_text())[name]
    got = digests(steps)
    assert {k: got[k] for k in golden["steps"]} == golden["steps"]
    assert {k: v for k, v in digests(requests).items() if k in golden["requests"]} == (
        golden["requests"]
    )
    assert not np.asarray(steps["allreduce_s"]).any()


def test_a_step_lasts_its_terms_all_reduce_included():
    result = run({"parallel.tensor": 4})
    steps = result.steps
    terms = ("model_s", "conv_s", "host_s", "launch_s", "engine_s", "allreduce_s")
    total = sum(np.asarray(steps[term]) for term in terms)
    assert np.allclose(np.asarray(steps["duration_s"]), total, rtol=1e-12, atol=0)
    assert np.asarray(steps["allreduce_s"]).min() > 0
    assert result.summary["time_s"]["allreduce"] == pytest.approx(steps["allreduce_s"].sum())


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("settings_", "message"),
    [
        ({"parallel.tensor": 3}, "parallel.tensor: 3 does not divide model.num_heads = 32"),
        (
            {"parallel.tensor": 8, "model.name": "tiny"},
            "parallel.tensor: 8 does not divide model.num_heads = 4",
        ),
        (
            {"parallel.tensor": 2, "model.num_kv_heads": 3},
            "parallel.tensor: 2 neither divides model.num_kv_heads = 3",
        ),
        ({"parallel.tensor": 2, "live.enabled": True}, "parallel.tensor: 2 with live.enabled"),
    ],
)
def test_a_split_the_model_cannot_take_is_one_line_naming_the_setting(settings_, message):
    with pytest.raises(ConfigError, match=message):
        check_config(with_settings(SimConfig(), settings_))


def test_the_command_line_refuses_in_one_line(tmp_path, capsys):
    argv = ["simulate", "--quiet", "--limit", "5", "--out", str(tmp_path / "o")]
    assert cli.main([*argv, "--set", "parallel.tensor=6"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "parallel.tensor: 6 does not divide" in err
    assert not (tmp_path / "o").exists()
    with pytest.raises(ConfigError, match="must be 1 to 8"):
        with_settings(SimConfig(), {"parallel.tensor": 16})


def test_a_custom_model_without_heads_runs_on_one_rank_only():
    figures = presets.model_figures("hybrid-8b")
    custom = {f"model.{k}": v for k, v in figures.items() if k not in ("num_heads", "num_kv_heads")}
    config = with_settings(SimConfig(), {**custom, "model.name": "custom"})
    assert split_problem(config.model, 1) is None
    with pytest.raises(ConfigError, match=r"needs model\.num_heads and model\.num_kv_heads"):
        check_config(with_settings(config, {"parallel.tensor": 2}))


# ------------------------------------------------------------------ dollars


def test_dollars_come_from_the_preset_and_the_ranks():
    summary = run({"parallel.tensor": 2, "gpu.name": "H100"}).summary
    dollars, gpu = summary["dollars"], summary["gpu"]
    assert gpu["price_per_hour"] == GPU_PRESETS["H100"].price_per_hour
    assert gpu["link"] == "NVLink 4" and gpu["link_bw_bytes_s"] == 450e9
    assert "RunPod" in gpu["price_source"]
    assert dollars["gpus"] == 2
    assert dollars["per_hour"] == pytest.approx(2 * GPU_PRESETS["H100"].price_per_hour)
    hours = summary["duration_s"] / 3600
    output = summary["throughput"]["output_tokens_per_s"] * summary["duration_s"]
    assert dollars["per_million_output_tokens"] == pytest.approx(
        dollars["per_hour"] * hours / output * 1e6
    )
    good = summary["goodput"]["requests"]
    assert dollars["good_requests_per_dollar"] == pytest.approx(
        good / (dollars["per_hour"] * hours)
    )


def test_a_given_price_overrides_the_preset():
    summary = run({"gpu.name": "A100", "gpu.price_per_hour": 1.25}).summary
    assert summary["dollars"]["per_hour"] == 1.25
    assert summary["gpu"]["price_source"] == "given"
    custom = {"gpu.name": "custom", "gpu.memory_gb": 80, "gpu.memory_bw_bytes_s": 2e12}
    summary = run({**custom, "gpu.peak_flops": 5e14}).summary
    assert summary["dollars"]["per_hour"] is None
    assert summary["dollars"]["per_million_output_tokens"] is None


def test_the_console_table_shows_the_dollars(tmp_path, capsys):
    argv = ["simulate", WORKLOAD, "--out", str(tmp_path / "o"), "--set", "parallel.tensor=2"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "GPU H200 x 2 (tensor parallel)" in out
    rows = dict(line.rsplit(None, 1) for line in out.splitlines() if line.startswith(("$", "GPUs")))
    document = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert rows["GPUs"] == "2"
    assert rows["$ per hour"] == f"{document['dollars']['per_hour']:,.2f}"


@settings(max_examples=200, deadline=None)
@given(
    st.floats(0.01, 100.0),
    st.integers(1, 64),
    st.floats(1e-3, 1e7),
    st.integers(1, 10**12),
    st.integers(0, 10**9),
)
def test_cost_per_million_output_tokens_is_price_gpus_hours_over_tokens(
    price, gpus, duration_s, output, good
):
    dollars = deployment_dollars(price, gpus, duration_s, output, good)
    wall_hours = duration_s / 3600
    assert dollars["per_million_output_tokens"] == pytest.approx(
        price * gpus * wall_hours / output * 1e6, rel=1e-12
    )
    assert dollars["per_hour"] == pytest.approx(price * gpus, rel=1e-15)
    assert dollars["good_requests_per_dollar"] == pytest.approx(
        good / (price * gpus * wall_hours), rel=1e-12
    )


def test_the_sweep_table_has_the_dollars():
    summary = run({"parallel.tensor": 2, "gpu.name": "A100"}).summary
    dollars = summary["dollars"]
    assert metric(summary, "usd_per_hour") == dollars["per_hour"] == 2 * 2.16
    assert metric(summary, "usd_per_m_output_tokens") == dollars["per_million_output_tokens"]
    assert metric(summary, "good_requests_per_usd") == dollars["good_requests_per_dollar"]


def test_the_report_shows_the_dollars():
    result = run({"parallel.tensor": 2})
    page = build_report(result, figures={})
    dollars = result.summary["dollars"]
    assert "<h2>Dollars</h2>" in page
    cell = format_value(dollars["per_million_output_tokens"])
    assert f"<td>per_million_output_tokens</td><td>{cell}</td>" in page
    assert "<td>link</td><td>NVLink 4</td>" in page


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2, 4, 8, 16]),
    st.integers(1, 8),
    st.integers(0, 8),
    st.sampled_from([64, 128]),
)
def test_the_ranks_shards_and_the_copies_add_up_to_the_model(ranks, kv_heads, attention, conv, dim):
    """Against a count of each weight by hand: every rank's shard once, the norms and the
    copied KV heads on every rank."""
    hidden, heads = 1024, 16
    figures = {
        "model.name": "custom",
        "model.layers": attention + conv,
        "model.conv_layers": conv,
        "model.hidden_size": hidden,
        "model.params": 5e8,
        "model.dtype_bytes": 2,
        "model.kv_bytes_per_token": attention * 2 * kv_heads * dim * 2,
        "model.conv_channels": 2048,
        "model.conv_kernel_size": 4,
        "model.conv_dilation": 3,
        "model.max_model_len": 4096,
        "model.num_heads": heads,
        "model.num_kv_heads": kv_heads,
    }
    model = with_settings(SimConfig(), figures).model
    assert split_problem(model, ranks) is None  # powers of two: one divides the other
    share = split_model(model, ranks)
    norms = (2 * (attention + conv) + 1) * hidden
    kv_proj = attention * 2 * hidden * kv_heads * dim
    holders = min(ranks, kv_heads)
    # a rank: its shard of the rest, the norms whole, its KV heads (1 / holders of them)
    rest = 5e8 - norms - kv_proj
    assert share.params == pytest.approx(rest / ranks + norms + kv_proj / holders, rel=1e-12)
    assert share.kv_bytes_per_token * holders == pytest.approx(attention * 2 * kv_heads * dim * 2)
    # together: the model once, plus every further copy of the norms and of the KV heads
    copies = (ranks - 1) * norms + kv_proj * (ranks / holders - 1)
    assert share.params * ranks == pytest.approx(5e8 + copies, rel=1e-12)
    assert share.copied_bytes == pytest.approx(
        2 * (norms + kv_proj * (1 / holders - 1 / ranks)) if ranks > 1 else 2 * 5e8
    )
