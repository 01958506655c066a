"""GPU presets mean what they say: their figures reach the roofline, the cache size and the
summary; an unknown name is one clear error; explicit figures override the preset."""

from __future__ import annotations

import numpy as np
import pytest

from stepplan.planner import PlannerConfig, StepBatch, compile_plan
from stepplan.sim import cli
from stepplan.sim.run import simulate
from stepplan.sim.settings import presets
from stepplan.sim.settings.config import (
    ConfigError,
    CostConfig,
    GpuConfig,
    ModelConfig,
    SimConfig,
    with_settings,
)
from stepplan.sim.settings.gpus import (
    ACHIEVED_BW_FRACTION,
    ACHIEVED_FLOPS_FRACTION,
    GPU_PRESETS,
    preset_for_device,
)
from stepplan.sim.timing.cost import CostModel, StepLoad

WORKLOAD = "synthetic:n=40,rate=50,prompt=uniform:16:800,output=uniform:1:40"


def run(settings: dict) -> dict:
    args = cli.build_parser().parse_args(["simulate", WORKLOAD])
    config = cli.with_settings(cli.build_config(args), settings)
    return simulate(cli.load_requests(args, config), config).summary


@pytest.mark.parametrize("name", list(GPU_PRESETS))
def test_each_preset_reaches_the_summary_and_the_cache(name):
    preset = GPU_PRESETS[name]
    summary = run({"gpu.name": name})
    gpu, memory = summary["gpu"], summary["memory"]
    assert gpu["name"] == name
    assert gpu["memory_gb"] == preset.memory_gb
    assert gpu["memory_bw_bytes_s"] == preset.memory_bw_bytes_s
    assert gpu["peak_flops"] == preset.peak_flops
    weights = presets.weight_bytes(presets.MODEL_PRESETS["hybrid-8b"])  # 16.87 GB
    assert memory["budget_gib"] * 2**30 == pytest.approx(preset.memory_gb * 1e9 * 0.9 - weights)
    # the bundled short-conv profile was measured on an H200: other GPUs scale it
    assert gpu["short_conv_scale"] == pytest.approx(4.26e12 / preset.memory_bw_bytes_s)
    assert (gpu["short_conv_scale"] == 1.0) == (name == "H200")
    assert "NVIDIA H200" in gpu["short_conv_note"]


def test_the_h200_keeps_its_measured_figures_and_others_are_derived():
    h200 = GPU_PRESETS["H200"]
    assert (h200.memory_bw_bytes_s, h200.peak_flops) == (4.26e12, 790e12)
    assert GpuConfig().resolved().memory_bw_bytes_s == 4.26e12
    a100 = GPU_PRESETS["A100"]
    assert a100.memory_bw_bytes_s == pytest.approx(2.039e12 * 4.26 / 4.8)
    assert a100.peak_flops == pytest.approx(312e12 * ACHIEVED_FLOPS_FRACTION)
    assert pytest.approx(0.8875) == ACHIEVED_BW_FRACTION
    assert "datasheet" in a100.figures and "measured" in h200.figures


def test_presets_change_the_step_times():
    batch = StepBatch(
        query_lens=np.array([1024], np.int32),
        num_computed_tokens=np.zeros(1, np.int32),
        slots=np.array([1], np.int32),
        num_draft_tokens=np.array([-1], np.int32),
        num_accepted_tokens=np.ones(1, np.int32),
    )
    plan = compile_plan(batch, PlannerConfig(num_spec_tokens=0, graph_mode="none"))
    load = StepLoad(1024, 1024 * 512.5)
    times = {}
    for name in ("H200", "A100"):
        cost = CostModel.create(ModelConfig(), GpuConfig(name=name), CostConfig())
        times[name] = (cost.model_s(plan, load), cost.conv_s(plan))
    ratio_flops = GPU_PRESETS["H200"].peak_flops / GPU_PRESETS["A100"].peak_flops
    assert times["A100"][0] == pytest.approx(times["H200"][0] * ratio_flops)  # compute bound
    ratio_bw = GPU_PRESETS["H200"].memory_bw_bytes_s / GPU_PRESETS["A100"].memory_bw_bytes_s
    assert times["A100"][1] == pytest.approx(times["H200"][1] * ratio_bw)


def test_explicit_figures_override_the_preset():
    summary = run({"gpu.name": "a100", "gpu.memory_bw_bytes_s": 1.5e12, "gpu.memory_gb": 40})
    gpu = summary["gpu"]
    assert gpu["name"] == "A100" and gpu["memory_bw_bytes_s"] == 1.5e12
    assert gpu["memory_gb"] == 40 and gpu["peak_flops"] == GPU_PRESETS["A100"].peak_flops
    assert "given: memory_gb, memory_bw_bytes_s" in gpu["figures"]
    assert summary["memory"]["budget_gib"] * 2**30 == pytest.approx(
        40e9 * 0.9 - presets.weight_bytes(presets.MODEL_PRESETS["hybrid-8b"])
    )


def test_a_custom_gpu_needs_every_figure():
    with pytest.raises(ConfigError, match="a custom GPU needs memory_gb"):
        with_settings(SimConfig(), {"gpu.name": "custom", "gpu.peak_flops": 1e15})
    config = with_settings(
        SimConfig(),
        {
            "gpu.name": "custom",
            "gpu.memory_gb": 96,
            "gpu.memory_bw_bytes_s": 3e12,
            "gpu.peak_flops": 5e14,
        },
    )
    assert config.gpu.resolved() == config.gpu


def test_an_unknown_gpu_is_one_line_naming_the_known_ones(tmp_path, capsys):
    argv = ["simulate", "--quiet", "--limit", "5", "--out", str(tmp_path / "o")]
    assert cli.main([*argv, "--set", "gpu.name=V100"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "stepplan: error: --set: gpu.name: unknown GPU 'V100' "
        "(known: H100, H200, B200, A100, L40S, custom)"
    )


def test_profile_devices_map_to_presets():
    assert preset_for_device("NVIDIA H200").name == "H200"
    assert preset_for_device("NVIDIA A100-SXM4-80GB").name == "A100"
    assert preset_for_device("NVIDIA H100 80GB HBM3").name == "H100"
    assert preset_for_device("NVIDIA L40S").name == "L40S"
    assert preset_for_device("some laptop") is None
