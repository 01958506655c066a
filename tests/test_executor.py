"""The executor on the CPU: triton (interpreted) eager equals the reference, errors are clear."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.executor import BACKENDS, Executor, ReplayMismatchError, check_replay
from stepplan.executor.upload import PinnedUpload
from stepplan.planner import PlannerConfig, StepBatch, compile_plan

CHANNELS, TAPS, DILATION, SLOTS = 12, 3, 2, 24
LAYER_GROUPS = (0, 1, 1)  # three layers, two groups


def random_batch(
    rng: np.random.Generator,
    num_rows: int,
    q_max: int,
    groups: int,
    kind_weights: tuple[float, ...] = (0.35, 0.3, 0.2, 0.15),
    max_prefill: int = 20,
) -> StepBatch:
    """Random valid rows of the kinds (spec, decode, prefill, padding) in random order."""
    kinds = rng.choice(4, size=num_rows, p=np.array(kind_weights) / sum(kind_weights))
    spec_q = 1 + rng.integers(0, q_max, size=num_rows)
    prefill_q = rng.integers(2, max_prefill + 1, num_rows)
    q = np.choose(kinds, [spec_q, np.ones(num_rows, int), prefill_q, 0 * kinds])
    computed = rng.integers(0, 40, size=num_rows) * (rng.random(num_rows) < 0.7)
    computed = np.where(kinds == 0, computed + 1, np.where(kinds == 3, 0, computed))
    pool = np.arange(1, max(SLOTS, num_rows + 1))
    slots = np.stack([rng.permutation(pool)[:num_rows] for _ in range(groups)])
    return StepBatch(
        query_lens=q,
        num_computed_tokens=computed,
        slots=np.where(kinds == 3, 0, slots),
        num_draft_tokens=np.where(kinds == 0, q - 1, -1),
        num_accepted_tokens=np.where(kinds == 0, rng.integers(1, q_max + 1, num_rows), 1),
    )


def make_executor(backend: str, config: PlannerConfig, seed: int = 0) -> Executor:
    """Three layers over two groups, fp32, states in vLLM's [slot, window, channel] memory."""
    gen = torch.Generator().manual_seed(seed)
    window = (TAPS - 1) * DILATION + config.query_len_max - 1
    states = [
        torch.randn(SLOTS, window, CHANNELS, generator=gen).permute(0, 2, 1) for _ in LAYER_GROUPS
    ]
    return Executor(
        weights=[torch.randn(CHANNELS, TAPS, generator=gen) for _ in LAYER_GROUPS],
        layer_groups=LAYER_GROUPS,
        conv_states=states,
        dilation=DILATION,
        config=config,
        backend=backend,
    )


CONFIGS = (
    PlannerConfig(num_spec_tokens=2, graph_mode="mixed", max_num_seqs=16, prefill_tile_tokens=8),
    PlannerConfig(num_spec_tokens=2, graph_mode="full", max_num_seqs=16, prefill_tile_tokens=8),
    PlannerConfig(num_spec_tokens=2, graph_mode="none", max_num_seqs=16, prefill_tile_tokens=8),
)


def assert_same_state(a: Executor, b: Executor) -> None:
    for layer, (sa, sb) in enumerate(zip(a.conv_states, b.conv_states, strict=True)):
        torch.testing.assert_close(sa, sb, atol=1e-5, rtol=1e-5, msg=f"state of layer {layer}")


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), config_index=st.integers(0, len(CONFIGS) - 1))
def test_eager_triton_equals_reference_over_steps(seed, config_index):
    """A large step, then smaller ones on the same persistent plan buffer: stale bytes are inert."""
    config = CONFIGS[config_index]
    rng = np.random.default_rng(seed)
    triton_ex, reference_ex = make_executor("triton", config), make_executor("reference", config)
    for num_rows in (12, 3, 1, 7):
        batch = random_batch(rng, num_rows, config.query_len_max, groups=2)
        plan = compile_plan(batch, config)
        extra = int(rng.integers(0, 4))  # engine padding rows nobody may touch
        x = torch.randn(batch.num_tokens + extra, CHANNELS)
        residual = torch.randn_like(x)
        got, want = residual.clone(), residual.clone()
        triton_ex.step(plan, x, got)
        reference_ex.step(plan, x, want)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[batch.num_tokens :], residual[batch.num_tokens :])
        assert_same_state(triton_ex, reference_ex)


def test_inert_plan_touches_nothing():
    config = CONFIGS[0]
    executor = make_executor("triton", config)
    batch = random_batch(np.random.default_rng(3), 10, config.query_len_max, groups=2)
    plan = compile_plan(batch, config)
    assert plan.graph is not None
    before = [s.clone() for s in executor.conv_states]
    x = torch.randn(plan.padded_tokens, CHANNELS)
    residual = torch.randn_like(x)
    kept = residual.clone()
    executor.prepare_inert(plan)
    executor.run_layers(x, residual)
    torch.testing.assert_close(residual, kept, atol=0, rtol=0)
    for layer, state in enumerate(executor.conv_states):
        torch.testing.assert_close(state, before[layer], atol=0, rtol=0)


def test_replay_signature_mismatch_names_the_fields():
    """Same batch, same graph key, other tile size: replaying the first graph would be wrong."""
    base = CONFIGS[0]
    other = PlannerConfig(
        num_spec_tokens=2, graph_mode="mixed", max_num_seqs=16, prefill_tile_tokens=16
    )
    executor = make_executor("triton", base)
    batch = StepBatch(  # pure spec: a spec graph, whose key has no tiles
        query_lens=[3, 1, 3],
        num_computed_tokens=[4, 2, 9],
        slots=[[1, 2, 3], [4, 5, 6]],
        num_draft_tokens=[2, 0, 2],
        num_accepted_tokens=[1, 1, 3],
    )
    first, second = compile_plan(batch, base), compile_plan(batch, other)
    assert first.graph == second.graph and first.graph is not None
    captured = executor.signature(first)
    check_replay(captured, executor.signature(compile_plan(batch, base)))  # equal: no error
    with pytest.raises(ReplayMismatchError, match="tile_tokens: captured 8, plan has 16"):
        check_replay(captured, executor.signature(second))
    mixed = compile_plan(random_batch(np.random.default_rng(9), 9, 3, groups=2), base)
    assert mixed.graph is not None and mixed.graph != first.graph
    with pytest.raises(ReplayMismatchError, match="layout"):
        check_replay(captured, executor.signature(mixed))


def test_bad_plans_and_operands_are_refused():
    config = CONFIGS[0]
    executor = make_executor("triton", config)
    one_group = compile_plan(
        StepBatch(
            query_lens=[1],
            num_computed_tokens=[0],
            slots=[1],
            num_draft_tokens=[-1],
            num_accepted_tokens=[1],
        ),
        config,
    )
    with pytest.raises(ValueError, match="plan: has 1 layer groups, the executor has 2"):
        executor.prepare(one_group)
    two = compile_plan(random_batch(np.random.default_rng(0), 4, 3, groups=2), config)
    x = torch.randn(two.batch.num_tokens, CHANNELS)
    with pytest.raises(ValueError, match=r"x: must be torch\.float32"):
        executor.step(two, x.double(), x.clone())
    with pytest.raises(ValueError, match=r"residual: must be \[engine_tokens"):
        executor.step(two, x, x[:, :4].clone())
    with pytest.raises(RuntimeError, match="conv\\(\\) before prepare"):
        make_executor("reference", config).conv(0, x, x.clone())


def test_bad_geometry_is_refused():
    config = CONFIGS[0]
    weight = torch.zeros(CHANNELS, TAPS)
    state = torch.zeros(SLOTS, CHANNELS, 6)  # L + Q - 1 = 4 + 2
    kwargs = dict(dilation=DILATION, config=config, backend="reference")
    Executor(weights=[weight], layer_groups=[0], conv_states=[state], **kwargs)
    with pytest.raises(
        ValueError, match=r"conv_states\[0\]: must be a \[num_slots, C=12, W >= 6\]"
    ):
        Executor(weights=[weight], layer_groups=[0], conv_states=[state[:, :, :5]], **kwargs)
    with pytest.raises(ValueError, match=r"layer_groups: must number groups 0\.\.G-1"):
        Executor(weights=[weight] * 2, layer_groups=[0, 2], conv_states=[state] * 2, **kwargs)
    with pytest.raises(ValueError, match="conv_states: has 1 entries for 2 layers"):
        Executor(weights=[weight] * 2, layer_groups=[0, 0], conv_states=[state], **kwargs)
    with pytest.raises(ValueError, match="backend"):
        Executor(
            weights=[weight], layer_groups=[0], conv_states=[state], **{**kwargs, "backend": "x"}
        )
    for backend in BACKENDS:  # graphs need the triton backend on CUDA tensors; these are CPU
        with pytest.raises(ValueError, match="use_graphs"):
            Executor(
                weights=[weight],
                layer_groups=[0],
                conv_states=[state],
                use_graphs=True,
                **{**kwargs, "backend": backend},
            )


def test_pinned_upload_round_trips_through_its_ring():
    upload = PinnedUpload(64, torch.device("cpu"), ring_size=2)
    for step in range(5):
        values = np.arange(step, step + 3 + step, dtype=np.int32)
        view = upload.upload_int32(values)
        assert view.data_ptr() == upload.device_buffer.data_ptr()
        assert view.tolist() == values.tolist()
    with pytest.raises(ValueError, match="exceed the 64 bytes"):
        upload.upload_int32(np.zeros(17, dtype=np.int32))
    with pytest.raises(RuntimeError, match="commit\\(\\) without host_bytes"):
        upload.commit(4)
    upload.host_bytes()
    with pytest.raises(RuntimeError, match="twice"):
        upload.host_bytes()
    with pytest.raises(ValueError, match=r"^ring_size: must be positive, got 0"):
        PinnedUpload(64, torch.device("cpu"), ring_size=0)
    with pytest.raises(ValueError, match=r"^capacity_bytes: must be positive, got 0"):
        PinnedUpload(0, torch.device("cpu"))
