"""Fidelity scoring: step kinds, per-kind errors with cold and uncovered steps apart."""

from __future__ import annotations

import numpy as np
import pytest

from stepplan.sim.timing.engine_fit import ProfilePoint, StepShape
from stepplan.sim.timing.engine_profile import EngineProfile
from stepplan.sim.timing.fidelity import StepRecord, end_to_end, step_errors, step_kind

KEY = ("spec", 16, 4, 0)


def shape(rows, tokens, graph=None, context=100):
    return StepShape(graph, rows, tokens, 0, context, 0.0)


def test_kinds():
    assert step_kind(shape((4, 0, 0), (16, 0, 0))) == "spec"
    assert step_kind(shape((0, 3, 0), (0, 3, 0))) == "decode"
    assert step_kind(shape((0, 0, 1), (0, 0, 9))) == "prefill"
    assert step_kind(shape((2, 0, 1), (8, 0, 9))) == "mixed"


def test_errors_by_kind_leave_cold_and_uncovered_apart():
    points = [ProfilePoint(shape((4, 0, 0), (16, 0, 0), KEY, c), 1000.0 + c) for c in (0, 50, 500)]
    fit = EngineProfile("t", "cpu", {}, {}, {}, {}, (2, 4), tuple(points)).fit
    records = [
        StepRecord(shape((4, 0, 0), (16, 0, 0), KEY, 100), 1100.0 * 1.1),  # 10% over
        StepRecord(shape((4, 0, 0), (16, 0, 0), KEY, 100), 1100.0, cold=True),
        StepRecord(shape((0, 0, 1), (0, 0, 9)), 500.0),  # eager: not in this profile
    ]
    errors = step_errors(records, fit)
    assert errors.cold == 1 and errors.uncovered == 1
    table = errors.by_kind()
    assert table["spec"]["n"] == 1
    assert table["spec"]["mape"] == pytest.approx(0.1 / 1.1)
    assert table["spec"]["bias"] == pytest.approx(-0.1 / 1.1)


def test_end_to_end():
    live = {
        "latency_ms": {"ttft": {"p50": 100.0, "p99": 200.0}, "tpot": {"p50": 10.0, "p99": None}},
        "throughput": {"output_tokens_per_s": 50.0, "requests_per_s": 2.0},
    }
    sim = {
        "latency_ms": {"ttft": {"p50": 110.0, "p99": 190.0}, "tpot": {"p50": 10.0, "p99": 12.0}},
        "throughput": {"output_tokens_per_s": 55.0, "requests_per_s": 2.0},
    }
    table = end_to_end(live, sim)
    assert table["ttft_p50_ms"]["error"] == pytest.approx(0.1)
    assert table["ttft_p99_ms"]["error"] == pytest.approx(-0.05)
    assert table["tpot_p99_ms"]["error"] is None
    assert np.isclose(table["output_tokens_per_s"]["error"], 0.1)
