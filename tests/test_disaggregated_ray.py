"""Disaggregation on Ray: a sweep over co-located and disaggregated deployments, and the
cheapest-deployment search with disaggregation as a dimension, give on a local Ray of
two workers the very tables they give in this process."""

from __future__ import annotations

from stepplan.sim import cli

TRACE = "synthetic:n=40,rate=10,prompt=uniform:64:1024,output=uniform:1:48"
SPLIT_SWEEP = f"""
traces = ["{TRACE}"]
[grid]
disaggregation.prefill_replicas = [0, 1]
disaggregation.link = ["nvlink", "ethernet-100"]
deployment.replicas = [1, 2]
"""
CHEAPEST = ["--find", "cheapest", "--slo", "ttft_p99_ms=150,tpot_p99_ms=20"]
CHEAPEST += ["--rate-scale", "6", "--max-replicas", "3", "--gpus", "H100,A100"]
CHEAPEST += ["--tensor", "1,2", "--disaggregation", "off,on", "--quiet"]


def test_a_disaggregation_sweep_on_ray_gives_the_serial_table(tmp_path, local_ray):
    path = tmp_path / "sweep.toml"
    path.write_text(SPLIT_SWEEP)
    for where, flags in (("serial", ["--workers", "1"]), ("ray", ["--ray"])):
        argv = ["sweep", str(path), "--out", str(tmp_path / where), "--quiet", *flags]
        assert cli.main(argv) == 0
    for name in ("sweep.csv", "sweep.json"):
        serial = (tmp_path / "serial" / name).read_bytes()
        assert (tmp_path / "ray" / name).read_bytes() == serial, name


def test_the_cheapest_search_on_ray_gives_the_serial_table(tmp_path, local_ray):
    for where, flags in (("serial", ["--workers", "1"]), ("ray", ["--ray"])):
        argv = ["capacity", TRACE, *CHEAPEST, "--out", str(tmp_path / where), *flags]
        assert cli.main(argv) == 0
    for name in ("capacity.csv", "capacity.json"):
        serial = (tmp_path / "serial" / name).read_bytes()
        assert (tmp_path / "ray" / name).read_bytes() == serial, name
