"""The byte counts ``bench/kernel_bench.py`` divides by: SPEC §4's floor and the DRAM sectors
it touches in each state layout (CPU only: no kernel runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stepplan.planner import PlannerConfig, compile_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import kernel_bench as bench

CHANNELS = 8192
CONFIG = PlannerConfig(num_spec_tokens=bench.Q - 1, graph_mode="none", max_num_seqs=512)


def plan_of(name: str):
    return compile_plan(bench.batch_of(name), CONFIG)


@pytest.mark.parametrize(
    ("name", "floor_us"), [("decode 256", 20.7), ("spec 256x4", 32.5), ("prefill 4x4096", 189.0)]
)
def test_floor_matches_spec_anchors(name, floor_us):
    seconds = bench.floor_bytes(plan_of(name), CHANNELS) / 4.26e12  # SPEC §4's ceiling
    assert seconds * 1e6 == pytest.approx(floor_us, rel=0.01)


@pytest.mark.parametrize("name", list(bench.BATCHES))
def test_sectors_equal_the_floor_where_entries_are_planes(name):
    plan = plan_of(name)
    assert bench.sector_bytes(plan, CHANNELS, bench.LAYOUTS[0]) == bench.floor_bytes(plan, CHANNELS)


@pytest.mark.parametrize("name", list(bench.BATCHES))
def test_contiguous_windows_move_whole_slots(name):
    """Where each channel's W entries are side by side, any read or write of a row's
    window covers every sector of its slot: W entries per channel, not the L counted."""
    plan = plan_of(name)
    item = bench.DTYPE.itemsize
    expected = 3 * plan.num_tokens * CHANNELS * item
    for row in range(plan.num_rows):
        read, written = bench.state_entries(plan, row)
        expected += (bool(read) + bool(written)) * CHANNELS * bench.W * item
    assert bench.sector_bytes(plan, CHANNELS, bench.LAYOUTS[1]) == expected


@pytest.mark.parametrize("layout", bench.LAYOUTS)
def test_the_sweep_can_keep_the_default_blocks(layout):
    """A sweep picks among its variants: the defaults must be one of them, or a sweep
    would replace them without ever timing them (the defaults store each layout's own
    way: True in a row variant's last place)."""
    blocks = bench.kernels.default_blocks(CHANNELS, layout != bench.LAYOUTS[0])
    rows = (blocks.rows_channels, blocks.rows_warps, blocks.rows_channels_first, True)
    assert rows in bench.ROW_VARIANTS
    assert bench._with_variant(blocks, False, rows) == blocks
    tiles = (blocks.tiles_channels, blocks.tiles_warps, blocks.tiles_tokens)
    assert (*tiles, blocks.tiles_channels_first) in bench.TILE_VARIANTS


def test_kernel_bench_runs_the_runtime_table_for_its_variants():
    """``--with-runtime``: the kernels' run goes on to runtime_bench's GPU table, for the
    same variants and channels, in the same process."""
    from unittest import mock

    import runtime_bench

    args = bench.parse_args(["--channels", "2048", "--variants", "program-per-tile", "persistent"])
    with mock.patch.object(runtime_bench, "main") as main:
        bench.run_runtime_bench(args)
    main.assert_called_once_with(
        ["--gpu-only", "--channels", "2048", "--variants", "program-per-tile", "persistent"]
    )
    assert runtime_bench.parse_args(main.call_args.args[0]).gpu_only


def test_buckets_retime_only_batches_whose_bucket_launches_more():
    padded = {name for name in bench.BATCHES if bench.padded_grids(name)}
    assert padded == {"prefill 1x512", "prefill 4x4096", "mixed"}


def test_runtime_rows_each_fit_a_bucket_with_room_to_pad():
    """Every row of runtime_bench's GPU table replays a graph; most leave padding in it."""
    import numpy as np
    import runtime_bench

    config, rng = runtime_bench.planner_config(), np.random.default_rng(0)
    plans = {
        name: compile_plan(runtime_bench.make_batch(rng, *shape), config)
        for name, shape in runtime_bench.BATCHES.items()
    }
    assert all(plan.graph is not None for plan in plans.values())
    assert plans["mixed 256"].graph.num_tiles > 10 * plans["mixed 256"].num_tiles
    assert plans["decode 130"].graph.num_rows > plans["decode 130"].num_rows
