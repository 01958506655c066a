"""The report's verdict: each SLO met or missed by how much, overload and from when,
formatted as the console formats figures."""

from __future__ import annotations

import numpy as np
import pytest

from stepplan.sim.cli.report_verdict import (
    differences,
    milliseconds,
    overload,
    side_labels,
    verdict_of,
)
from stepplan.sim.results.sim_result import SimResult
from stepplan.sim.results.table import Table


def steps_with_queue(start_s, waiting) -> SimResult:
    table = Table.from_columns(
        "steps.csv", {"start_s": np.asarray(start_s, float), "num_waiting": np.asarray(waiting)}
    )
    return SimResult(table, Table.from_columns("requests.csv", {}), np.zeros(0), {})


def summary(ttft_p99: float, tpot_p99: float, **extra) -> dict:
    return {
        "config": {"slo": {"ttft_ms": 1000.0, "tpot_ms": 50.0}},
        "latency_ms": {"ttft": {"p99": ttft_p99}, "tpot": {"p99": tpot_p99}},
        "goodput": {"share": 0.001, "requests_per_s": 0.0123},
        "requests": 8819, "finished_requests": 8800, "duration_s": 3836.0, **extra,
    }  # fmt: skip


def test_milliseconds_read_as_the_console_prints_them():
    assert milliseconds(162515.2) == "162,515 ms"
    assert milliseconds(26.94) == "26.9 ms"
    assert milliseconds(6.891) == "6.89 ms"
    assert milliseconds(None) == "-"


def test_a_queue_that_never_empties_for_most_of_the_run_is_overload_from_its_start():
    start = np.arange(100.0)
    waiting = np.where(start < 27, start % 2, 5 + start)  # empties now and then until 27 s
    assert overload(steps_with_queue(start, waiting)) == pytest.approx((27.0, 72 / 99, 104))
    assert overload(steps_with_queue(start, start % 2)) is None  # empties every other step
    assert overload(steps_with_queue(start, np.zeros(100))) is None


def test_the_verdict_says_each_slo_and_the_overload():
    start = np.arange(100.0)
    sample = steps_with_queue(start, np.where(start < 27, 0, 40))
    verdict = verdict_of(summary(162515.0, 31.2), sample)
    assert verdict.headline.startswith("Overloaded from 27 s of 3,836 s")
    assert verdict.headline.endswith("TTFT SLO missed")
    assert verdict.checks == (
        ("TTFT p99 <= 1,000 ms", "162,515 ms, over by 161,515 ms (162.51x)", False),
        ("TPOT p99 <= 50.0 ms", "31.2 ms, 18.8 ms under", True),
    )
    assert dict(verdict.figures)["goodput"] == "0.1% of requests within both SLOs (0.01 req/s)"
    assert dict(verdict.figures)["TTFT p99"] == "162,515 ms"
    assert not verdict.met
    calm = verdict_of(summary(500.0, 20.0), steps_with_queue(start, start % 2))
    assert calm.headline == "Both SLOs met at p99" and calm.met
    stopped = verdict_of(summary(500.0, 60.0, complete=False), steps_with_queue(start, start % 2))
    assert stopped.headline == "TPOT SLO missed (the run was stopped early: partial results)"


def test_a_compare_says_what_differs():
    a = {"cost": {"host_cost": "model"}, "seed": 0}
    b = {"cost": {"host_cost": "seed"}, "seed": 0}
    assert differences(a, b) == ["cost.host_cost: model -> seed"]
    assert differences(a, a) == []


def test_compare_columns_are_titled_by_what_differs():
    a = {"cost": {"host_cost": "model"}, "planner": {"graph_sizes": list(range(1, 40))}}
    b = {"cost": {"host_cost": "seed"}, "planner": {"graph_sizes": [1, 2]}}
    assert side_labels(a, b) == (
        "A: host_cost=model, graph_sizes=1,2,3,4,5,6,7,8,9,10,...",
        "B: host_cost=seed, graph_sizes=1,2",
    )
    assert side_labels(a, a) == ("A", "B")
    assert side_labels(a, b, most=1) == ("A: host_cost=model, ...", "B: host_cost=seed, ...")
