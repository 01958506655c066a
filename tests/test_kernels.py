"""Triton kernels (interpreted on CPU) == the reference on drawn mixed steps, poisoned buffers."""

from __future__ import annotations

from unittest import mock

import attrs
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepplan.executor import kernels, reference
from stepplan.planner import ExecutionPlan, PlannerConfig, StepBatch, compile_plan

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LAYOUTS = ("window_channel", "channel_window", "strided")
# Two roundings of slack: relative, and absolute against the largest value (``r + y`` may
# cancel). The interpreter rounds fp32 -> bf16 by truncation, one bf16 ulp off at times.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@attrs.frozen
class Case:
    """One layer of one step: the plan and every operand (residual and state poisoned)."""

    plan: ExecutionPlan
    x: torch.Tensor
    residual: torch.Tensor
    conv_state: torch.Tensor
    weight: torch.Tensor
    dilation: int
    group: int
    blocks: kernels.Blocks | None = None


def state_pool(slots: int, channels: int, window: int, layout: str, dtype, device) -> torch.Tensor:
    """A logical ``[slots, C, W]`` view over memory laid out as ``layout`` says."""
    if layout == "window_channel":  # vLLM's default: channel stride 1
        return torch.empty(slots, window, channels, dtype=dtype, device=device).transpose(1, 2)
    if layout == "channel_window":  # window stride 1
        return torch.empty(slots, channels, window, dtype=dtype, device=device)
    memory = torch.empty(slots, window, channels, 2, dtype=dtype, device=device)
    return memory[..., 1].transpose(1, 2)  # no unit stride at all


def make_operands(plan, channels, taps, window, layout, dtype, device, seed) -> tuple:
    """Random x and weights; NaN residual beyond the plan's tokens, NaN state off its slots."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    tokens = plan.batch.num_tokens + 3
    x = torch.randn(tokens, channels, generator=gen).to(dtype=dtype, device=device)
    residual = torch.randn(tokens, channels, generator=gen).to(dtype=dtype, device=device)
    residual[plan.batch.num_tokens :] = torch.nan
    slots = plan.batch.slots
    state = state_pool(int(slots.max()) + 3, channels, window, layout, dtype, device)
    state.fill_(torch.nan)
    used = np.unique(slots[:, plan.batch.kinds != 3])
    used = torch.from_numpy(used[used != 0]).to(device)
    values = torch.randn(len(used), channels, window, generator=gen)
    state[used] = values.to(dtype=dtype, device=device)
    weight = (torch.randn(channels, taps, generator=gen) / taps**0.5).to(dtype=dtype, device=device)
    return x, residual, state, weight


@st.composite
def step_batches(draw, max_rows: int = 7, max_prefill: int = 90) -> tuple[StepBatch, int]:
    """A valid batch of every row kind, in any order, maybe on NULL slots; and its Q."""
    q_max = draw(st.integers(1, 8))
    rows = draw(st.integers(1, max_rows))
    kinds = draw(st.lists(st.sampled_from("sdpz"), min_size=rows, max_size=rows))
    drafts = [draw(st.integers(0, q_max - 1)) if k == "s" else -1 for k in kinds]
    lens = [
        {"s": d + 1, "d": 1, "z": 0}.get(k) or draw(st.integers(2, max_prefill))
        for k, d in zip(kinds, drafts, strict=True)
    ]
    accepted = [draw(st.integers(1, q_max)) for _ in kinds]
    groups = draw(st.integers(1, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    slots = np.stack([rng.permutation(np.arange(1, 2 * rows + 2))[:rows] for _ in range(groups)])
    null_slots = draw(st.booleans())
    if null_slots:
        slots[:, rng.random(rows) < 0.3] = 0
    computed = rng.integers(0, 2, rows) * rng.integers(1, 200, rows)
    batch = StepBatch(
        query_lens=lens,
        num_computed_tokens=computed,
        slots=slots,
        num_draft_tokens=drafts,
        num_accepted_tokens=accepted,
        num_padded_tokens=sum(lens) + draw(st.integers(0, 3)),
        allow_null_slots=null_slots,
    )
    return batch, q_max


@st.composite
def cases(
    draw,
    channels=None,
    dtypes=None,
    device="cpu",
    max_prefill: int = 90,
    layouts: tuple[str, ...] = LAYOUTS,
    max_taps: int = 8,
    max_dilation: int = 8,
) -> Case:
    """A drawn step with operands; tile programs step 8 or 64 tokens, in either order."""
    batch, q_max = draw(step_batches(max_prefill=max_prefill))
    taps = draw(st.integers(2, max_taps))
    dilation = draw(st.integers(1, max_dilation))
    reach = (taps - 1) * dilation
    tiles = [t for t in (8, 16, 32, 64) if t >= reach]
    config = PlannerConfig(
        num_spec_tokens=q_max - 1,
        graph_mode=draw(st.sampled_from(["none", "full", "mixed"])),
        graph_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        max_num_seqs=16,
        prefill_tile_tokens=draw(st.sampled_from(tiles)),
    )
    plan = compile_plan(batch, config)
    window = reach + q_max - 1 + draw(st.integers(0, 2))
    layout = draw(st.sampled_from(layouts))
    seed = draw(st.integers(0, 2**31))
    channels = draw(st.integers(8, 40) if channels is None else channels)
    dtype = draw(st.sampled_from(DTYPES) if dtypes is None else dtypes)
    x, residual, state, weight = make_operands(
        plan, channels, taps, window, layout, dtype, device, seed
    )
    group = draw(st.integers(0, batch.num_groups - 1))
    orders = draw(st.tuples(st.booleans(), st.booleans()))
    tokens = draw(st.sampled_from([8, 16, 64]))
    blocks = kernels.Blocks(64, 4, 64, 4, tokens, *orders, rows_window_tile=draw(st.booleans()))
    return Case(plan, x, residual, state, weight, dilation, group, blocks)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bits, so NaN poison compares exactly."""
    ints = {2: torch.int16, 4: torch.int32}[tensor.element_size()]
    return tensor.contiguous().view(ints)


def written_tokens(plan: ExecutionPlan, group: int, num_tokens: int) -> torch.Tensor:
    """``[num_tokens], bool``: engine tokens SPEC §2 adds to (not rows on slot 0 but spec)."""
    written = torch.zeros(num_tokens, dtype=torch.bool)
    for row in range(plan.num_rows):
        if plan.row_kind[row] == 0 or plan.row_slot[group, row] != 0:
            start, stop = plan.row_query_start[row], plan.row_query_start[row + 1]
            written[torch.from_numpy(plan.token_map[start:stop].astype(np.int64))] = True
    return written


def check_against_reference(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """Run both on copies; state must match bit for bit, residual within a rounding.

    Returns the kernels' residual and state."""
    ref_r, ref_s = case.residual.clone(), case.conv_state.clone()
    got_r, got_s = case.residual.clone(), case.conv_state.clone()
    args = dict(weight=case.weight, dilation=case.dilation, group=case.group)
    reference.short_conv(case.plan, case.x, ref_r, ref_s, **args)
    kernels.launch_short_conv(
        kernels.launch_shape(case.plan),
        torch.from_numpy(np.array(case.plan.packed)).to(case.x.device),
        case.x,
        got_r,
        got_s,
        **args,
        blocks=case.blocks,
    )
    assert torch.equal(bits(got_s), bits(ref_s)), "state differs from the reference"
    kept = ~written_tokens(case.plan, case.group, case.x.shape[0]).to(case.x.device)
    assert torch.equal(bits(got_r[kept]), bits(case.residual[kept])), "wrote a foreign token"
    tol = TOLERANCE[case.x.dtype]
    scale = float(ref_r.float().nan_to_num().abs().max()) + 1.0
    torch.testing.assert_close(got_r, ref_r, rtol=tol, atol=tol * scale, equal_nan=True)
    return got_r, got_s


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(max_prefill=40))
def test_kernels_equal_reference_on_mixed_steps(case):
    check_against_reference(case)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(max_prefill=20, layouts=("channel_window",), max_taps=4, max_dilation=4))
def test_compact_windows_move_whole_and_equal_reference(case):
    """Windows of 2 to 21 entries in a compact pool take the rows' whole-window path."""
    window = case.conv_state.shape[2]
    assert kernels.launch._compact_window(case.conv_state) == (window if window > 1 else 0)
    check_against_reference(case)


def test_only_compact_small_windows_move_whole():
    pool = torch.empty(3, 8, 12)
    assert kernels.launch._compact_window(pool) == 12
    assert kernels.launch._compact_window(torch.empty(3, 12, 8).transpose(1, 2)) == 0
    assert kernels.launch._compact_window(torch.empty(3, 8, 16)[..., :12]) == 0  # padded windows
    assert kernels.launch._compact_window(torch.empty(3, 8, 33)) == 0  # wider than registers hold


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(channels=st.sampled_from([150, 201]), dtypes=st.just(torch.float16), max_prefill=20))
def test_kernels_mask_the_last_of_several_channel_blocks(case):
    check_against_reference(case)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(channels=st.sampled_from([150, 201]), dtypes=st.just(torch.float16), max_prefill=20))
def test_channels_first_programs_past_the_grid_axis_limit(case):
    """More items than a grid axis beyond the first holds: channels-first programs share
    axis 0 with their blocks and find their place by division (the limit is lowered to
    one item here to get there without 65,536 of them)."""
    first = attrs.evolve(case.blocks, rows_channels_first=True, tiles_channels_first=True)
    with mock.patch.object(kernels.grid, "_GRID_AXIS_MAX", 1):
        check_against_reference(attrs.evolve(case, blocks=first))


def test_launch_grids_put_the_faster_moving_axis_first():
    assert kernels.grid._grid(300, 4, channels_first=False) == (300, 4)
    assert kernels.grid._grid(300, 4, channels_first=True) == (4, 300)
    assert kernels.grid._grid(70_000, 4, channels_first=True) == (280_000,)


@pytest.mark.parametrize("layout", ["window_channel", "channel_window"])
def test_default_blocks_on_a_mixed_step(layout):
    """The defaults carry settings that only compiled launches use (a programmatic
    dependent launch, a register cap on the tiles, the window tiles' one-instruction rounding);
    interpreted, they are plain launches."""
    blocks = kernels.default_blocks(24, layout == "channel_window")
    assert blocks.dependent and blocks.tiles_registers
    assert blocks.tiles_high_half_rounding == (layout == "channel_window")
    plan = graph_plan([4, 1, 70, 2], [3, -1, -1, -1], [1, 2, 3, 4])
    operands = make_operands(plan, 24, 4, 12, layout, torch.float32, "cpu", 1)
    check_against_reference(Case(plan, *operands, dilation=3, group=0))


def graph_plan(query_lens, drafts, slots) -> ExecutionPlan:
    rows = len(query_lens)
    batch = StepBatch(
        query_lens=query_lens,
        num_computed_tokens=[5] * rows,
        slots=slots,
        num_draft_tokens=drafts,
        num_accepted_tokens=[2] * rows,
    )
    return compile_plan(batch, PlannerConfig(num_spec_tokens=3, graph_mode="mixed"))


def test_one_launch_shape_replays_any_plan_of_its_layout():
    first = graph_plan([4, 1, 30], [3, -1, -1], [1, 2, 3])
    second = graph_plan([2, 30, 1, 0], [-1, -1, 0, -1], [4, 5, 6, 0])
    shape = kernels.launch_shape(first)
    assert shape == kernels.launch_shape(second)  # the same graph bucket
    x, residual, state, weight = make_operands(
        second, 12, 4, 12, "window_channel", torch.float32, "cpu", 3
    )
    want_r, want_s = residual.clone(), state.clone()
    reference.short_conv(second, x, want_r, want_s, weight, dilation=3)
    buffer = torch.from_numpy(np.array(second.packed))
    kernels.launch_short_conv(shape, buffer, x, residual, state, weight, dilation=3, group=0)
    torch.testing.assert_close(residual, want_r, equal_nan=True)
    assert torch.equal(bits(state), bits(want_s))


def test_launch_shape_reads_the_op_grids():
    plan = graph_plan([4, 1, 30], [3, -1, -1], [1, 2, 3])
    shape = kernels.launch_shape(plan)
    grids = {op.kernel: op.grid for op in plan.ops}
    assert (shape.rows_grid,) == grids["short_conv_rows"]
    assert (shape.tiles_grid,) == grids["short_conv_prefill_tiles"]
    assert shape.layout == plan.layout
    assert (shape.query_len_max, shape.tile_tokens) == (4, plan.config.prefill_tile_tokens)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("graph_mode", ["none", "full"])
def test_decode_steps_launch_the_decode_only_rows(layout, graph_mode):
    """A step of decodes (and padding) compiles the rows' one-token path alone; a
    step with a spec row keeps both paths."""
    config = PlannerConfig(num_spec_tokens=3, graph_mode=graph_mode, graph_sizes=(8,))
    batch = StepBatch(
        query_lens=[1, 1, 0, 1],
        num_computed_tokens=[5, 0, 0, 9],
        slots=[3, 1, 0, 2],
        num_draft_tokens=[-1] * 4,
        num_accepted_tokens=[1] * 4,
    )
    plan = compile_plan(batch, config)
    assert kernels.launch_shape(plan).row_tokens_max == 1
    operands = make_operands(plan, 24, 4, 12, layout, torch.float32, "cpu", 5)
    check_against_reference(Case(plan, *operands, dilation=3, group=0))
    with_spec = attrs.evolve(batch, query_lens=[1, 3, 0, 1], num_draft_tokens=[-1, 2, -1, -1])
    assert kernels.launch_shape(compile_plan(with_spec, config)).row_tokens_max == 4


def test_bad_launches_are_refused_by_name():
    plan = graph_plan([4, 1, 30], [3, -1, -1], [1, 2, 3])
    x, residual, state, weight = make_operands(
        plan, 8, 8, 60, "channel_window", torch.float32, "cpu", 0
    )
    shape = kernels.launch_shape(plan)
    buffer = torch.from_numpy(np.array(plan.packed))
    with pytest.raises(ValueError, match=r"^tile_tokens"):  # L = 7 * 8 = 56 > 16-token tiles
        kernels.launch_short_conv(
            attrs.evolve(shape, tile_tokens=16),
            buffer,
            x,
            residual,
            state,
            weight,
            dilation=8,
            group=0,
        )
    with pytest.raises(ValueError, match=r"^plan_buffer"):
        kernels.launch_short_conv(
            shape, buffer[1:], x, residual, state, weight, dilation=2, group=0
        )
    wide = torch.zeros(x.shape[0], 16)
    with pytest.raises(ValueError, match=r"^x"):
        kernels.short_conv(plan, wide[:, ::2], residual, state, weight, dilation=2)
    with pytest.raises(ValueError, match=r"^x: must be \[num_engine_tokens >= 35, C\]"):
        kernels.short_conv(plan, x[:34], residual[:34], state, weight, dilation=2)
    narrow = kernels.Blocks(4, 1, 8, 1, 16, rows_channels_first=False)  # 8 channels: 2 blocks
    before = bits(residual), bits(state)
    with (
        mock.patch.object(kernels.grid, "_GRID_AXIS_MAX", 1),
        pytest.raises(ValueError, match=r"^channels: 8 channels make more than 1 blocks of 4"),
    ):
        kernels.launch_short_conv(
            shape, buffer, x, residual, state, weight, dilation=2, group=0, blocks=narrow
        )
    assert torch.equal(bits(residual), before[0])  # nothing ran
    assert torch.equal(bits(state), before[1])
