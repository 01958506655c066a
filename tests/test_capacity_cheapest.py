"""``stepplan capacity --find cheapest``: the cheapest GPU x tensor parallelism x
replicas that meets the SLOs, checked against every candidate run by hand."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepplan.sim import cli
from stepplan.sim.cli.capacity_cmd import meets
from stepplan.sim.cli.options import checked
from stepplan.sim.cli.sweep_run import TraceReader
from stepplan.sim.results.table import read_csv
from stepplan.sim.run import simulate
from stepplan.sim.settings.config import SimConfig, with_settings
from stepplan.sim.sweep.cheapest import CHEAPEST, Candidate, cheapest, pareto_front
from stepplan.sim.sweep.records import metric
from stepplan.sim.sweep.spec import TraceEntry
from stepplan.sim.sweep.tradeoff import parse_slo

TRACE = "synthetic:n=60"
SLO = "ttft_p99_ms=150,tpot_p99_ms=20"
GRID = {"rate": 8.0, "gpus": ("H100", "A100", "L40S"), "tensor": (1, 2, 3), "most": 6}
#: The grid with disaggregation as a dimension (smaller: each candidate runs twice).
SPLIT_GRID = {"gpus": ("H100", "A100"), "tensor": (1, 2), "most": 4}


def _fewest_by_hand(
    gpu: str, tensor: int, most: int = GRID["most"]
) -> tuple[int, float, float] | None:
    """The fewest replicas (1 to GRID's most) meeting SLO, their $/h and goodput, each
    run here."""
    slo = parse_slo(SLO, ("ttft_p99_ms", "tpot_p99_ms"), ValueError)
    entry = TraceEntry(TRACE, None, "synthetic", "TRACE")
    for replicas in range(1, most + 1):
        settings = {"workload.rate_scale": GRID["rate"], "gpu.name": gpu}
        settings |= {"parallel.tensor": tensor, "deployment.replicas": replicas}
        config = checked(with_settings(SimConfig(), settings))
        summary = simulate(TraceReader().requests(entry, config), config).summary
        if meets(slo, summary):
            return replicas, summary["dollars"]["per_hour"], metric(summary, "goodput_req_s")
    return None


def _fewest_split_by_hand(gpu: str, tensor: int) -> tuple[int, float, float] | None:
    """:func:`_fewest_by_hand` of a prefill pool and a decode pool of ``n`` replicas each."""
    slo = parse_slo(SLO, ("ttft_p99_ms", "tpot_p99_ms"), ValueError)
    entry = TraceEntry(TRACE, None, "synthetic", "TRACE")
    for replicas in range(1, SPLIT_GRID["most"] + 1):
        settings = {"workload.rate_scale": GRID["rate"], "gpu.name": gpu}
        settings |= {"parallel.tensor": tensor, "deployment.replicas": replicas}
        settings |= {
            "disaggregation.prefill_replicas": replicas,
            "disaggregation.prefill_gpu": gpu,
            "disaggregation.prefill_tensor": tensor,
        }
        config = checked(with_settings(SimConfig(), settings))
        summary = simulate(TraceReader().requests(entry, config), config).summary
        if meets(slo, summary):
            return replicas, summary["dollars"]["per_hour"], metric(summary, "goodput_req_s")
    return None


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    out = tmp_path_factory.mktemp("cheapest") / "cap"
    argv = ["capacity", TRACE, "--find", "cheapest", "--slo", SLO, "--quiet"]
    argv += ["--rate-scale", str(GRID["rate"]), "--max-replicas", str(GRID["most"])]
    argv += ["--gpus", ",".join(GRID["gpus"]), "--tensor", ",".join(map(str, GRID["tensor"]))]
    argv += ["--workers", "1", "--out", str(out)]
    assert cli.main(argv) == 0
    assert (out / "capacity.png").stat().st_size > 10_000  # cost against goodput
    return read_csv(out / "capacity.csv", CHEAPEST), json.loads((out / "capacity.json").read_text())


def test_the_answer_is_the_cheapest_candidate_run_by_hand(searched):
    table, document = searched
    found = {}
    for gpu in GRID["gpus"]:
        for tensor in (1, 2):  # 3 does not divide the heads: refused, tested below
            found[gpu, tensor] = _fewest_by_hand(gpu, tensor)
    rows = {
        (str(g), int(t)): i
        for i, (g, t) in enumerate(zip(table["gpu"], table["tensor"], strict=True))
    }
    for pair, by_hand in found.items():
        row = rows[pair]
        assert table["met"][row] == (by_hand is not None)
        if by_hand is not None:
            assert table["replicas"][row] == by_hand[0]
            assert table["usd_per_hour"][row] == pytest.approx(by_hand[1])
            assert table["gpus"][row] == by_hand[0] * pair[1]
    met = {pair: v for pair, v in found.items() if v is not None}
    assert met, "the grid must hold a deployment that meets the SLO"
    best = min(met, key=lambda pair: (met[pair][1], met[pair][0] * pair[1], -met[pair][2]))
    answer = document["answer"]
    assert (answer["gpu"], answer["tensor"], answer["replicas"]) == (*best, met[best][0])
    assert table["cheapest"].sum() == 1 and table["cheapest"][rows[best]] == 1
    # More than one replica count answers somewhere, so the replica search did work.
    assert max(v[0] for v in met.values()) > 1


def test_with_disaggregation_the_answer_is_the_brute_force_cheapest(tmp_path, capsys):
    out = tmp_path / "cap"
    argv = ["capacity", TRACE, "--find", "cheapest", "--slo", SLO]
    argv += ["--rate-scale", str(GRID["rate"]), "--max-replicas", str(SPLIT_GRID["most"])]
    argv += ["--gpus", ",".join(SPLIT_GRID["gpus"]), "--disaggregation", "off,on"]
    argv += ["--tensor", ",".join(map(str, SPLIT_GRID["tensor"]))]
    assert cli.main([*argv, "--workers", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = read_csv(out / "capacity.csv", CHEAPEST)
    document = json.loads((out / "capacity.json").read_text())
    found = {}
    for gpu in SPLIT_GRID["gpus"]:
        for tensor in SPLIT_GRID["tensor"]:
            found[gpu, tensor, 0] = _fewest_by_hand(gpu, tensor, SPLIT_GRID["most"])
            found[gpu, tensor, 1] = _fewest_split_by_hand(gpu, tensor)
    rows = {
        (str(g), int(t), int(d)): i
        for i, (g, t, d) in enumerate(
            zip(table["gpu"], table["tensor"], table["disaggregated"], strict=True)
        )
    }
    assert set(rows) == set(found)
    for key, by_hand in found.items():
        row = rows[key]
        assert table["met"][row] == (by_hand is not None), key
        if by_hand is not None:
            assert table["replicas"][row] == by_hand[0], key
            assert table["usd_per_hour"][row] == pytest.approx(by_hand[1]), key
            assert table["gpus"][row] == by_hand[0] * key[1] * (2 if key[2] else 1)
    met = {key: v for key, v in found.items() if v is not None}
    assert any(key[2] for key in met), "a disaggregated deployment must meet the SLO"
    gpus = {key: met[key][0] * key[1] * (2 if key[2] else 1) for key in met}
    best = min(met, key=lambda key: (met[key][1], gpus[key], -met[key][2]))
    answer = document["answer"]
    assert (answer["gpu"], answer["tensor"], answer["disaggregated"]) == best
    assert answer["replicas"] == met[best][0]
    # the figures it priced and timed with are named
    assert document["kv_link"]["name"] == "infiniband-400"
    assert document["interconnect"]["H100"]["link"] == "NVLink 4"
    assert "KV link InfiniBand NDR 400 Gb/s" in printed and "H100 $3.348/GPU-h" in printed
    # the report: the front as a figure and a table, written by the search and by `report`
    page = (out / "report.html").read_text()
    assert "Pareto front" in page and page.count("data:image/png") == 1
    front = [key for key, row in rows.items() if table["pareto"][row]]
    assert front and all(f"<td>{gpu}</td>" in page for gpu, _, _ in front)
    again = tmp_path / "again.html"
    assert cli.main(["report", str(out), "--out", str(again)]) == 0
    assert again.read_text() == page


def test_tensor_parallelism_shortens_a_deployments_steps(searched):
    table, _ = searched
    tp = {
        (str(g), int(t)): float(p)
        for g, t, p in zip(table["gpu"], table["tensor"], table["tpot_p99_ms"], strict=True)
    }
    for gpu in GRID["gpus"]:
        assert tp[gpu, 2] < tp[gpu, 1]


def test_a_candidate_that_cannot_run_is_listed_with_its_reason(searched):
    _, document = searched
    refused = [r for r in document["candidates"] if r["refused"]]
    assert {(r["gpu"], r["tensor"]) for r in refused} == {(g, 3) for g in GRID["gpus"]}
    assert all("does not divide model.num_heads" in r["refused"] for r in refused)
    assert all(r["met"] == 0 and r["pareto"] == 0 for r in refused)


def test_weights_that_do_not_fit_are_refused_not_raised(tmp_path, capsys):
    out = tmp_path / "cap"
    argv = ["capacity", TRACE, "--find", "cheapest", "--gpus", "L40S", "--tensor", "1,4"]
    argv += ["--set", "memory.gpu_memory_utilization=0.2", "--workers", "1", "--out", str(out)]
    assert cli.main(argv) == 0
    rows = {r["tensor"]: r for r in json.loads((out / "capacity.json").read_text())["candidates"]}
    assert "leave no cache" in rows[1]["refused"] and not rows[4]["refused"]
    assert "refused: L40S tp 1: memory:" in capsys.readouterr().out


@given(st.lists(st.tuples(st.integers(1, 9), st.integers(0, 9)), min_size=1, max_size=12))
def test_the_front_is_every_point_no_other_beats(points):
    cost = np.array([float(c) for c, _ in points])
    goodput = np.array([float(g) for _, g in points])
    front = pareto_front(cost, goodput)
    for i in range(len(points)):
        beaten = any(
            cost[j] <= cost[i]
            and goodput[j] >= goodput[i]
            and (cost[j], goodput[j]) != (cost[i], goodput[i])
            for j in range(len(points))
        )
        assert front[i] == (not beaten)


def test_a_point_without_figures_is_off_the_front():
    front = pareto_front(np.array([1.0, math.nan]), np.array([1.0, 5.0]))
    assert front.tolist() == [True, False]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--gpus", "H100,X9"], "--gpus: "),
        (["--gpus", "H100,h100"], "--gpus: 'H100,h100' names a GPU twice"),
        (["--tensor", "0"], "--tensor: 0 must be 1 to 8"),
        (["--tensor", "two"], "--tensor: 'two' is not a whole number"),
        (["--disaggregation", "off,maybe"], "--disaggregation: 'maybe' is not one of off, on"),
        (
            [
                "--gpus",
                "H100,H200,A100,B200,L40S",
                "--tensor",
                "1,2,3,4,5,6,7,8",
                "--max-replicas",
                "10000000000000000",
            ],
            "narrow the grid",
        ),
    ],
)
def test_bad_flags_are_one_line(tmp_path, capsys, flags, said):
    """Each refused before any folder is made (the grid's bound counts its runs first)."""
    out = tmp_path / "cap"
    assert cli.main(["capacity", TRACE, "--find", "cheapest", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("stepplan: error: ") and said in err and "\n" not in err
    assert not out.exists()


def test_replicas_time_their_steps_at_the_tensor_parallel_size():
    """Behind a router each replica's step is one rank's share plus its all-reduces, as
    for one replica: TP 2 shortens the busiest replica's steps on a compute-bound GPU."""
    entry = TraceEntry(TRACE, None, "synthetic", "TRACE")
    busy = {}
    for tensor in (1, 2):
        settings = {"gpu.name": "A100", "parallel.tensor": tensor, "deployment.replicas": 2}
        config = checked(with_settings(SimConfig(), settings))
        result = simulate(TraceReader().requests(entry, config), config)
        busy[tensor] = float(np.sum(result.steps.column("duration_s")))
    assert busy[2] < busy[1]


def test_a_tie_in_cost_and_gpus_goes_to_more_goodput():
    two = Candidate("H100", 2, 2, 13.0, goodput_req_s=7.0)
    four = Candidate("H100", 4, 1, 13.0, goodput_req_s=8.0)
    more = Candidate("H200", 1, 5, 13.0, goodput_req_s=9.0)
    assert cheapest([two, four, more]) is four
    assert cheapest([Candidate("A100", 3, refused="no")]) is None


def test_the_grid_flags_need_the_cheapest_search(tmp_path, capsys):
    out = tmp_path / "cap"
    assert cli.main(["capacity", TRACE, "--gpus", "H100", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == "stepplan: error: --gpus: only with --find cheapest"
