"""The hybrid model engine on the CPU (tiny preset, float32): schedule invariance against
the dense oracle, inert graph padding, the host metadata, and every refusal message."""

from __future__ import annotations

import re

import model_schedules as sched
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import stepplan.executor.model.runner as runner_module
from stepplan.executor.model import (
    HybridModelRunner,
    MemoryNeed,
    MemoryTooSmallError,
    ModelShape,
    check_memory,
    make_weights,
    metadata,
    sample_positions,
)
from stepplan.planner import PlannerConfig, StepBatch
from stepplan.sim.settings import presets
from stepplan.sim.settings.config import ModelConfig

TINY = ModelShape(**presets.MODEL_PRESETS["tiny"], seed=3)
MARGIN = 1e-3  # fp32 leads below this are not compared (none were seen)


def planner(spec: int = 3, mode: str = "mixed", max_num_seqs: int = 8) -> PlannerConfig:
    return PlannerConfig(num_spec_tokens=spec, graph_mode=mode, max_num_seqs=max_num_seqs)


def tiny_runner(config: PlannerConfig, *, groups: int = 2, slots: int = 9, **kwargs):
    return HybridModelRunner(TINY, config, num_slots=slots, max_len=40, num_groups=groups, **kwargs)


# -- presets and shapes ---------------------------------------------------------------------


@pytest.mark.parametrize("name", list(presets.MODEL_PRESETS))
def test_presets_build_shapes_with_the_same_counts(name):
    preset = presets.MODEL_PRESETS[name]
    shape = ModelShape(**preset, seed=0)
    assert shape.num_params == presets.num_params(preset)
    assert shape.weight_bytes == presets.weight_bytes(preset)
    assert shape.kv_bytes_per_token == presets.kv_bytes_per_token(preset)
    assert shape.conv_state_bytes_per_slot(4) == presets.conv_state_bytes_per_slot(preset, 4)


def test_default_preset_is_the_cost_models_model():
    preset, model = presets.get_preset(presets.DEFAULT_PRESET), ModelConfig().resolved()
    shape = ModelShape(**preset)
    assert presets.DEFAULT_PRESET == model.name == "hybrid-8b"
    assert shape.num_layers == model.layers and len(shape.conv_layers) == model.conv_layers
    assert shape.attention_layers == tuple(range(1, 32, 2))
    assert (shape.hidden_size, shape.conv_channels) == (model.hidden_size, model.conv_channels)
    assert (shape.conv_kernel_size, shape.conv_dilation) == (4, 3)
    assert shape.kv_bytes_per_token == model.kv_bytes_per_token == 65536
    assert 8.4e9 < shape.num_params < 8.45e9
    assert model.params == shape.num_params  # the cost model's count is the engine's


def test_presets_are_read_only():
    with pytest.raises(TypeError):
        presets.MODEL_PRESETS["mine"] = {}  # type: ignore[index]
    with pytest.raises(TypeError):
        presets.MODEL_PRESETS["tiny"]["hidden_size"] = 8  # type: ignore[index]
    with pytest.raises(KeyError, match="unknown 'huge'; known: hybrid-8b, hybrid-1b, tiny"):
        presets.get_preset("huge")


def test_counted_weights_equal_the_formula():
    weights = make_weights(TINY, "cpu")
    assert (
        weights.num_params() == TINY.num_params == presets.num_params(presets.MODEL_PRESETS["tiny"])
    )
    assert all(t.dtype == torch.float32 for t in weights.tensors())


def test_weights_follow_the_seed():
    first, again = make_weights(TINY, "cpu"), make_weights(TINY, "cpu")
    other = make_weights(ModelShape(**presets.MODEL_PRESETS["tiny"], seed=4), "cpu")
    for a, b, c in zip(first.tensors(), again.tensors(), other.tensors(), strict=True):
        assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layer_kinds": "conv"}, "layer_kinds: must be a non-empty list"),
        ({"layer_kinds": ()}, "layer_kinds: must be a non-empty list"),
        (
            {"layer_kinds": ("conv", "mamba")},
            "layer_kinds[1]: must be 'conv' or 'attention', got 'mamba'",
        ),
        ({"layer_kinds": ("attention",)}, "layer_kinds: needs at least one 'conv' layer"),
        ({"hidden_size": 0}, "hidden_size: must be a positive integer, got 0"),
        ({"conv_channels": 64.0}, "conv_channels: must be a positive integer, got 64.0"),
        ({"mlp_size": True}, "mlp_size: must be a positive integer, got True"),
        (
            {"conv_kernel_size": 9},
            "conv_kernel_size: must be in 2..8 (the executor's kernels), got 9",
        ),
        ({"conv_dilation": 0}, "conv_dilation: must be a positive integer, got 0"),
        ({"num_kv_heads": 3}, "num_kv_heads: must divide num_heads = 4, got 3"),
        ({"head_dim": 7}, "head_dim: must be even (RoPE rotates pairs), got 7"),
        ({"vocab_size": 1}, "vocab_size: must be at least 2, got 1"),
        ({"dtype": "int8"}, "dtype: must be one of ('float32', 'bfloat16', 'float16'), got 'int8'"),
        ({"max_model_len": -5}, "max_model_len: must be a positive integer, got -5"),
        ({"rope_theta": 0.0}, "rope_theta: must be a positive number, got 0.0"),
        ({"seed": -1}, "seed: must be a non-negative integer, got -1"),
    ],
)
def test_shape_refusals_name_the_field(change, message):
    fields = {**presets.MODEL_PRESETS["tiny"], **change}
    with pytest.raises(ValueError) as error:
        ModelShape(**fields)
    assert str(error.value) == message or str(error.value).startswith(message)


# -- runner refusals ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_slots": 1}, "num_slots: needs slot 0 (NULL) and one more, got 1"),
        ({"max_len": 513}, "max_len: must be in 1..max_model_len = 512, got 513"),
        ({"num_groups": 3}, "num_groups: must be in 1..2 (the conv layers), got 3"),
        ({"attention": "paged"}, "attention: must be one of ('flash', 'sdpa'), got 'paged'"),
        ({"attention": "flash"}, "attention: flash needs CUDA and bfloat16 or float16"),
        ({"use_graphs": True}, "use_graphs: CUDA graphs need the triton backend and flash"),
    ],
)
def test_runner_refusals_name_the_argument(kwargs, message):
    arguments = {"num_slots": 4, "max_len": 32, "num_groups": 1, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        HybridModelRunner(TINY, planner(), **arguments)


def test_memory_check_names_the_parts_and_what_to_lower():
    need = MemoryNeed(weights=16 * 2**30, kv_cache=69 * 2**30, conv_state=2**30, workspace=2**31)
    check_memory(need, (100 * 2**30, 140 * 2**30), num_slots=129, max_len=8192)  # fits
    check_memory(need, None, num_slots=129, max_len=8192)  # CPU: nothing to check
    with pytest.raises(MemoryTooSmallError) as error:
        check_memory(need, (60 * 2**30, 140 * 2**30), num_slots=129, max_len=8192)
    assert str(error.value) == (
        "memory: the model needs 88.00 GiB (weights 16.00, KV cache 69.00 for 129 slots x "
        "8192 positions, conv state 1.00, workspace 2.00) but 60.00 of 140.00 GiB are free; "
        "lower num_slots or max_len (each slot's KV takes 0.535 GiB)"
    )


def test_runner_checks_memory_before_allocating(monkeypatch):
    allocated = []
    monkeypatch.setattr(runner_module, "device_free_bytes", lambda device: (1000, 2000))
    monkeypatch.setattr(runner_module, "make_weights", lambda *a: allocated.append(a))
    free = re.escape("but 0.00 of 0.00 GiB are free; lower num_slots")
    with pytest.raises(MemoryTooSmallError, match=free):
        tiny_runner(planner())
    assert not allocated


def _one_row(q=3, computed=0, slot=1, drafts=-1):
    return StepBatch(
        query_lens=[q],
        num_computed_tokens=[computed],
        slots=[[slot], [slot]],
        num_draft_tokens=[drafts],
        num_accepted_tokens=[1],
    )


@pytest.mark.parametrize(
    ("batch", "ids", "samples", "message"),
    [
        (_one_row(), [1, 2], [2], r"token_ids: must be \[3\], got \[2\]"),
        (_one_row(), [1, 64, 2], [2], r"token_ids\[1\]: 64 is outside the vocabulary 0..63"),
        (_one_row(), [1, 2, 3], [3], r"sample_index\[0\]: 3 is outside the step's tokens 0..2"),
        (_one_row(), [1, 2, 3], [[2]], r"sample_index: must be 1-D, got \[1, 1\]"),
        (_one_row(slot=9), [1, 2, 3], [2], r"slots: row 0 of group 0 uses slot 9, the runner has"),
        (
            _one_row(computed=38),
            [1, 2, 3],
            [2],
            r"num_computed_tokens: row 0 reaches 41 positions, beyond the KV cache's max_len = 40",
        ),
        (_one_row(q=4, drafts=3), [1] * 4, [0, 1, 2, 3, 3], "5 samples exceed the 4 this graph"),
    ],
)
def test_step_refusals_name_the_input(batch, ids, samples, message):
    runner = tiny_runner(planner())
    with pytest.raises(ValueError, match=message):
        runner.greedy_tokens(batch, np.array(ids), np.array(samples))
    runner.greedy_tokens(_one_row(), np.array([1, 2, 3]), np.array([2]))  # nothing left open


# -- host metadata ------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), mode=st.sampled_from(["none", "full", "mixed"]))
def test_metadata_equals_a_row_by_row_construction(seed, mode):
    rng = np.random.default_rng(seed)
    requests = sched.make_requests(rng, count=6, vocab=64, longest=30, groups=1, spec=3)
    config = planner(mode=mode)
    for req in requests:
        req.computed = int(rng.integers(0, len(req.stream)))
    rows = sched.next_step(rng, requests, spec=3, chunk=9, budget=40, max_rows=6, vocab=64)
    batch = sched.batch_of(rows, requests, 1)
    plan = runner_module.Planner(config).compile(batch)
    live = metadata.LiveRows.of(batch)
    ids, samples, _ = sched.step_inputs(rows, requests, batch)
    if plan.graph is None:
        shape = metadata.eager_shape(live, plan.num_tokens, samples.size)
    else:
        shape = metadata.graph_shape(plan.graph, config.query_len_max, 40)
    buffer = np.full(shape.nbytes + 8, 0xAB, np.uint8)  # stale bytes: every field is written
    host = metadata.fill(buffer, shape, live, ids, samples, 40)
    views = metadata.host_views(buffer, shape)
    want = {k: np.zeros_like(v) for k, v in views.items()}
    token, row = 0, 0
    for r in [r for r in rows if r is not None]:
        req = requests[r.request]
        want["cum_seq_q"][row] = token
        want["cum_seq_k"][row] = req.slots[0] * 40
        want["seqused_k"][row] = req.computed + len(r.inputs)
        for i, t in enumerate(r.inputs):
            want["token_ids"][token] = t
            want["positions"][token] = req.computed + i
            want["write_index"][token] = req.slots[0] * 40 + req.computed + i
            token += 1
        row += 1
    want["cum_seq_q"][row:] = token  # padding rows hold no token
    want["sample_index"][: samples.size] = samples
    for name, view in views.items():
        np.testing.assert_array_equal(view, want[name], err_msg=name)
    assert (host.num_tokens, host.num_rows, host.num_samples) == (token, row, samples.size)
    assert buffer[shape.nbytes :].tolist() == [0xAB] * 8


def test_sample_positions_follow_vllm():
    batch = StepBatch(
        query_lens=[3, 1, 0, 5, 2],
        num_computed_tokens=[4, 9, 0, 0, 7],
        slots=[1, 2, -1, 3, 4],
        num_draft_tokens=[2, -1, -1, -1, 1],
        num_accepted_tokens=[1, 1, 1, 1, 2],
    )
    # spec row 0: tokens 0..2; decode: 3; padding: none; prefill: its last, 8; spec: 9, 10
    assert sample_positions(batch).tolist() == [0, 1, 2, 3, 8, 9, 10]
    done = np.array([True, True, True, False, True])
    assert sample_positions(batch, done).tolist() == [0, 1, 2, 3, 9, 10]


# -- schedule invariance ---------------------------------------------------------------------


def _serve_and_compare(runner, seed, *, spec, groups, chunk, budget, max_rows, count=4):
    rng = np.random.default_rng(seed)
    requests = sched.make_requests(rng, count=count, vocab=64, longest=24, groups=groups, spec=spec)
    answers = sched.oracle(runner.weights, TINY, requests)
    checked = sched.serve(
        runner, requests, rng, spec=spec, chunk=chunk, budget=budget, max_rows=max_rows, vocab=64
    )
    assert all(req.done for req in requests)
    assert len(checked) >= sum(len(r.stream) - r.prompt_len for r in requests)
    assert sched.mismatches(checked, answers, MARGIN) == []


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    spec=st.sampled_from([0, 1, 3]),
    mode=st.sampled_from(["none", "full", "mixed"]),
    groups=st.sampled_from([1, 2]),
    chunk=st.integers(1, 16),
    budget=st.integers(4, 40),
    max_rows=st.integers(1, 4),
)
def test_any_schedule_gives_the_dense_oracles_tokens(
    seed, spec, mode, groups, chunk, budget, max_rows
):
    runner = tiny_runner(planner(spec=spec, mode=mode), groups=groups)
    _serve_and_compare(
        runner, seed, spec=spec, groups=groups, chunk=chunk, budget=budget, max_rows=max_rows
    )


@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), mode=st.sampled_from(["none", "mixed"]))
def test_triton_kernels_give_the_dense_oracles_tokens(seed, mode):
    if torch.cuda.is_available():
        pytest.skip("the GPU tests run the kernels compiled (tests/test_model_gpu.py)")
    runner = tiny_runner(planner(spec=3, mode=mode), backend="triton")
    _serve_and_compare(runner, seed, spec=3, groups=2, chunk=8, budget=24, max_rows=3, count=3)


def test_graph_padding_is_inert():
    """Graph plans (bucket sizes, padding rows and tokens) and eager plans of the same steps
    leave the same state in every live slot; padding touches only slot 0."""
    padded, exact = tiny_runner(planner(mode="mixed")), tiny_runner(planner(mode="none"))
    rng = np.random.default_rng(7)
    requests = sched.make_requests(rng, count=5, vocab=64, longest=30, groups=2, spec=3)
    graphs = 0
    while rows := sched.next_step(rng, requests, spec=3, chunk=7, budget=20, max_rows=5, vocab=64):
        batch = sched.batch_of(rows, requests, 2)
        ids, samples, _ = sched.step_inputs(rows, requests, batch)
        plan = padded.planner.compile(batch)
        graphs += plan.graph is not None and plan.graph.num_tokens > plan.num_tokens
        got = padded.logits(plan, ids, samples)
        want = exact.logits(exact.planner.compile(batch), ids, samples)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        sched.advance(rows, requests)
    assert graphs > 5  # the schedule did pad
    for a, b in zip(padded.conv_states, exact.conv_states, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert not a[0].any()  # the executor never writes the NULL slot
    torch.testing.assert_close(padded.cache.memory[:, :, 1:], exact.cache.memory[:, :, 1:])
    assert not exact.cache.memory[:, :, 0].any()  # eager steps have no padding tokens


def test_timed_run_on_the_cpu():
    runner = tiny_runner(planner(mode="none"))
    batch = _one_row()
    greedy, timing = runner.timed_run(
        runner.planner.compile(batch), np.array([4, 5, 6]), np.array([2])
    )
    assert greedy.shape == (1,) and greedy.dtype == np.int64
    assert timing.gpu_s is None and timing.wall_s >= timing.host_s > 0
    assert runner.captured_graphs == () and runner.num_groups == 2
    runner.warm_up([runner.planner.compile(batch)])  # no graphs on the CPU: nothing to do


def test_an_empty_step_runs_nothing():
    runner = tiny_runner(planner(mode="none"))
    batch = StepBatch(
        query_lens=[0],
        num_computed_tokens=[0],
        slots=[[0], [0]],
        num_draft_tokens=[-1],
        num_accepted_tokens=[1],
    )
    assert runner.greedy_tokens(batch, np.zeros(0, np.int64), np.zeros(0, np.int64)).shape == (0,)
