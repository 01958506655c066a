"""A deployment of replicas (``sim/deployment/``): one replica is today's single engine
byte for byte, round-robin replicas are the single engine on the trace split by hand,
and over random traces and routers every request is served once and finishes while
every replica's blocks and slots stay accounted for."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from golden_sim import MOONCAKE, PINNED, RUNS
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from stepplan.sim import cli
from stepplan.sim.deployment import ROUTER_NAMES
from stepplan.sim.deployment.loop import run_deployment
from stepplan.sim.run import simulate
from stepplan.sim.settings.config import ConfigError, SimConfig, with_settings
from stepplan.sim.stepper import load_stepper
from stepplan.sim.traces import RequestTable

COMPILED = load_stepper() is not None
PATHS = [pytest.param(False, id="python"), pytest.param(True, id="compiled")]
#: Golden runs small enough to step twice in Python here (the others are covered by
#: ``bench``'s check in ``bench/RESULTS.md``).
SMALL_RUNS = ("synthetic-eager-public-fixed", "mooncake-bound-caching", "mooncake-caching-q2")


class Chunks:
    """A step store that keeps every chunk (a copy), as a run hands them on."""

    def __init__(self) -> None:
        self.chunks: list[dict[str, np.ndarray]] = []

    def start(self, rows: object) -> None:
        pass

    def add_steps(self, steps) -> None:
        self.chunks.append({name: np.array(values) for name, values in steps.items()})

    def add_requests(self, rows: object) -> None:
        pass

    def columns(self) -> dict[str, np.ndarray]:
        return {name: np.concatenate([c[name] for c in self.chunks]) for name in self.chunks[0]}


def same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def golden_run(name: str) -> tuple[RequestTable, SimConfig]:
    trace, settings_ = next((t, s) for n, t, s in RUNS if n == name)
    args = cli.build_parser().parse_args(["simulate", *([trace] if trace else [])])
    config = cli.with_settings(cli.build_config(args), {**PINNED, **settings_})
    return cli.load_requests(args, config), config


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("name", SMALL_RUNS)
def test_one_replica_is_the_single_engine_byte_for_byte(name, native):
    if native and not COMPILED:
        pytest.skip("the compiled stepper is not built")
    table, config = golden_run(name)
    alone = simulate(table, config, native=native)
    store = Chunks()
    deployed = run_deployment(table, config, store, native=native)
    steps = store.columns()
    assert (steps.pop("replica") == 0).all()
    assert steps.keys() == alone.steps.keys()
    changed = [c for c in steps if c != "plan_us" and not same(steps[c], alone.steps[c])]
    assert not changed, changed
    requests = deployed.request_columns()
    assert (requests.pop("replica") == 0).all()
    assert requests.keys() == alone.requests.keys()
    assert not [c for c in requests if not same(requests[c], alone.requests[c])]
    for section in ("latency_ms", "itl_ms_quantiles", "steps", "acceptance", "time_s"):
        assert deployed.summary[section] == alone.summary[section], section
    assert deployed.summary["memory"] == alone.summary["memory"]


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize(
    ("trace", "settings_"),
    [
        ("synthetic:n=240,rate=40,cv2=2,prompt=uniform:16:3000,output=uniform:1:200", {}),
        (MOONCAKE, {"memory.kv_cache_gib": 5}),
    ],
    ids=["synthetic", "mooncake-caching"],
)
@pytest.mark.parametrize("replicas", [2, 3])
def test_round_robin_is_single_engines_on_the_trace_split_by_hand(
    trace, settings_, replicas, native
):
    if native and not COMPILED:
        pytest.skip("the compiled stepper is not built")
    args = cli.build_parser().parse_args(["simulate", trace])
    settings_ = {**settings_, "cost.host_cost": "model", "seed": 5}
    base = cli.with_settings(cli.build_config(args), settings_)
    table = cli.load_requests(args, base)
    config = with_settings(base, {"deployment.replicas": replicas})
    store = Chunks()
    deployed = run_deployment(table, config, store, native=native)
    steps, requests = store.columns(), deployed.request_columns()
    for replica in range(replicas):
        rows = np.arange(replica, table.num_requests, replicas)
        # each replica draws acceptance with the run's seed plus its index
        alone = simulate(
            table.take(rows), with_settings(base, {"seed": 5 + replica}), native=native
        )
        mine = steps["replica"] == replica
        for name, values in alone.steps.items():
            if name != "plan_us":
                assert same(steps[name][mine], values), (replica, name)
        assert (requests["replica"][rows] == replica).all()
        for name, values in alone.requests.items():
            if name != "request_id":
                assert same(requests[name][rows], values), (replica, name)


def random_table(draw) -> RequestTable:
    """A small trace: arrivals in bursts, prompts long enough to hash, shared prefixes."""
    n = draw(st.integers(1, 24))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.001, 0.02, 0.3]), min_size=n, max_size=n))
    prompt = draw(st.lists(st.integers(1, 2600), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    offsets, blocks = [0], []
    for tokens in prompt:
        family = draw(st.integers(0, 2))  # requests of a family share their leading blocks
        count = draw(st.integers(0, tokens // 512 + 1))
        blocks += [family * 100 + i for i in range(count)]
        offsets.append(len(blocks))
    return RequestTable(
        np.cumsum(gaps),
        prompt,
        output,
        prefix_offsets=np.array(offsets, np.int64),
        prefix_blocks=np.array(blocks, np.int64),
        source="hypothesis",
        format="synthetic",
    )


def drawn_engine_settings(data) -> dict:
    """Each engine's settings for a deployment property: memory checked at every step of
    every replica, a cache from tight to ample, speculation on or off."""
    return {
        "memory.check": True,
        "memory.kv_cache_gib": data.draw(st.sampled_from([0.15, 0.4, 8.0]), label="cache"),
        "scheduler.max_num_seqs": data.draw(st.sampled_from([2, 8, 64]), label="seqs"),
        "scheduler.max_num_batched_tokens": 1024,
        "scheduler.num_spec_tokens": data.draw(st.integers(0, 3), label="spec"),
        "seed": data.draw(st.integers(0, 3), label="seed"),
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_request_is_served_once_and_the_accounting_holds(data):
    table = random_table(data.draw)
    replicas = data.draw(st.integers(1, 4), label="replicas")
    router = data.draw(st.sampled_from(ROUTER_NAMES), label="router")
    native = COMPILED and data.draw(st.booleans(), label="native")
    settings_ = {
        "deployment.replicas": replicas,
        "deployment.router": router,
        **drawn_engine_settings(data),
    }
    try:
        config = with_settings(SimConfig(), settings_)
        store = Chunks()
        end = run_deployment(table, config, store, native=native)
    except ConfigError:  # the cache can't hold the longest request
        reject()
    requests = end.request_columns()
    assert ((requests["replica"] >= 0) & (requests["replica"] < replicas)).all()
    assert not np.isnan(requests["finish_s"]).any(), "a request never finished"
    steps = store.columns()
    per_replica = end.summary["deployment"]["per_replica"]
    assert sum(entry["requests"] for entry in per_replica) == table.num_requests
    for entry in per_replica:
        mine = steps["replica"] == entry["replica"]
        assert entry["requests"] == int((requests["replica"] == entry["replica"]).sum())
        assert entry["steps"] == int(mine.sum())
        assert (np.diff(steps["step"][mine]) == 1).all()
        starts, ends = steps["start_s"][mine], steps["start_s"][mine] + steps["duration_s"][mine]
        assert (starts[1:] >= ends[:-1]).all(), "a replica ran two steps at once"
    # every token a request asked for was emitted on the replica that served it
    assert (requests["num_steps"] > 0).all()


def test_results_folder_has_the_replica_column_only_for_a_deployment(tmp_path):
    trace = "synthetic:n=60,rate=30,cv2=1,prompt=uniform:16:800,output=uniform:1:40"
    for replicas in (1, 3):
        out = tmp_path / f"r{replicas}"
        argv = ["simulate", trace, "--replicas", str(replicas), "--router", "least-wait"]
        assert cli.main([*argv, "--out", str(out), "--quiet"]) == 0
        for name in ("steps.csv", "requests.csv", "measured_steps.csv"):
            with (out / name).open() as file:
                header = next(csv.reader(file))
            assert ("replica" in header) == (replicas > 1), (name, header)
        with (out / "requests.csv").open() as file:
            rows = list(csv.DictReader(file))
        assert len(rows) == 60
        if replicas > 1:
            assert {row["replica"] for row in rows} == {"0", "1", "2"}
        # The deployment's price counts every replica's GPUs.
        dollars = json.loads((out / "summary.json").read_text())["dollars"]
        assert dollars["gpus"] == replicas
        assert dollars["per_hour"] == pytest.approx(replicas * dollars["price_per_gpu_hour"])


def test_a_sweep_takes_replicas_and_router_as_dimensions(tmp_path):
    sweep = tmp_path / "s.toml"
    sweep.write_text(
        'traces = ["synthetic:n=80,rate=60,cv2=1,prompt=uniform:16:800,output=uniform:1:40"]\n'
        "[grid]\n"
        '"deployment.replicas" = [1, 3]\n'
        '"deployment.router" = ["round-robin", "least-outstanding"]\n'
    )
    out = tmp_path / "out"
    assert cli.main(["sweep", str(sweep), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    with (out / "sweep.csv").open() as file:
        rows = list(csv.DictReader(file))
    points = {(row["deployment.replicas"], row["deployment.router"]) for row in rows}
    assert points == {(r, n) for r in ("1", "3") for n in ("round-robin", "least-outstanding")}
    one = [float(r["ttft_mean_ms"]) for r in rows if r["deployment.replicas"] == "1"]
    assert len(set(one)) == 1, "one replica: the router does not matter"
    three = [float(r["ttft_mean_ms"]) for r in rows if r["deployment.replicas"] == "3"]
    assert max(three) < one[0], (one, three)


@settings(max_examples=200, deadline=None)
@given(threshold=st.integers(1, 80), most=st.integers(1, 64), per_round=st.integers(1, 5))
def test_replica_search_finds_the_fewest_that_meet(threshold, most, per_round):
    from stepplan.sim.sweep.replica_search import replica_search

    asked: list[int] = []

    def evaluate(counts, round_):
        asked.extend(counts)
        assert len(counts) <= per_round and all(1 <= c <= most for c in counts)
        return [c >= threshold for c in counts]

    result = replica_search(evaluate, most, per_round)
    assert len(asked) == len(set(asked)), "a count ran twice"
    if threshold <= most:
        assert (result.status, result.answer) == ("found", threshold)
    else:
        assert (result.status, result.answer) == ("above-most", None)
    assert not result.notes


def test_capacity_finds_the_fewest_replicas(tmp_path, capsys):
    trace = "synthetic:n=300,rate=40,cv2=1,prompt=uniform:16:2000,output=uniform:1:100"
    out = tmp_path / "cap"
    argv = ["capacity", trace, "--find", "replicas", "--router", "least-outstanding"]
    argv += ["--slo", "ttft_p99_ms=60", "--workers", "1", "--per-round", "2", "--out", str(out)]
    assert cli.main(argv) == 0
    document = json.loads((out / "capacity.json").read_text())
    assert document["status"] == "found" and document["router"] == "least-outstanding"
    answer = document["answer"]
    curve = {point["replicas"]: point for point in document["curve"]}
    assert curve[answer]["met"] and curve[answer]["ttft_p99_ms"] <= 60
    assert answer - 1 in curve and not curve[answer - 1]["met"]
    assert f"capacity: {answer} replicas behind least-outstanding" in capsys.readouterr().out


def test_the_report_of_a_deployment_has_its_replicas(tmp_path):
    from pathlib import Path

    from stepplan.sim.cli.report_reading import TIME_BINS, read_report_run

    trace = "synthetic:n=90,rate=30,cv2=1,prompt=uniform:16:800,output=uniform:1:40"
    out = tmp_path / "run"
    argv = ["simulate", trace, "--replicas", "3", "--router", "least-kv", "--out", str(out)]
    assert cli.main([*argv, "--quiet", "--report"]) == 0
    page = (out / "report.html").read_text()
    assert "3 replicas behind least-kv: load balance" in page
    assert "Replicas: queue and KV cache over time" in page
    series = read_report_run(Path(out)).replicas
    assert series is not None and series.num_rows == 3 * TIME_BINS
    summary = json.loads((out / "summary.json").read_text())["deployment"]
    for entry in summary["per_replica"]:
        mine = series.column("replica") == entry["replica"]
        assert np.nanmax(series.column("kv_usage")[mine]) <= entry["peak_kv_usage"] + 1e-12
