"""The vLLM path finishes its steps on Python lists (``Stepper._finish_listed``); the
array finish (``Stepper._finish_python``, the specification) must give the same run."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from stepplan.sim.run import simulate
from stepplan.sim.settings.config import SimConfig, with_settings
from stepplan.sim.stepper import Stepper
from stepplan.sim.workloads import parse_synthetic

requires_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"
)
WORKLOAD = "synthetic:n=80,rate=30,cv2=3,prompt=zipf:1.1:2500,output=uniform:50:300"


@requires_vllm
@pytest.mark.parametrize(
    "settings",
    [
        {},  # speculation, the hybrid model
        {"acceptance.model": "fixed", "acceptance.length": 2.5},
        {  # preemption under a small cache, attention only, no speculation
            "model.conv_layers": 0,
            "scheduler.num_spec_tokens": 0,
            "memory.kv_cache_gib": 0.25,
            "scheduler.max_num_seqs": 16,
            "scheduler.max_num_batched_tokens": 1024,
        },
    ],
)
def test_the_list_finish_runs_as_the_array_finish(monkeypatch, settings):
    config = with_settings(SimConfig(), {"scheduler.implementation": "vllm", **settings})
    table = parse_synthetic(WORKLOAD, seed=3)
    listed = simulate(table, config)
    monkeypatch.setattr(Stepper, "_finish_listed", Stepper._finish_python)
    arrays = simulate(table, config)
    assert listed.steps.columns.keys() == arrays.steps.columns.keys()
    for name in listed.steps.columns:
        if name != "plan_us":  # measured
            np.testing.assert_array_equal(listed.steps[name], arrays.steps[name], name)
    for name, column in listed.requests.items():
        np.testing.assert_array_equal(column, arrays.requests[name], name)
    np.testing.assert_array_equal(listed.itl_s, arrays.itl_s)
    if "memory.kv_cache_gib" in settings:  # the case preempts
        assert np.asarray(listed.requests["num_preemptions"]).sum() > 0
