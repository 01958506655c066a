"""A hybrid model's shared pool against vLLM 0.33's own planner and KV-cache manager,
on drawn models: attention layers in one or several KV-cache groups, each taking a block
per ``block_size`` tokens (``docs/memory.md``)."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from test_scheduler_vllm import _vllm, requires_vllm
from test_stepper import assert_same, both, needs_compiled

from stepplan.sim.memory_sizing import one_rank_model, plan_memory
from stepplan.sim.scheduler import vllm_engine_scheduler
from stepplan.sim.scheduler_diff import compare_schedulers
from stepplan.sim.settings.config import ConfigError, SimConfig, with_settings
from stepplan.sim.traces import RequestTable
from stepplan.sim.workloads import parse_synthetic

#: 24 attention and 8 conv layers: vLLM groups them by 8, three attention groups.
THREE_ATTENTION_GROUPS = {
    "model.layers": 32,
    "model.conv_layers": 8,
    "model.kv_bytes_per_token": 24 * 2 * 8 * 128 * 2,
}

#: Prompts up to 3,000 tokens arriving at once: a 0.3 GiB pool of 1.5 MiB blocks preempts.
CROWD = "synthetic:n=60,rate=5000,cv2=4,prompt=uniform:16:3000,output=uniform:16:300"


def _requests(prompts: list[int]) -> RequestTable:
    """Requests of ``prompts`` tokens and one output token each, arrived together."""
    n = len(prompts)
    return RequestTable(
        arrival_s=np.zeros(n),
        prompt_tokens=np.array(prompts, np.int64),
        output_tokens=np.ones(n, np.int64),
    )


@st.composite
def hybrid_models(draw) -> dict:
    """Settings of a hybrid model (more attention layers than conv layers or fewer),
    its cache and its speculation; KV bytes as attention layers x K and V x heads x dims."""
    layers = draw(st.integers(2, 48))
    conv_layers = draw(st.integers(1, layers - 1))
    tensor = draw(st.sampled_from([1, 2]))
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    head_dim = draw(st.sampled_from([16, 64, 128, 256]))
    dtype = draw(st.sampled_from([1, 2, 4]))
    return {
        "model.layers": layers,
        "model.conv_layers": conv_layers,
        "model.num_kv_heads": kv_heads,
        "model.num_heads": kv_heads * draw(st.sampled_from([2, 4])),
        "model.kv_bytes_per_token": (layers - conv_layers) * 2 * kv_heads * head_dim * dtype,
        "model.dtype_bytes": dtype,
        "model.conv_channels": tensor * draw(st.integers(1, 8192)),
        "model.conv_kernel_size": draw(st.integers(2, 5)),
        "model.conv_dilation": draw(st.integers(1, 4)),
        "memory.kv_cache_gib": 2.0 ** draw(st.floats(-6, 7)),
        "memory.block_size": draw(st.sampled_from([16, 32])),
        "scheduler.num_spec_tokens": draw(st.integers(0, 4)),
        "parallel.tensor": tensor,
    }


#: Pools up to this many blocks are built to allocate from (vLLM's block pool makes an
#: object per block); larger ones are checked against vLLM's planner alone.
BUILT_POOL_BLOCKS = 100_000


@requires_vllm
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hybrid_models(), st.data())
def test_the_shared_pool_is_vllms_on_drawn_models(run_settings, data):
    """vLLM's planner and KV-cache manager are the reference: block size, block count
    (less the null block) and bytes, its attention groups, and the blocks one request
    of N tokens takes from a fresh pool -- attention groups x cdiv(N, block size) plus
    the state blocks -- or, where they are more than the pool, the run refused."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    config = with_settings(SimConfig(), run_settings)
    try:
        layout = plan_memory(config, _requests([]))
    except ConfigError:  # the cache does not hold one conv state
        assume(False)
    assume(layout.num_blocks >= 1)
    model = one_rank_model(config.model, config.parallel.tensor)
    spec_tokens = config.scheduler.num_spec_tokens
    with tempfile.TemporaryDirectory() as folder:
        whole = vllm_engine_scheduler._vllm_config(
            config.scheduler, layout, model.max_model_len, folder
        )
        kv_config = vllm_engine_scheduler._kv_cache_config(whole, layout, model, spec_tokens)
        groups = [group.kv_cache_spec for group in kv_config.kv_cache_groups]
        attention = [i for i, spec in enumerate(groups) if isinstance(spec, FullAttentionSpec)]
        assert kv_config.num_blocks - 1 == layout.num_blocks
        assert {groups[i].block_size for i in attention} == {layout.block_size}
        assert len(attention) == layout.attention_groups
        # the summary's capacity_gib: every block but the null block, of vLLM's bytes
        assert {t.size for t in kv_config.kv_cache_tensors} == {
            layout.block_bytes * kv_config.num_blocks
        }
        event(f"attention groups: {layout.attention_groups}")
        if layout.num_blocks <= BUILT_POOL_BLOCKS:
            event("allocated from a built pool")
            engine, _, _ = vllm_engine_scheduler._engine(config.scheduler, layout, model, folder)
            _allocations_are_vllms(config, layout, engine.kv_cache_manager, attention, data)


def _allocations_are_vllms(config, layout, manager, attention, data) -> None:
    """Requests of a few drawn lengths and of lengths about the most the pool holds,
    each allocated on the empty pool and freed again; a trace of one such request is
    refused before its run exactly where vLLM cannot allocate it."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    pool = manager.block_pool
    free = pool.get_num_free_blocks()
    assert free == layout.num_blocks
    most = layout.block_size * (
        (layout.num_blocks - layout.state_blocks) // layout.attention_groups
    )
    edge = [max(1, most + d) for d in (-1, 0, 1)]
    small = data.draw(st.lists(st.integers(1, 5000), min_size=1, max_size=3))
    for n, tokens in enumerate(sorted({*small, *edge})):
        if tokens > config.model.resolved().max_model_len:
            continue
        request = Request(
            str(n),
            [0] * tokens,
            SamplingParams(max_tokens=1, ignore_eos=True),
            pooling_params=None,
            arrival_time=0.0,
            block_hasher=None,
        )
        allocated = manager.allocate_slots(request, tokens)
        taken = free - pool.get_num_free_blocks()
        needs = int(layout.blocks_for(tokens))
        refused = False
        try:  # one request of `tokens` positions (prompt `tokens`, one output token)
            plan_memory(config, _requests([tokens]))
        except ConfigError:
            refused = True
        assert refused == (allocated is None), (tokens, needs, layout.num_blocks)
        if allocated is None:
            assert needs > layout.num_blocks
            continue
        assert taken == needs, (tokens, taken, needs)
        held = manager.get_block_ids(str(n))
        for group in attention:
            assert len(held[group]) == -(-tokens // layout.block_size)
        manager.free(request)
        assert pool.get_num_free_blocks() == free


def _three_groups(gib: float, spec_tokens: int) -> SimConfig:
    """The model of three attention groups, the scheduler of ``PREEMPTING``."""
    return with_settings(
        SimConfig(),
        {
            **THREE_ATTENTION_GROUPS,
            "memory.kv_cache_gib": gib,
            "memory.check": True,
            "scheduler.num_spec_tokens": spec_tokens,
            "scheduler.max_num_seqs": 32,
            "scheduler.max_num_batched_tokens": 2048,
        },
    )


def test_three_attention_groups_charge_three_blocks_a_block_of_tokens():
    layout = plan_memory(_three_groups(4.0, 3), _requests([10]))
    assert (layout.block_size, layout.attention_groups, layout.state_blocks) == (48, 3, 4)
    positions = np.array([1, 48, 49, 500])
    np.testing.assert_array_equal(layout.blocks_for(positions), [7, 7, 10, 37])
    # 2,000 positions take 3 x 42 + 4 = 130 blocks: a pool of 130 holds them, 129 does not
    table = _requests([2000])
    block_gib = layout.block_bytes / 2**30
    fits = plan_memory(_three_groups(131 * block_gib, 3), table)
    assert fits.num_blocks == 130  # vLLM's null block aside
    with pytest.raises(ConfigError, match="needs 130 KV blocks, the cache holds 129 "):
        plan_memory(_three_groups(130.5 * block_gib, 3), table)


@needs_compiled
@pytest.mark.parametrize("spec_tokens", [0, 3])
def test_several_attention_groups_step_alike_compiled_and_in_python(spec_tokens):
    native, python = both(parse_synthetic(CROWD), _three_groups(0.3, spec_tokens))
    assert_same(native, python)
    assert native.requests["num_preemptions"].sum() > 0


@requires_vllm
@pytest.mark.parametrize("spec_tokens", [0, 3])
def test_preemption_agrees_with_several_attention_groups(spec_tokens):
    """Three attention groups and one conv-state group in vLLM's one pool, a small
    cache: stepplan's scheduler admits and preempts as vLLM's on every step."""
    config = _three_groups(0.3, spec_tokens)
    assert plan_memory(config, _requests([])).attention_groups == 3
    diff = compare_schedulers(parse_synthetic(CROWD), config, _vllm(config))
    assert diff.sides[0]["preemptions"] > 0
    assert diff.agreement == 1.0, diff.format()


@requires_vllm
@pytest.mark.parametrize("kv_heads", [8, 1])
def test_the_vllm_path_plans_one_ranks_cache(kv_heads):
    """At ``parallel.tensor = 2`` the layout holds one rank's figures, and so does the
    cache ``--scheduler vllm`` builds (one worker's: its KV heads, or all of one
    copied, and half the conv channels), the same blocks of the same size."""
    from stepplan.sim.scheduler.implementations import SCHEDULERS

    config = with_settings(
        SimConfig(),
        {
            "memory.kv_cache_gib": 4.0,
            "parallel.tensor": 2,
            "model.num_kv_heads": kv_heads,
            "model.kv_bytes_per_token": 16 * 2 * kv_heads * 128 * 2,
        },
    )
    table = _requests([100])
    layout = plan_memory(config, table)
    engine = SCHEDULERS["vllm"](table, config, layout).engine
    groups = engine.kv_cache_config.kv_cache_groups
    assert engine.kv_cache_config.num_blocks - 1 == layout.num_blocks
    assert groups[0].kv_cache_spec.block_size == layout.block_size


#: Forty requests at once, prompts up to 2,000 tokens (chunked under a 512-token budget).
SMALL_CROWD = "synthetic:n=40,rate=5000,cv2=4,prompt=uniform:16:2000,output=uniform:16:200"


@requires_vllm
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hybrid_models(), st.integers(0, 3), st.sampled_from([512, 2048]))
def test_drawn_hybrid_models_schedule_as_vllm_in_a_small_pool(run_settings, seed, budget):
    """Any drawn hybrid model, its pool about 2.5 times its longest request: stepplan's
    scheduler admits, grows and preempts as vLLM's on every step."""
    table = parse_synthetic(SMALL_CROWD, seed=seed)
    scheduler = {"scheduler.max_num_seqs": 16, "scheduler.max_num_batched_tokens": budget}
    config = with_settings(SimConfig(), {**run_settings, **scheduler})
    try:
        layout = plan_memory(config, _requests([]))
        positions = table.prompt_tokens + table.output_tokens - 1
        longest = int(layout.blocks_for(positions).max())
        gib = (2.5 * longest + 1) * layout.block_bytes / 2**30
        config = with_settings(config, {"memory.kv_cache_gib": gib})
        diff = compare_schedulers(table, config, _vllm(config))
    except ConfigError:  # a conv state larger than the pool
        assume(False)
    assert diff.agreement == 1.0, diff.format()
