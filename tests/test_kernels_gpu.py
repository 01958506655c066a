"""On the GPU at full size (C = 8192): Triton kernels == reference, and the master invariant.

Run in one process (``-p no:xdist``): the whole file takes a minute or two on an H200,
while under ``pytest -n 8`` or ``-n 12`` the drawn tests did not finish in four minutes
(2026-11-29; workers compiling side by side on one GPU, cause not pinned down).
"""

from __future__ import annotations

import sys
from pathlib import Path

import attrs
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_kernels import DTYPES, Case, bits, cases, check_against_reference, make_operands
from test_kernels_loops import run
from test_schedule_invariance import Schedule, run_schedule

from stepplan.executor import kernels
from stepplan.planner import PlannerConfig, StepBatch, compile_plan

pytestmark = pytest.mark.gpu
C, K, D, Q = 8192, 4, 3, 4


# The batches the benchmark times are the ones checked here: one table, in the bench.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from kernel_bench import BATCHES as BENCH_BATCHES  # noqa: E402
from kernel_bench import BUCKET_CONFIG  # noqa: E402

#: name -> (spec rows of Q tokens, decode rows, prefill lengths): the batches
#: bench/kernel_bench.py times (SPEC §4's and a mixed one), plus a ragged mixed one.
BATCHES = {**BENCH_BATCHES, "mixed ragged": (5, 7, [3, 200, 77])}
KINDS = tuple(BATCHES)


def batch_of(kind: str, rng: np.random.Generator) -> StepBatch:
    """Batch ``kind`` of :data:`BATCHES` on shuffled slots, with some initial state."""
    spec, decode, prefill = BATCHES[kind]
    rows = spec + decode + len(prefill)
    lens = [Q] * spec + [1] * decode + prefill
    order = rng.permutation(rows)  # the engine's order is not the group order
    drafts = np.array([Q - 1] * spec + [-1] * (decode + len(prefill)))[order]
    return StepBatch(
        query_lens=np.array(lens)[order],
        num_computed_tokens=(rng.integers(0, 2, rows) * rng.integers(1, 900, rows)),
        slots=rng.permutation(np.arange(1, 2 * rows + 1))[:rows],
        num_draft_tokens=drafts,
        num_accepted_tokens=rng.integers(1, Q + 1, rows),
    )


@pytest.mark.parametrize("layout", ["window_channel", "channel_window"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_kernels_equal_reference_at_full_size(kind, dtype, layout):
    """Graph plans where a bucket fits (uniform and ragged mixed ones), eager beyond."""
    rng = np.random.default_rng(KINDS.index(kind))
    config = PlannerConfig(num_spec_tokens=Q - 1, graph_mode="mixed", max_num_seqs=512)
    plan = compile_plan(batch_of(kind, rng), config)
    operands = make_operands(plan, C, K, (K - 1) * D + Q - 1, layout, dtype, "cuda", 7)
    check_against_reference(Case(plan, *operands, dilation=D, group=0))


@pytest.mark.parametrize("layout", ["window_channel", "channel_window"])
def test_tiles_round_alike_either_way(layout):
    """``Blocks.tiles_high_half_rounding`` changes how bf16 accumulators are rounded, not
    the result: both settings match the reference, and each other bit for bit."""
    rng = np.random.default_rng(11)
    config = PlannerConfig(num_spec_tokens=Q - 1, graph_mode="none", max_num_seqs=512)
    plan = compile_plan(batch_of("mixed ragged", rng), config)
    window = (K - 1) * D + Q - 1
    operands = make_operands(plan, C, K, window, layout, torch.bfloat16, "cuda", 5)
    case = Case(plan, *operands, dilation=D, group=0)
    blocks = kernels.default_blocks(C, layout == "channel_window")
    outputs = []
    for high_half in (False, True):
        chosen = attrs.evolve(blocks, tiles_high_half_rounding=high_half)
        outputs.append(check_against_reference(attrs.evolve(case, blocks=chosen)))
    (one_r, one_s), (two_r, two_s) = outputs
    assert torch.equal(bits(one_r), bits(two_r)), "residual differs"
    assert torch.equal(bits(one_s), bits(two_s)), "state differs"


@triton.jit
def _rounded_of(acc_ptr, out_ptr, n, FAST: tl.constexpr, BLOCK: tl.constexpr):
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.load(acc_ptr + at, mask=at < n)
    tl.store(out_ptr + at, kernels.device._rounded(acc, tl.bfloat16, FAST), mask=at < n)


def test_one_instruction_rounding_is_the_conversion():
    """FAST 2's bf16 rounding (one ``cvt.rn.bf16x2.f32`` with a zero) and ``.to``'s (FAST 1)
    against PyTorch's, bit for bit: ties to even either way, the largest finite values,
    infinities, NaN, subnormals, signed zeros, and a million random bit patterns."""
    edges = [0x3F808000, 0x3F818000, 0xBF808000, 0x3F80FFFF, 0x3F807FFF, 0x7F7FFFFF]
    edges += [0x7F7F8000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x00000001]
    edges += [0x00008000, 0x80000000, 0x00000000, 0x00800000, 0x42B00000, 0xC2B00000]
    drawn = np.random.default_rng(3).integers(0, 1 << 32, 1 << 20, dtype=np.uint32)
    patterns = np.concatenate([np.array(edges, dtype=np.uint32), drawn])
    acc = torch.from_numpy(patterns.view(np.float32)).cuda()
    got = {fast: torch.empty_like(acc) for fast in (1, 2)}
    for fast, out in got.items():
        _rounded_of[(triton.cdiv(acc.numel(), 1024),)](acc, out, acc.numel(), fast, 1024)
    want = acc.to(torch.bfloat16).float()  # PyTorch's rounding: to nearest, ties to even
    nan = want.isnan()
    for fast, out in got.items():
        assert torch.equal(out.isnan(), nan), f"FAST {fast}: NaN elsewhere"
        assert torch.equal(bits(out[~nan]), bits(want[~nan])), f"FAST {fast}: rounds otherwise"


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(cases(channels=st.sampled_from([8192, 2050]), device="cuda", max_prefill=300))
def test_kernels_equal_reference_on_drawn_steps(case):
    check_against_reference(case)


@pytest.mark.parametrize("window_contiguous", [False, True])
@pytest.mark.parametrize("seed", [1])
def test_kernels_keep_the_master_invariant_at_full_size(seed, window_contiguous):
    schedule = Schedule(
        seed,
        C,
        K,
        D,
        Q,
        num_requests=12,
        max_len=150,
        graph_mode="mixed",
        window_contiguous=window_contiguous,
    )
    run_schedule(schedule, kernels.short_conv, device="cuda")


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 2**32 - 1), st.integers(2, 8), st.integers(1, 8), st.integers(1, 8))
def test_kernels_keep_the_master_invariant_for_any_shape(seed, taps, dilation, q_max):
    schedule = Schedule(
        seed, 520, taps, dilation, q_max, num_requests=6, max_len=90, graph_mode="full"
    )
    run_schedule(schedule, kernels.short_conv, device="cuda")


@pytest.mark.parametrize("layout", ["window_channel", "channel_window"])
@pytest.mark.parametrize("kind", ["decode 256", "spec 64x4", "mixed", "mixed ragged"])
def test_every_variant_on_every_plan_gives_the_same_bits(kind, layout):
    """bf16 at C = 8192: each named variant (looping tiles, persistent rows) and persistent
    rows with other program counts or without the early loads, on the batch's eager plan
    and on its graph bucket's padded plan, give the bits of program-per-tile's eager run,
    which matches the reference."""
    rng = np.random.default_rng(KINDS.index(kind))
    batch = batch_of(kind, rng)
    eager = compile_plan(batch, attrs.evolve(BUCKET_CONFIG, graph_mode="none"))
    padded = compile_plan(batch, BUCKET_CONFIG)
    assert padded.graph is not None
    window = layout == "channel_window"
    operands = make_operands(eager, C, K, (K - 1) * D + Q - 1, layout, torch.bfloat16, "cuda", 7)
    old = kernels.default_blocks(C, window, "program-per-tile")
    want = check_against_reference(Case(eager, *operands, dilation=D, group=0, blocks=old))
    persistent = kernels.default_blocks(C, window, "persistent")
    trials = {v: kernels.default_blocks(C, window, v) for v in kernels.VARIANTS}
    trials["4 programs"] = attrs.evolve(persistent, rows_resident=4, tiles_resident=2)
    trials["64 programs"] = attrs.evolve(persistent, rows_resident=64, tiles_resident=64)
    trials["no early loads"] = attrs.evolve(persistent, rows_prefetch=False)
    for name, blocks in trials.items():
        for plan in (eager, padded):
            case = Case(plan, *operands, dilation=D, group=0, blocks=blocks)
            got_r, got_s = run(case, plan)
            what = f"{name}, {plan.graph or 'eager'}"
            assert torch.equal(bits(got_r), bits(want[0])), f"{what}: residual differs"
            assert torch.equal(bits(got_s), bits(want[1])), f"{what}: state differs"
