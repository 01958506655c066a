"""SPEC §2's master invariant: any schedule of a request gives one dense causal conv.

Random requests share steps; each step gives every scheduled request a prefill
chunk, a decode or a spec query (accepted drafts are the stream's next tokens,
rejected ones are garbage that the next step re-feeds). The outputs of the
accepted tokens must equal one dense dilated causal convolution over the
accepted stream from zero history.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import numpy as np
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.executor import kernels, reference
from stepplan.planner import PlannerConfig, StepBatch, compile_plan


@attrs.frozen
class Schedule:
    """Sizes of one random schedule."""

    seed: int
    channels: int
    taps: int
    dilation: int
    q_max: int
    num_requests: int
    max_len: int
    graph_mode: str = "none"
    window_contiguous: bool = False


@attrs.define
class Progress:
    """One request's place in its stream; ``accepted`` is its last step's accepted count."""

    pos: int = 0
    accepted: int = 1


def dense_outputs(stream: torch.Tensor, weight: torch.Tensor, dilation: int) -> torch.Tensor:
    """``[n, C]`` fp64: silu of the causal dilated depthwise conv over ``stream`` ``[n, C]``."""
    reach = (weight.shape[1] - 1) * dilation
    padded = F.pad(stream.double().T[None], (reach, 0))
    kernel = weight.double()[:, None, :]
    return F.silu(F.conv1d(padded, kernel, dilation=dilation, groups=stream.shape[1]))[0].T


def choose_query(rng: np.random.Generator, p: Progress, left: int, q_max: int) -> tuple[int, int]:
    """``(query length, drafts or -1)`` for one request that has ``left`` tokens to go."""
    spec_ok = p.pos > 0  # a spec row always reads state: never a request's first step
    if p.accepted > 1 or (spec_ok and rng.random() < 0.4):
        # The state offset is not 0: only a spec row (perhaps 0 drafts) can continue.
        drafts = int(rng.integers(0, q_max))
        return drafts + 1, drafts
    if left >= 2 and rng.random() < 0.5:
        return int(rng.integers(2, min(left, 12) + 1)), -1
    return 1, -1


def run_schedule(schedule: Schedule, layer: Callable, device: str = "cpu") -> None:
    """Drive ``layer`` (a ``short_conv``) through a random schedule; assert the invariant."""
    rng = np.random.default_rng(schedule.seed)
    channels, q_max = schedule.channels, schedule.q_max
    gen = torch.Generator().manual_seed(schedule.seed)
    lengths = rng.integers(1, schedule.max_len + 1, schedule.num_requests)
    streams = [torch.randn(int(n), channels, generator=gen) for n in lengths]
    weight = torch.randn(channels, schedule.taps, generator=gen) / schedule.taps**0.5
    reach = (schedule.taps - 1) * schedule.dilation
    shape = (schedule.num_requests + 1, reach + q_max - 1, channels)
    state = torch.full(shape, torch.nan, device=device)  # [slot, window, channel] memory
    state = state.transpose(1, 2)
    if schedule.window_contiguous:
        state = state.contiguous()
    config = PlannerConfig(
        num_spec_tokens=q_max - 1,
        graph_mode=schedule.graph_mode,
        max_num_seqs=schedule.num_requests + 2,
        prefill_tile_tokens=max(8, 1 << max(reach - 1, 0).bit_length()),
    )
    outputs = [torch.full_like(s, torch.nan, dtype=torch.float64) for s in streams]
    progress = [Progress() for _ in streams]
    weight_dev = weight.to(device)
    while any(p.pos < len(s) for p, s in zip(progress, streams, strict=True)):
        step = _step(rng, progress, streams, q_max, channels, gen)
        batch = StepBatch(
            query_lens=step["lens"],
            num_computed_tokens=step["computed"],
            slots=step["slots"],
            num_draft_tokens=step["drafts"],
            num_accepted_tokens=step["accepted"],
        )
        plan = compile_plan(batch, config)
        x = torch.cat(step["queries"]).to(device)
        residual = torch.zeros_like(x)
        layer(plan, x, residual, state, weight_dev, dilation=schedule.dilation)
        _collect(step, residual.cpu(), outputs, progress)
    for stream, got in zip(streams, outputs, strict=True):
        want = dense_outputs(stream, weight, schedule.dilation)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _step(rng, progress, streams, q_max, channels, gen) -> dict:
    """One step's rows in a random engine order, with padding rows between."""
    live = [i for i, (p, s) in enumerate(zip(progress, streams, strict=True)) if p.pos < len(s)]
    chosen = [i for i in live if rng.random() < 0.7] or [live[0]]
    rng.shuffle(chosen)
    step = {k: [] for k in ("lens", "computed", "slots", "drafts", "accepted", "queries", "rows")}
    for request in [*chosen, None] if rng.random() < 0.3 else chosen:
        if request is None:  # a padding row, as an engine adds for graph sizes
            _add_row(step, None, 0, 0, 0, -1, 1, torch.zeros(0, channels), 0)
            continue
        p, stream = progress[request], streams[request]
        left = len(stream) - p.pos
        q, drafts = choose_query(rng, p, left, q_max)
        accept = int(rng.integers(1, min(q, left) + 1)) if drafts >= 0 else min(q, left)
        rejected = torch.randn(q - accept, channels, generator=gen) + 5.0  # wrong drafts
        query = torch.cat([stream[p.pos : p.pos + accept], rejected])
        _add_row(step, request, q, p.pos, request + 1, drafts, p.accepted, query, accept)
    return step


def _add_row(step, request, q, computed, slot, drafts, accepted, query, keep) -> None:
    step["lens"].append(q)
    step["computed"].append(computed)
    step["slots"].append(slot)
    step["drafts"].append(drafts)
    step["accepted"].append(accepted)
    step["queries"].append(query)
    step["rows"].append((request, keep))


def _collect(step: dict, residual: torch.Tensor, outputs: list, progress: list) -> None:
    """Keep the outputs of accepted tokens; advance each request past them."""
    start = 0
    for (request, keep), q, drafts in zip(step["rows"], step["lens"], step["drafts"], strict=True):
        if request is not None:
            p = progress[request]
            outputs[request][p.pos : p.pos + keep] = residual[start : start + keep].double()
            p.pos += keep
            p.accepted = keep if drafts >= 0 else 1
        start += q


def schedules(max_requests: int, max_len: int, channels: tuple[int, int]) -> st.SearchStrategy:
    return st.builds(
        Schedule,
        seed=st.integers(0, 2**32 - 1),
        channels=st.integers(*channels),
        taps=st.integers(2, 8),
        dilation=st.integers(1, 8),
        q_max=st.integers(1, 6),
        num_requests=st.integers(2, max_requests),  # bounds, not sizes: the rng picks lengths
        max_len=st.integers(max_len // 3, max_len),
        graph_mode=st.sampled_from(["none", "full", "mixed"]),
        window_contiguous=st.booleans(),
    )


@settings(max_examples=60, deadline=None)
@given(schedules(max_requests=6, max_len=100, channels=(3, 12)))
def test_reference_keeps_the_master_invariant(schedule):
    run_schedule(schedule, reference.short_conv)


@settings(max_examples=15, deadline=None)
@given(schedules(max_requests=3, max_len=30, channels=(3, 9)))
def test_kernels_keep_the_master_invariant(schedule):
    run_schedule(schedule, kernels.short_conv)
