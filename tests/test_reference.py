"""The oracle (executor.reference) against direct dense ``F.conv1d`` on hand cases (SPEC §2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from stepplan.executor import reference
from stepplan.planner import PlannerConfig, StepBatch, compile_plan

C, K, D, Q = 6, 3, 2, 3
L = (K - 1) * D
W = L + Q - 1


def dense(history: torch.Tensor, weight: torch.Tensor, dilation: int) -> torch.Tensor:
    """``[C, n - L]``: silu of the depthwise dilated conv over ``[C, n]``, no padding, fp64."""
    kernel = weight.double()[:, None, :]
    out = F.conv1d(history.double()[None], kernel, dilation=dilation, groups=history.shape[0])
    return F.silu(out[0])


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp32 results against fp64 ones."""
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def plan_of(query_lens, computed, slots, drafts=None, accepted=None, spec_tokens=Q - 1, **kw):
    rows = len(query_lens)
    batch = StepBatch(
        query_lens=query_lens,
        num_computed_tokens=computed,
        slots=slots,
        num_draft_tokens=[-1] * rows if drafts is None else drafts,
        num_accepted_tokens=[1] * rows if accepted is None else accepted,
        **kw,
    )
    return compile_plan(batch, PlannerConfig(num_spec_tokens=spec_tokens, graph_mode="none"))


def operands(num_tokens: int, num_slots: int = 6, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, C, generator=gen)
    residual = torch.randn(num_tokens, C, generator=gen)
    state = torch.randn(num_slots, C, W, generator=gen)
    weight = torch.randn(C, K, generator=gen)
    return x, residual, state, weight


def test_prefill_from_empty_state_is_a_zero_padded_causal_conv():
    x, residual, state, weight = operands(9)
    before, old_state = residual.clone(), state.clone()
    reference.short_conv(plan_of([9], [0], [2]), x, residual, state, weight, dilation=D)
    history = torch.cat([torch.zeros(C, L), x.T], dim=1)
    assert_close(residual, before.double() + dense(history, weight, D).T)
    torch.testing.assert_close(state[2, :, :L], x[-L:].T)
    torch.testing.assert_close(state[2, :, L:], old_state[2, :, L:])  # beyond L: kept
    mask = torch.ones(state.shape[0], dtype=torch.bool)
    mask[2] = False
    assert torch.equal(state[mask], old_state[mask])


def test_prefill_shorter_than_reach_continues_from_state():
    x, residual, state, weight = operands(2)
    old = state[3].clone()
    before = residual.clone()
    reference.short_conv(plan_of([2], [7], [3]), x, residual, state, weight, dilation=D)
    history = torch.cat([old[:, :L], x.T], dim=1)
    assert_close(residual, before.double() + dense(history, weight, D).T)
    torch.testing.assert_close(state[3, :, :L], history[:, 2 : 2 + L])


def test_decode_steps_equal_one_dense_conv():
    x, _, state, weight = operands(5)
    state[1] = torch.nan  # a first decode (no initial state) must not read it
    outputs = []
    for t in range(5):
        residual = torch.zeros(1, C)
        plan = plan_of([1], [t], [1])
        reference.short_conv(plan, x[t : t + 1], residual, state, weight, dilation=D)
        outputs.append(residual[0])
    history = torch.cat([torch.zeros(C, L), x.T], dim=1)
    assert_close(torch.stack(outputs), dense(history, weight, D).T)


@pytest.mark.parametrize("accepted", [1, 2, 3])
def test_spec_row_reads_at_offset_and_writes_every_draft_window(accepted):
    x, residual, state, weight = operands(3)
    old = state[4].clone()
    before = residual.clone()
    plan = plan_of([3], [10], [4], drafts=[2], accepted=[accepted])
    reference.short_conv(plan, x, residual, state, weight, dilation=D)
    o = accepted - 1
    history = torch.cat([old[:, o : o + L], x.T], dim=1)
    assert_close(residual, before.double() + dense(history, weight, D).T)
    torch.testing.assert_close(state[4, :, : L + 2], history[:, 1 : L + 3])


def test_spec_row_with_fewer_drafts_keeps_the_window_tail():
    x, residual, state, weight = operands(1)
    old = state[4].clone()
    plan = plan_of([1], [10], [4], drafts=[0], accepted=[3])
    reference.short_conv(plan, x, residual, state, weight, dilation=D)
    torch.testing.assert_close(state[4, :, L:], old[:, L:])
    torch.testing.assert_close(state[4, :, : L - 1], old[:, 3 : 2 + L])
    torch.testing.assert_close(state[4, :, L - 1], x[0])


def test_null_slot_rows_add_nothing_and_write_no_state():
    x, residual, state, weight = operands(6)
    state[0] = torch.nan
    before, old_state = residual.clone(), state.clone()
    plan = plan_of([1, 3, 2], [4, 0, 5], [0, 0, 0], drafts=[-1, -1, 1], allow_null_slots=True)
    reference.short_conv(plan, x, residual, state, weight, dilation=D)
    assert torch.equal(residual[:4], before[:4])  # decode and prefill on slot 0: y = 0
    history = torch.cat([torch.zeros(C, L), x[4:].T], dim=1)  # spec: zeros for state
    torch.testing.assert_close(
        residual[4:].double(), before[4:].double() + dense(history, weight, D).T
    )
    assert torch.equal(state.nan_to_num(7.0), old_state.nan_to_num(7.0))


def test_mixed_step_in_engine_order_matches_each_request_alone():
    query_lens, computed, slots = [4, 1, 0, 2, 1], [0, 3, 0, 8, 2], [5, 1, 0, 2, 3]
    drafts = [-1, -1, -1, 1, 0]
    accepted = [1, 1, 1, 2, 3]
    x, residual, state, weight = operands(8)
    expect_r, expect_s = residual.clone(), state.clone()
    starts = np.cumsum([0, *query_lens])
    for row in (0, 1, 3, 4):
        part = slice(starts[row], starts[row + 1])
        alone = plan_of(
            [query_lens[row]], [computed[row]], [slots[row]], [drafts[row]], [accepted[row]]
        )
        reference.short_conv(alone, x[part], expect_r[part], expect_s, weight, dilation=D)
    plan = plan_of(query_lens, computed, slots, drafts, accepted)
    reference.short_conv(plan, x, residual, state, weight, dilation=D)
    assert torch.equal(residual, expect_r)
    assert torch.equal(state, expect_s)


def test_bf16_rounds_before_silu_like_conv1d_then_silu():
    x, residual, state, weight = (t.bfloat16() for t in operands(7))
    before = residual.clone()
    reference.short_conv(plan_of([7], [0], [1]), x, residual, state, weight, dilation=D)
    padded = F.pad(x.T[None], (L, 0))
    conv = F.conv1d(padded.float(), weight.float()[:, None, :], dilation=D, groups=C)
    y = F.silu(conv.bfloat16())[0].T
    assert torch.equal(residual, before + y)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda o: o.update(weight=o["weight"][:, :1]), "weight"),
        (lambda o: o.update(conv_state=o["conv_state"][:, :, : L + Q - 2]), "conv_state"),
        (lambda o: o.update(residual=o["residual"].double()), "residual"),
        (lambda o: o.update(x=o["x"][:3], residual=o["residual"][:3]), "x"),
        (lambda o: o.update(dilation=9), "dilation"),
        (lambda o: o.update(group=1), "group"),
    ],
)
def test_bad_operands_are_refused_by_name(change, field):
    x, residual, state, weight = operands(5)
    ops = dict(x=x, residual=residual, conv_state=state, weight=weight, dilation=D, group=0)
    change(ops)
    with pytest.raises(ValueError, match=f"^{field}"):
        reference.short_conv(plan_of([5], [0], [1]), **ops)
