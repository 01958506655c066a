"""Prefill-decode disaggregation (``sim/deployment/disaggregated.py``): with the instant
link the prefill pool is a co-located deployment given every request with one output
token, and the decode pool a co-located engine given each request at its first token
with its prompt computed (the module's stated rule); the transfer is the request's KV
blocks and conv state; over random traces every request is prefilled once, transferred
once (when it has more than one token) and decoded to its exact output length."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from test_replicas import Chunks, drawn_engine_settings, random_table, same

from stepplan.sim import cli
from stepplan.sim.acceptance import make_acceptance
from stepplan.sim.deployment import ROUTER_NAMES
from stepplan.sim.deployment.disaggregated import run_disaggregated, transfer_bytes
from stepplan.sim.deployment.replica import Replica
from stepplan.sim.memory_sizing import plan_memory
from stepplan.sim.results.summary import summary_rows
from stepplan.sim.run import simulate
from stepplan.sim.settings.config import ConfigError, SimConfig, check_config, with_settings
from stepplan.sim.settings.links import KV_LINK_NAMES, KV_LINKS
from stepplan.sim.stepper import load_stepper
from stepplan.sim.timing.cost import CostModel
from stepplan.sim.traces import RequestTable

TRACE = "synthetic:n=160,rate=30,cv2=2,prompt=uniform:16:3000,output=uniform:1:120"


def trace_and_config(**settings_) -> tuple[RequestTable, SimConfig]:
    args = cli.build_parser().parse_args(["simulate", TRACE])
    base = cli.with_settings(cli.build_config(args), {"cost.host_cost": "model", "seed": 3})
    return cli.load_requests(args, base), with_settings(base, settings_)


def split(table: RequestTable, config: SimConfig, native: bool | None = None):
    store = Chunks()
    end = run_disaggregated(table, config, store, native=native)
    return end, store.columns()


@pytest.mark.parametrize("prefill", [1, 2])
def test_prefill_pool_is_the_colocated_run_of_one_token_requests(prefill):
    table, base = trace_and_config(**{"scheduler.num_spec_tokens": 2})
    config = with_settings(
        base,
        {
            "disaggregation.prefill_replicas": prefill,
            "disaggregation.link": "instant",
            "deployment.replicas": 2,
        },
    )
    end, steps = split(table, config)
    ones = RequestTable(
        table.arrival_s,
        table.prompt_tokens,
        np.ones(table.num_requests, np.int64),
        table.prefix_offsets,
        table.prefix_blocks,
    )
    alone = simulate(ones, with_settings(base, {"deployment.replicas": prefill}))
    mine = steps["pool"] == "prefill"
    for name, values in alone.steps.items():
        if name not in ("plan_us", "replica"):
            assert same(steps[name][mine], values), name
    requests = end.request_columns()
    assert same(requests["first_token_s"], alone.requests["first_token_s"])
    if prefill > 1:
        assert same(requests["prefill_replica"], alone.requests["replica"])


def test_decode_pool_is_a_colocated_engine_given_prefilled_requests():
    """The stated rule: at its first token (instant link) a request joins a decode
    engine with its prompt computed; one decode replica then runs the steps of one
    engine given all those requests at those times."""
    table, base = trace_and_config(**{"scheduler.num_spec_tokens": 2})
    config = with_settings(
        base,
        {"disaggregation.prefill_replicas": 2, "disaggregation.link": "instant"},
    )
    end, steps = split(table, config)
    requests = end.request_columns()
    more = np.flatnonzero(table.output_tokens > 1)
    first = requests["first_token_s"][more]
    order = more[np.argsort(first, kind="stable")]
    assert (requests["transfer_s"][more] == 0).all()
    # the reference engine: every prefilled request, at its first token, prompt computed
    rest = RequestTable(
        np.sort(first, kind="stable"),
        table.prompt_tokens[order] + 1,
        table.output_tokens[order] - 1,
    )
    chunks = []
    layout = plan_memory(config, rest)
    cost = CostModel.create(config.model, config.gpu, config.cost, 1, 1)
    acceptance = make_acceptance(config.acceptance, config.seed + 2)  # replica number 2
    sink = lambda index, chunk: chunks.append({k: np.array(v) for k, v in chunk.items()})  # noqa: E731
    engine = Replica(
        0, rest, layout, config, config.plan, cost, acceptance, sink, native=False, preloads=True
    )
    for row in range(rest.num_requests):
        engine.route(row)
        engine.scheduler.preloaded[row] = table.prompt_tokens[order[row]]
    now = 0.0
    while not engine.scheduler.done:
        end_s = engine.start(now)
        if end_s is None:
            now = engine.scheduler.next_arrival_s()
            continue
        engine.commit()
        now = end_s
    engine.flush()
    reference = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
    mine = steps["pool"] == "decode"
    for name, values in reference.items():
        if name != "plan_us":
            assert same(steps[name][mine], values), name
    finish = np.full(table.num_requests, np.nan)
    finish[order] = engine.log.finish_s[: rest.num_requests]
    assert same(requests["finish_s"][more], finish[more])


def test_transfer_bytes_are_the_kv_blocks_and_the_conv_state():
    _, config = trace_and_config()
    model = config.model.resolved()
    prompt = np.array([1, 15, 16, 17, 1000, 4096], np.int64)
    blocks = np.array([1, 1, 1, 2, 63, 256])  # ceil(prompt / 16)
    conv = model.conv_layers * model.conv_channels * (model.conv_kernel_size - 1)
    conv *= model.conv_dilation * model.dtype_bytes
    expected = blocks * 16 * model.kv_bytes_per_token + conv
    assert conv > 0 and np.array_equal(transfer_bytes(config, prompt), expected)
    link = KV_LINKS["infiniband-400"]
    assert link.transfer_s(50e9) == pytest.approx(1 + 9.6e-6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_request_is_prefilled_transferred_and_decoded_once(data):
    table = random_table(data.draw)
    prefill = data.draw(st.integers(1, 3), label="prefill")
    decode = data.draw(st.integers(1, 3), label="decode")
    settings_ = {
        "disaggregation.prefill_replicas": prefill,
        "disaggregation.link": data.draw(st.sampled_from(KV_LINK_NAMES), label="link"),
        "deployment.replicas": decode,
        "deployment.router": data.draw(st.sampled_from(ROUTER_NAMES), label="router"),
        **drawn_engine_settings(data),
    }
    try:
        config = with_settings(SimConfig(), settings_)
        end, steps = split(table, config)
    except ConfigError:  # the cache can't hold the longest request
        reject()
    requests = end.request_columns()
    output = table.output_tokens
    more = output > 1
    assert ((requests["prefill_replica"] >= 0) & (requests["prefill_replica"] < prefill)).all()
    on_decode = (requests["replica"] >= prefill) & (requests["replica"] < prefill + decode)
    assert np.array_equal(on_decode, more)
    assert np.array_equal(~np.isnan(requests["transfer_s"]), more)
    assert np.array_equal(end.decoded, np.where(more, output - 1, 0))
    assert not np.isnan(requests["finish_s"]).any()
    assert (requests["finish_s"] >= requests["first_token_s"]).all()
    pools = end.summary["disaggregation"]["pools"]
    assert pools["prefill"]["requests"] == table.num_requests
    assert pools["decode"]["requests"] == int(more.sum())
    for replica in range(prefill + decode):
        mine = steps["replica"] == replica
        assert (steps["pool"][mine] == ("prefill" if replica < prefill else "decode")).all()
        starts, ends = steps["start_s"][mine], steps["start_s"][mine] + steps["duration_s"][mine]
        assert (starts[1:] >= ends[:-1]).all(), "a replica ran two steps at once"


def test_settings_refuse_bad_pools_in_one_line():
    base = SimConfig()
    for settings_, words in (
        ({"disaggregation.prefill_replicas": -1}, "prefill_replicas: must be 0"),
        ({"disaggregation.prefill_gpu": "T4"}, "unknown GPU 'T4'"),
        ({"disaggregation.link": "carrier-pigeon"}, "link: must be one of"),
        ({"disaggregation.prefill_tensor": 16}, "prefill_tensor: must be 1 to 8"),
    ):
        with pytest.raises(ConfigError, match=words):
            with_settings(base, settings_)
    config = with_settings(base, {"disaggregation.prefill_replicas": 1, "live.enabled": True})
    with pytest.raises(ConfigError, match=r"live\.enabled: .*prefill_replicas = 0"):
        check_config(config)


def test_results_folder_names_the_pools_and_the_figures(tmp_path):
    out = tmp_path / "split"
    argv = [
        "simulate",
        TRACE,
        "--set",
        "disaggregation.prefill_replicas=1",
        "--set",
        "disaggregation.prefill_gpu=H100",
        "--set",
        "disaggregation.link=ethernet-100",
        "--replicas",
        "2",
    ]
    assert cli.main([*argv, "--out", str(out), "--quiet", "--report"]) == 0
    page = (out / "report.html").read_text()
    assert "<th>pool</th>" in page and page.count("<td>decode</td>") == 2
    with (out / "steps.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert {row["pool"] for row in rows} == {"prefill", "decode"}
    assert {row["replica"] for row in rows if row["pool"] == "prefill"} == {"0"}
    with (out / "requests.csv").open() as file:
        header = next(csv.reader(file))
    assert {"prefill_replica", "replica", "transfer_bytes", "transfer_s"} <= set(header)
    summary = json.loads((out / "summary.json").read_text())
    section = summary["disaggregation"]
    assert section["link"]["bw_bytes_s"] == 12.5e9
    assert section["pools"]["prefill"]["gpu"] == "H100"
    assert section["pools"]["prefill"]["price_per_gpu_hour"] == 3.348
    per_hour = 3.348 * 1 + 4.464 * 2
    assert math.isclose(summary["dollars"]["per_hour"], per_hour)
    rows = dict(summary_rows(summary))
    assert rows["prefill pool"].startswith("1 x H100 tp 1, $3.348/GPU-h")
    assert rows["decode pool"].startswith("2 x H200 tp 1, $4.464/GPU-h")
    assert rows["KV link"] == "Ethernet 100 Gb/s (12.5 GB/s), 9.6 us latency"


@pytest.mark.skipif(load_stepper() is None, reason="the compiled stepper is not built")
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_compiled_stepper_takes_computed_prompts_as_python_does(data):
    table = random_table(data.draw)
    settings_ = {
        "disaggregation.prefill_replicas": data.draw(st.integers(1, 2), label="prefill"),
        "deployment.replicas": data.draw(st.integers(1, 3), label="decode"),
        "memory.kv_cache_gib": data.draw(st.sampled_from([0.15, 0.4, 8.0]), label="cache"),
        "memory.prefix_caching": data.draw(st.booleans(), label="caching"),
        "scheduler.max_num_seqs": data.draw(st.sampled_from([2, 8, 64]), label="seqs"),
        "scheduler.max_num_batched_tokens": 1024,
        "scheduler.num_spec_tokens": data.draw(st.integers(0, 3), label="spec"),
    }
    try:
        config = with_settings(SimConfig(), settings_)
        python, python_steps = split(table, config, native=False)
    except ConfigError:
        reject()
    compiled, compiled_steps = split(table, config, native=True)
    for name, values in python_steps.items():
        if name != "plan_us":
            assert same(compiled_steps[name], values), name
    a, b = python.request_columns(), compiled.request_columns()
    assert not [name for name in a if not same(a[name], b[name])]


def test_the_replica_search_grows_both_pools_together(tmp_path):
    out = tmp_path / "cap"
    argv = ["capacity", TRACE, "--find", "replicas", "--prefill-replicas", "1"]
    argv += ["--rate-scale", "40", "--slo", "ttft_p99_ms=100,tpot_p99_ms=20"]
    assert (
        cli.main([*argv, "--max-replicas", "4", "--workers", "1", "--out", str(out), "--quiet"])
        == 0
    )
    counts = []
    for path in (out / "points").glob("*.json"):
        summary = json.loads(path.read_text())["summary"]
        pools = summary["disaggregation"]["pools"]
        counts.append((pools["prefill"]["replicas"], pools["decode"]["replicas"]))
    assert len(counts) > 1 and all(prefill == decode for prefill, decode in counts)
