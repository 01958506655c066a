"""Looping tile programs and persistent row programs (interpreted on CPU): a graph bucket's
padded plan equals the eager plan of the same batch bit for bit and the reference, every
variant equals every other, and a looping program stops at the first item not its own."""

from __future__ import annotations

from unittest import mock

import attrs
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_kernels import Case, bits, cases, check_against_reference, make_operands

from stepplan.executor import kernels
from stepplan.planner import ExecutionPlan, PlannerConfig, StepBatch, compile_plan


@st.composite
def looping_blocks(draw) -> kernels.Blocks:
    """Blocks of every kind of launch: one program per item, looping tiles, persistent rows
    with and without the next row loaded early; 8-channel blocks make several per step."""
    return kernels.Blocks(
        draw(st.sampled_from([8, 64])),
        draw(st.sampled_from([1, 4])),
        draw(st.sampled_from([8, 64])),
        draw(st.sampled_from([1, 4])),
        draw(st.sampled_from([8, 16, 64])),
        rows_channels_first=draw(st.booleans()),
        tiles_channels_first=draw(st.booleans()),
        rows_window_tile=draw(st.booleans()),
        tiles_resident=draw(st.sampled_from([0, 1, 2, 7])),
        rows_resident=draw(st.sampled_from([0, 1, 2, 7])),
        rows_prefetch=draw(st.booleans()),
    )


def run(case: Case, plan: ExecutionPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels on ``plan`` over copies of the case's residual and state."""
    residual, state = case.residual.clone(), case.conv_state.clone()
    kernels.launch_short_conv(
        kernels.launch_shape(plan),
        torch.from_numpy(np.array(plan.packed)).to(case.x.device),
        case.x,
        residual,
        state,
        case.weight,
        dilation=case.dilation,
        group=case.group,
        blocks=case.blocks,
    )
    return residual, state


def both_plans(batch: StepBatch, config: PlannerConfig) -> tuple[ExecutionPlan, ExecutionPlan]:
    """``(padded, eager)``: the batch in a mixed graph's bucket, and without graphs."""
    sizes = (*config.sizes, 512)  # room for every drawn step
    padded = compile_plan(batch, attrs.evolve(config, graph_mode="mixed", graph_sizes=sizes))
    return padded, compile_plan(batch, attrs.evolve(config, graph_mode="none"))


# Few, small examples: the interpreter runs each program in Python, twice per example.
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cases(channels=st.integers(8, 24), max_prefill=30), looping_blocks(), st.sampled_from([1, 3])
)
def test_padded_plans_equal_eager_plans_bit_for_bit(case, blocks, multiprocessors):
    """Graph padding (rows, tokens, tiles past the live ones) changes nothing a step
    computes, whichever launch variant runs it and however many programs it gets."""
    padded, eager = both_plans(case.plan.batch, case.plan.config)
    assert padded.graph is not None and eager.graph is None
    case = attrs.evolve(case, blocks=blocks)
    with mock.patch.object(kernels.launch, "_multiprocessors", lambda _: multiprocessors):
        want = check_against_reference(attrs.evolve(case, plan=eager))
        got = check_against_reference(attrs.evolve(case, plan=padded))
    assert torch.equal(bits(got[0]), bits(want[0])), "residual differs"
    assert torch.equal(bits(got[1]), bits(want[1])), "state differs"


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(channels=st.integers(8, 24), max_prefill=30), st.sampled_from([False, True]))
def test_every_variant_computes_alike(case, window_contiguous):
    """The named variants' blocks (``kernels.VARIANTS``), narrowed to the drawn channels,
    give the same bits on a step's graph plan."""
    plan, _ = both_plans(case.plan.batch, case.plan.config)
    outputs = []
    for variant in kernels.VARIANTS:
        blocks = kernels.default_blocks(case.x.shape[1], window_contiguous, variant)
        outputs.append(run(attrs.evolve(case, blocks=blocks), plan))
    for residual, state in outputs[1:]:
        assert torch.equal(bits(residual), bits(outputs[0][0])), "residual differs"
        assert torch.equal(bits(state), bits(outputs[0][1])), "state differs"


def poisoned_plan(plan: ExecutionPlan, free_slot: int) -> ExecutionPlan:
    """``plan`` with live-looking work past its first padding tile and past launch A's
    rows: a copy of its first tile, and a spec row on ``free_slot``, where no looping
    program may look."""
    packed = plan.packed.copy()
    layout = plan.layout
    tile_row, tile_start = layout.span("tile_row")[0], layout.span("tile_start")[0]
    live_tiles = int((plan.tile_row >= 0).sum())
    assert live_tiles + 2 <= layout.num_tiles
    packed[tile_row + live_tiles + 1] = packed[tile_row]
    packed[tile_start + live_tiles + 1] = packed[tile_start]
    first_other = plan.num_spec_rows + plan.num_decode_rows  # the first row not launch A's
    row = first_other + 2  # its start moves only the (padding) row before's end
    assert plan.row_kind[row - 1] == 3 and row < layout.num_rows
    packed[layout.span("row_kind")[0] + row] = 0
    packed[layout.span("row_query_start")[0] + row] = 0  # q = every token: it would write
    packed[layout.span("row_reads_state")[0] + row] = 1
    packed[layout.span("row_slot")[0] + row] = free_slot
    packed.flags.writeable = False
    return attrs.evolve(plan, packed=packed)


@pytest.mark.parametrize("layout", ["window_channel", "channel_window"])
def test_looping_programs_stop_at_the_first_item_not_theirs(layout):
    """One looping program per launch walks every item in order: past the first padding
    tile and past launch A's rows it must stop, although live-looking work follows."""
    batch = StepBatch(
        query_lens=[4, 1, 20, 0],
        num_computed_tokens=[5, 3, 4, 0],
        slots=[1, 2, 3, 0],
        num_draft_tokens=[3, -1, -1, -1],
        num_accepted_tokens=[2, 1, 1, 1],
    )
    config = PlannerConfig(
        num_spec_tokens=3, graph_mode="mixed", graph_sizes=(8, 64), prefill_tile_tokens=16
    )
    plan = compile_plan(batch, config)
    operands = make_operands(plan, 16, 4, 12, layout, torch.float32, "cpu", 2)
    poisoned = poisoned_plan(plan, free_slot=5)
    one = kernels.Blocks(16, 1, 16, 1, 16, tiles_resident=1, rows_resident=1)
    case = Case(plan, *operands, dilation=3, group=0, blocks=one)
    clean = run(case, plan)
    got = run(case, poisoned)
    assert torch.equal(bits(got[0]), bits(clean[0])), "residual differs"
    assert torch.equal(bits(got[1]), bits(clean[1])), "state differs"
    # One program per item runs the poison, so it would show.
    every = run(attrs.evolve(case, blocks=kernels.Blocks(16, 1, 16, 1, 16)), poisoned)
    assert not torch.equal(bits(every[0]), bits(clean[0]))


def test_only_graph_launches_loop_over_tiles():
    """An eager plan's grids hold its live work alone: no padding to skip, no loop."""
    batch = StepBatch(
        query_lens=[4, 30],
        num_computed_tokens=[5, 0],
        slots=[1, 2],
        num_draft_tokens=[3, -1],
        num_accepted_tokens=[2, 1],
    )
    graph = compile_plan(batch, PlannerConfig(num_spec_tokens=3, graph_mode="mixed"))
    eager = compile_plan(batch, PlannerConfig(num_spec_tokens=3, graph_mode="none"))
    assert kernels.launch_shape(graph).padded and not kernels.launch_shape(eager).padded
    assert kernels.launch_shape(graph).tiles_grid > graph.num_tiles  # room for padding
    assert kernels.launch_shape(eager).tiles_grid == eager.num_tiles


def test_looping_grids_are_bounded_by_the_resident_programs():
    looping = kernels.grid._looping_items
    assert looping(items=1152, blocks=64, resident=24, multiprocessors=132) == 49
    assert looping(items=30, blocks=64, resident=24, multiprocessors=132) == 30  # all fit
    assert looping(items=1152, blocks=4096, resident=1, multiprocessors=1) == 1  # one at least
    assert looping(items=10**6, blocks=1, resident=10**6, multiprocessors=1) == 65_535


def test_variants_are_named_and_unknown_ones_refused():
    assert kernels.DEFAULT_VARIANT in kernels.VARIANTS
    old = kernels.default_blocks(8192, False, "program-per-tile")
    assert not old.tiles_resident and not old.rows_resident  # one program per item
    assert kernels.default_blocks(8192, False, "looping-tiles").tiles_resident
    assert kernels.default_blocks(8192, True, "persistent").rows_resident
    with pytest.raises(ValueError, match=r"^kernel_variant: must be one of .*, got 'v0'$"):
        kernels.default_blocks(8192, False, "v0")
