"""A stalled run's error names the request first in line and why an empty engine does not
admit it (``sim/stall.py``); on vLLM's scheduler, the request vLLM holds and what holds
it (``sim/scheduler/vllm_limits.py``). Settings that pass ``check_config`` never stall,
so these schedulers are built around it: a pool smaller than a prompt, a budget below a
padded row, a request longer than ``model.max_model_len`` let past its up-front refusal.
"""

from __future__ import annotations

import importlib.util
import math

import attrs
import numpy as np
import pytest
from test_memory import make_layout, make_table

from stepplan.sim.memory import BlockPool
from stepplan.sim.memory_sizing import plan_memory
from stepplan.sim.run import simulate
from stepplan.sim.scheduler import Scheduler, vllm_engine_scheduler
from stepplan.sim.scheduler.vllm_limits import check_model_len
from stepplan.sim.settings.config import SchedulerConfig, SimConfig, with_settings
from stepplan.sim.settings.config_values import ConfigError
from stepplan.sim.stall import StallError, stall_error
from stepplan.sim.traces import RequestTable, TraceError
from stepplan.sim.workloads import parse_synthetic

requires_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"
)


def test_a_prompt_larger_than_the_cache_is_named_with_its_blocks():
    table = make_table([0.0, 0.5], [4, 9], [3, 2])
    config = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=100, num_spec_tokens=0)
    scheduler = Scheduler(table, config, BlockPool(make_layout(6, block_size=1, slots=2), table))
    clock = 0.0
    while (found := scheduler.schedule(clock)) is not None or clock < 0.5:
        if found is not None:
            scheduler.commit(found, np.zeros(found.batch.num_rows, np.int32))
        clock += 0.25
    assert scheduler.running.size == 0 and not scheduler.done
    error = stall_error(scheduler, clock)
    assert isinstance(error, ConfigError)  # the command line prints it as one line, exit 2
    assert str(error) == (
        "run stalled at 0.75 s: request 1 (prompt 9 + output 2 tokens) cannot be admitted "
        "while nothing runs: its prompt needs 9 KV blocks and the cache has 6 free of 6 "
        "(memory.kv_cache_gib)"
    )


def test_a_budget_below_a_padded_row_is_named():
    table = make_table([0.0], [1], [4])
    config = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=2, num_spec_tokens=3)
    scheduler = Scheduler(table, config)
    error = stall_error(scheduler, math.inf)
    assert isinstance(error, StallError) and "\n" not in str(error)
    assert str(error) == (
        "run stalled: request 0 (prompt 1 + output 4 tokens) cannot be admitted while "
        "nothing runs: scheduler.max_num_batched_tokens = 2 is less than the 4 tokens a "
        "padded row takes (scheduler.num_spec_tokens + 1)"
    )


#: Request 0 is longer than ``model.max_model_len`` = 150 (171 + 10 tokens); 1 and 2 fit.
LONG_FIRST = RequestTable(
    arrival_s=[0.0, 0.04, 0.07],
    prompt_tokens=[171, 110, 116],
    output_tokens=[10, 5, 7],
    source="long.csv",
    lines=[2, 3, 4],
)
#: vLLM's scheduler over an attention-only model whose context is 150 tokens.
ON_VLLM = {
    "scheduler.implementation": "vllm",
    "model.max_model_len": 150,
    "model.conv_layers": 0,
}


def _vllm_config(**settings) -> SimConfig:
    return with_settings(SimConfig(), {**ON_VLLM, **settings})


def test_the_model_len_rule_is_the_one_the_command_line_drops_by():
    table = RequestTable(
        arrival_s=[0.0, 0.0, 0.0], prompt_tokens=[140, 141, 150], output_tokens=[10, 10, 1]
    )
    assert table.beyond_model_len(150).tolist() == [1, 2]
    assert table.within_model_len(150).prompt_tokens.tolist() == [140]
    check_model_len(table, 151)  # prompt + output = 151 fits exactly
    with pytest.raises(TraceError) as refused:
        check_model_len(table, 150)
    assert str(refused.value) == (
        ": request 1 has prompt 141 + output 10 tokens, more than model.max_model_len = 150 "
        "(1 more request too), which vLLM's scheduler never finishes: drop such requests as "
        "the command line does (stepplan.sim.run.prepare_requests) or raise "
        "model.max_model_len"
    )


@requires_vllm
def test_simulate_on_vllm_refuses_a_request_longer_than_the_model_up_front():
    with pytest.raises(TraceError) as refused:
        simulate(LONG_FIRST, _vllm_config())
    assert str(refused.value) == (
        "long.csv:2: has prompt 171 + output 10 tokens, more than model.max_model_len = 150, "
        "which vLLM's scheduler never finishes: drop such requests as the command line does "
        "(stepplan.sim.run.prepare_requests) or raise model.max_model_len"
    )


@requires_vllm
def test_a_hybrid_model_of_fractional_kv_values_is_refused_on_vllm_up_front():
    # 65,537 bytes a token over 16 attention layers of 2-byte values: vLLM's whole-head
    # pages would hold more blocks than stepplan's layout
    settings = {"scheduler.implementation": "vllm", "model.kv_bytes_per_token": 65537}
    config = with_settings(SimConfig(), settings)
    with pytest.raises(ConfigError) as refused:
        simulate(parse_synthetic("synthetic:n=3,rate=1,prompt=fixed:8,output=fixed:2"), config)
    assert str(refused.value) == (
        "model.kv_bytes_per_token = 65537 is not whole K and V values of 2-byte elements in "
        "each of the 16 attention layers (a multiple of 64), as vLLM's pages of a hybrid "
        "model are sized: give the model's real figure to --scheduler vllm"
    )


@requires_vllm
@pytest.mark.parametrize(
    ("budget", "held"),
    [
        # the whole prompt in one step: vLLM caps the request at its first token
        (
            8192,
            "was ended by vLLM's scheduler (FINISHED_LENGTH_CAPPED) after 1 of its 10 output "
            "tokens",
        ),
        # chunked: vLLM computes up to the context's last position, then schedules none
        (
            100,
            "is held running by vLLM's scheduler, which schedules none of its tokens past the "
            "149 computed",
        ),
    ],
)
def test_a_request_vllm_caps_at_the_model_len_is_named_with_it(monkeypatch, budget, held):
    # past the up-front refusal, as a state it would miss would be
    monkeypatch.setattr(vllm_engine_scheduler, "check_model_len", lambda *_: None)
    config = _vllm_config(
        **{"scheduler.max_num_batched_tokens": budget, "scheduler.max_num_seqs": 8}
    )
    with pytest.raises(StallError) as stalled:
        simulate(LONG_FIRST, config)
    message = str(stalled.value)
    assert "\n" not in message and "cannot be admitted" not in message
    assert message.startswith("run stalled at ")
    assert message.split(" s: ", 1)[1] == (
        f"request 0 (prompt 171 + output 10 tokens) {held}: prompt + output exceed "
        "model.max_model_len = 150 tokens"
    )


@requires_vllm
@pytest.mark.parametrize(
    ("conv_layers", "needs", "free"), [(0, 11, 5), (24, 18, 4)], ids=["attention", "hybrid"]
)
def test_a_prompt_larger_than_vllms_cache_is_named_with_vllms_blocks(conv_layers, needs, free):
    """A cache of 5 blocks for a 171-token prompt (a hybrid model's: 4 besides vLLM's
    null block; a request takes a conv state and one per draft in each of 3 groups)."""
    config = _vllm_config(**{"model.conv_layers": conv_layers, "model.max_model_len": 4096})
    layout = plan_memory(config, LONG_FIRST)
    layout = attrs.evolve(layout, num_blocks=5, budget_bytes=5 * layout.block_bytes)
    assert layout.blocks_for(171) == needs  # stepplan's layout counts as vLLM does
    scheduler = vllm_engine_scheduler.VllmEngineScheduler(
        LONG_FIRST, config.scheduler, layout, config.model
    )
    clock = 0.0
    while scheduler.schedule_rows(clock) is None and clock < scheduler.next_arrival_s() < 1:
        clock = scheduler.next_arrival_s()
    assert scheduler.schedule_rows(clock) is None and scheduler.next_arrival_s() == math.inf
    assert str(stall_error(scheduler, clock)) == (
        "run stalled at 0.07 s: request 0 (prompt 171 + output 10 tokens) is held waiting by "
        f"vLLM's scheduler while nothing runs: its 171 tokens need {needs} blocks of vLLM's KV "
        f"cache, which has {free} free of {free} (memory.kv_cache_gib)"
    )
