"""The simulation loop, cost model and results files."""

from __future__ import annotations

import errno
import json

import numpy as np
import pytest

from stepplan.sim.results import table as table_module
from stepplan.sim.results.outdir import OutDirError
from stepplan.sim.results.sim_result import read_results, write_results
from stepplan.sim.run import simulate
from stepplan.sim.settings.config import SimConfig, flatten, with_settings
from stepplan.sim.timing.cost import ConvGeometry, ProfileError, load_profile
from stepplan.sim.workloads import parse_synthetic

WORKLOAD = "synthetic:n=120,rate=40,cv2=3,prompt=zipf:1.1:3000,output=uniform:1:60"


def run(seed: int = 0, **settings):
    config = with_settings(SimConfig(seed=seed), settings)
    return simulate(parse_synthetic(WORKLOAD, seed=5), config)


@pytest.fixture(scope="module")
def result():
    return run()


def test_every_request_finishes_in_order(result):
    req = result.requests
    assert not np.isnan(req["finish_s"]).any()
    assert (req["first_token_s"] > req["arrival_s"]).all()
    assert (req["finish_s"] >= req["first_token_s"]).all()
    np.testing.assert_allclose(req["e2e_s"], req["finish_s"] - req["arrival_s"])
    assert (req["accepted_tokens"] <= req["drafted_tokens"]).all()
    one_token = req["output_tokens"] == 1
    assert (
        np.isnan(req["tpot_s"][one_token]).all() and not np.isnan(req["tpot_s"][~one_token]).any()
    )


def test_steps_tile_the_clock_and_add_up(result):
    steps = result.steps
    ends = steps["start_s"] + steps["duration_s"]
    assert (steps["start_s"][1:] >= ends[:-1] - 1e-12).all(), "steps overlap"
    terms = steps["model_s"] + steps["conv_s"] + steps["host_s"] + steps["launch_s"]
    np.testing.assert_allclose(steps["duration_s"], terms, rtol=1e-12)
    kinds = ("spec", "decode", "prefill")
    np.testing.assert_array_equal(steps["num_rows"], sum(steps[f"num_{k}_rows"] for k in kinds))
    req = result.requests
    # every scheduled token is committed, a rejected draft, or one of the k placeholder
    # drafts a request admitted with one token left is padded with (vLLM's rule)
    rejected = req["drafted_tokens"].sum() - req["accepted_tokens"].sum()
    committed = (req["prompt_tokens"] + req["output_tokens"] - 1).sum()
    placeholders = steps["num_tokens"].sum() - (committed + rejected)
    k = SimConfig().scheduler.num_spec_tokens
    assert 0 <= placeholders <= k * len(req["prompt_tokens"]) and placeholders % k == 0
    hit = steps["graph_hit"] == 1
    assert ((steps["graph_kind"] != "") == hit).all()
    assert (steps["graph_tokens"][hit] >= steps["num_tokens"][hit]).all()
    assert (steps["padded_tokens"][~hit] == 0).all()


def test_summary_schema(result):
    summary = result.summary
    for key in ("stepplan_version", "config", "trace", "throughput", "goodput", "latency_ms"):
        assert key in summary
    assert set(summary["latency_ms"]) == {"ttft", "tpot", "itl", "e2e"}
    assert len(summary["itl_ms_quantiles"]) == 101
    assert summary["itl_ms_quantiles"] == sorted(summary["itl_ms_quantiles"])
    assert summary["steps"]["count"] == result.steps["step"].size
    assert summary["requests"] == 120
    assert summary["duration_s"] == pytest.approx(result.requests["finish_s"].max())
    times = summary["time_s"]
    assert times["busy"] == pytest.approx(result.steps["duration_s"].sum())
    assert summary["config"]["scheduler"]["num_spec_tokens"] == 3
    json.dumps(summary)  # JSON-ready


def test_same_seed_same_results(result):
    again = run()
    for name, column in result.requests.items():
        np.testing.assert_array_equal(again.requests[name], column, err_msg=name)
    for name, column in result.steps.items():
        if name != "plan_us":  # measured wall time
            np.testing.assert_array_equal(again.steps[name], column, err_msg=name)
    other = run(seed=1)
    assert not np.array_equal(other.requests["accepted_tokens"], result.requests["accepted_tokens"])


def test_host_cost_modes(result):
    seed = run(**{"cost.host_cost": "seed", "scheduler.num_groups": 2})
    uniform = seed.steps["num_rows"] == np.maximum(
        seed.steps["num_spec_rows"], seed.steps["num_decode_rows"]
    )
    np.testing.assert_allclose(seed.steps["host_s"][uniform], 500e-6)
    np.testing.assert_allclose(seed.steps["host_s"][~uniform], 1800e-6)
    measured = run(**{"cost.host_cost": "measured"})
    np.testing.assert_allclose(measured.steps["host_s"], measured.steps["plan_us"] * 1e-6)
    base = result.steps
    assert (base["host_s"] < 200e-6).all()


def test_graph_modes_and_no_spec():
    eager = run(**{"planner.graph_mode": "none"})
    assert eager.summary["steps"]["graph_hits"] == 0
    mixed = run(**{"planner.graph_mode": "mixed"})
    assert (mixed.steps["graph_kind"] == "mixed").any()
    plain = run(**{"scheduler.num_spec_tokens": 0})
    assert plain.steps["num_spec_rows"].sum() == 0
    assert plain.summary["acceptance"]["spec_steps"] == 0
    assert (plain.requests["num_steps"] >= plain.requests["output_tokens"]).all()


def test_write_read_round_trip_and_replace(tmp_path, result):
    out = write_results(result, tmp_path / "run")
    assert sorted(p.name for p in out.iterdir()) == [
        "measured.json",
        "measured_steps.csv",
        "requests.csv",
        "stepplan-manifest.json",
        "steps.csv",
        "summary.json",
    ]
    back = read_results(out)
    for table, original in ((back.steps, result.steps), (back.requests, result.requests)):
        for name, column in original.items():
            assert table[name].dtype == column.dtype, name
            np.testing.assert_array_equal(table[name], column, err_msg=name)
    assert back.summary == json.loads(json.dumps(result.summary))
    write_results(result, out, overwrite=True)  # over an earlier run's folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_failed_write_leaves_nothing_behind(tmp_path, result, monkeypatch):
    write_results(result, tmp_path / "run")
    before = (tmp_path / "run" / "steps.csv").read_text()

    def broken(self, columns):
        self._handle.write("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(table_module.CsvWriter, "append", broken)
    with pytest.raises(OutDirError, match="run: no space left on the device while writing"):
        write_results(result, tmp_path / "run", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".")]
    assert (tmp_path / "run" / "steps.csv").read_text() == before


def test_profile_interpolates_its_points():
    profile = load_profile("public")  # SPEC §4's figures of the public kernel
    for kind, rows, tokens, us in (("decode", 256, 256, 22.0), ("spec", 64, 256, 21.1)):
        counts = [0, 0, 0]
        counts[("spec", "decode", "prefill").index(kind)] = rows
        toks = [0, 0, 0]
        toks[("spec", "decode", "prefill").index(kind)] = tokens
        assert profile.time_us(tuple(counts), tuple(toks)) == pytest.approx(us)
    small = profile.time_us((1, 0, 0), (1, 0, 0))
    assert small == pytest.approx(5.5)  # held at the smallest measured time
    mixed = profile.time_us((64, 0, 1), (256, 0, 512))
    assert mixed == pytest.approx(21.1 + 26.2)  # one launch per kind: the sum


def test_floor_bytes_match_spec_anchors():
    geometry = ConvGeometry(8192, 4, 3, 2)
    floor_us = {  # SPEC §4 floors at 4.26 TB/s
        ("decode", 256, 256): 20.7,
        ("spec", 256, 1024): 32.5,
        ("prefill", 4, 16384): 189.0,
    }
    for (kind, rows, tokens), us in floor_us.items():
        assert geometry.bytes(kind, rows, tokens) / 4.26e12 * 1e6 == pytest.approx(us, rel=0.01)


def test_bad_profile_is_refused(tmp_path):
    path = tmp_path / "p.json"
    geometry = {"channels": 8, "kernel_size": 4, "dilation": 1, "dtype_bytes": 2}
    entries = [{"kind": "decode", "rows": 1, "us": 2}]  # no tokens
    path.write_text(json.dumps({"geometry": geometry, "entries": entries}))
    with pytest.raises(ProfileError, match=r"entries\[0\]"):
        load_profile(path)


def test_summary_config_reads_back_into_the_same_settings(result):
    changed = with_settings(
        SimConfig(name="x"),
        {"planner.graph_sizes": [1, 2, 4], "scheduler.slot_capacity": 9, "acceptance.probs": [0.9]},
    )
    document = json.loads(json.dumps(changed.to_dict()))
    assert with_settings(SimConfig(), flatten(document)) == changed
    stored = json.loads(json.dumps(result.summary["config"]))
    assert with_settings(SimConfig(), flatten(stored)) == SimConfig()


def test_fused_profile_prices_mixed_steps_by_total_bytes(tmp_path):
    geometry = {"channels": 8192, "kernel_size": 4, "dilation": 3, "dtype_bytes": 2}
    entries = [
        {"kind": "decode", "rows": 1, "tokens": 1, "us": 2.0},
        {"kind": "prefill", "rows": 1, "tokens": 512, "us": 8.0},
        {"kind": "mixed", "bytes": 1e6, "us": 3.0},
        {"kind": "mixed", "bytes": 1e9, "us": 300.0},
    ]
    path = tmp_path / "fused.json"
    path.write_text(json.dumps({"geometry": geometry, "entries": entries}))
    profile = load_profile(path)
    spec_bytes = profile.geometry.bytes("spec", 64, 256)
    prefill_bytes = profile.geometry.bytes("prefill", 1, 512)
    total = spec_bytes + prefill_bytes
    expected = 3.0 + (300.0 - 3.0) * (total - 1e6) / (1e9 - 1e6)
    assert profile.time_us((64, 0, 1), (256, 0, 512)) == pytest.approx(expected)
    # one kind alone uses its own curve; spec falls back to decode's without spec entries
    assert profile.time_us((0, 0, 1), (0, 0, 512)) == pytest.approx(8.0)
    assert profile.time_us((1, 0, 0), (1, 0, 0)) == pytest.approx(2.0)
