"""Kernel benchmark (GPU): our Triton short conv against the copy ceiling and plain PyTorch.

Everything runs under CUDA-graph replay, timed with CUDA events (median of many
replays); each graph rotates through several input sets so the data is not
L2-resident, for at least 64 steps so that a replay's own start-up is not a step's.
For C = 8192 and 2048, K = 4, D = 3, Q = 4, bf16, state in both memory layouts, it
prints SPEC §4's rows plus a mixed step: µs, the byte floor
(x read, residual read + write, state read and written once, over the copy
ceiling), the share of the ceiling, the layout's cap on that share (the floor's bytes
over the 32-byte sectors they touch), the time of a plain copy of the floor's bytes
(what moving them costs at this size), and the vectorized-PyTorch time. Every kernel
variant of ``--variants`` (``kernels.VARIANTS``: the old ones kept) runs every row in
the same process, beside the others, so their shares of one measured ceiling compare;
``--buckets`` times each row again on its graph bucket's padded plan (what a CUDA-graph
step runs: the padding's cost shows as ``pad``). Writes a JSON profile
(``$OUT/kernel_profile.json`` when ``$OUT`` is set, else ``--profile-out``) for the
simulator's cost model (its rows: the default variant's).

``--with-runtime`` then runs ``bench/runtime_bench.py``'s GPU table (graph step against
eager step and the buckets' padding overhead, over 32 layers) for the same variants: a
kernel change is timed in the runtime in the same run.

    python bench/kernel_bench.py [--channels 8192 2048] [--sweep]
        [--variants program-per-tile looping-tiles]
        [--buckets] [--with-runtime] [--profile-out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable

import attrs
import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from bench_record import numbers_of, record_run

from stepplan.executor import kernels, reference
from stepplan.planner import (
    SPEC,
    ExecutionPlan,
    PlannerConfig,
    StepBatch,
    compile_plan,
    default_graph_sizes,
)

K, D, Q = 4, 3, 4
L = (K - 1) * D
W = L + Q - 1
DTYPE = torch.bfloat16
DEVICE = "cuda"
L2_BYTES = 60 << 20
#: name: (spec rows of Q tokens, decode rows, prefill lengths)
BATCHES = {
    "decode 1": (0, 1, []),
    "decode 256": (0, 256, []),
    "spec 1x4": (1, 0, []),
    "spec 64x4": (64, 0, []),
    "spec 256x4": (256, 0, []),
    "prefill 1x512": (0, 0, [512]),
    "prefill 4x4096": (0, 0, [4096] * 4),
    "mixed": (64, 64, [1024, 1024]),
}
#: vLLM's default memory order first; both are logical [slot, channel, window] views.
LAYOUTS = ("slot,window,channel", "slot,channel,window")
#: Plans without graphs (every grid holds live work alone), and ``--buckets``' plans:
#: vLLM's sizes plus powers of two up to the largest batch, so every row has a bucket.
EAGER_CONFIG = PlannerConfig(num_spec_tokens=Q - 1, graph_mode="none", max_num_seqs=512)
BUCKET_CONFIG = PlannerConfig(
    num_spec_tokens=Q - 1,
    graph_mode="mixed",
    graph_sizes=(*default_graph_sizes(512, Q - 1), 1024, 2048, 4096, 8192, 16384),
    max_num_seqs=512,
)


def batch_of(name: str, seed: int = 0) -> StepBatch:
    """Spec and decode rows continue from state (random accepted counts); prefills are new."""
    spec, decode, prefill = BATCHES[name]
    rows = spec + decode + len(prefill)
    rng = np.random.default_rng(seed)
    return StepBatch(
        query_lens=[Q] * spec + [1] * decode + prefill,
        num_computed_tokens=[100] * (spec + decode) + [0] * len(prefill),
        slots=rng.permutation(np.arange(1, rows + 1)),
        num_draft_tokens=[Q - 1] * spec + [-1] * (decode + len(prefill)),
        num_accepted_tokens=rng.integers(1, Q + 1, rows),
    )


def floor_bytes(plan: ExecutionPlan, channels: int) -> int:
    """SPEC §4's fewest bytes: x read, residual read + write, state read and written once."""
    entries = 3 * plan.num_tokens
    for row in range(plan.num_rows):
        read, written = state_entries(plan, row)
        entries += len(read) + len(written)
    return entries * channels * DTYPE.itemsize


def state_entries(plan: ExecutionPlan, row: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The window entries row ``row`` must read and write, as :func:`floor_bytes` counts them."""
    q = int(plan.row_query_start[row + 1] - plan.row_query_start[row])
    if not plan.row_slot[0, row]:
        return (), ()
    offset = int(plan.row_state_offset[row])
    read = tuple(range(offset, offset + L)) if plan.row_reads_state[row] else ()
    written = min(W, L + q - 1) if plan.row_kind[row] == SPEC else L
    return read, tuple(range(written))


def sector_bytes(plan: ExecutionPlan, channels: int, layout: str) -> int:
    """:func:`floor_bytes` in whole 32-byte sectors, DRAM's unit, for ``layout``'s memory.

    In vLLM's layout each entry is a plane of C contiguous values, so this equals the
    floor. Where windows are contiguous (W values of a channel side by side) a row's L
    entries of every channel leave no sector untouched, so reading or writing L of W
    entries moves all W: the floor over this is the best share the layout allows.
    """
    chan_stride, win_stride = (1, channels) if layout == LAYOUTS[0] else (W, 1)
    item = DTYPE.itemsize
    sectors: dict[tuple[int, ...], int] = {}

    def count(entries: tuple[int, ...]) -> int:
        if entries not in sectors:  # slots start on sector boundaries: counted once
            address = np.arange(channels)[:, None] * chan_stride + np.array(entries) * win_stride
            sectors[entries] = len(np.unique(address * item // 32)) * 32 if entries else 0
        return sectors[entries]

    total = 3 * plan.num_tokens * channels * item  # x read, residual read and written
    for row in range(plan.num_rows):
        read, written = state_entries(plan, row)
        total += count(read) + count(written)
    return total


@attrs.frozen
class Operands:
    """One input set on the device."""

    x: torch.Tensor
    residual: torch.Tensor
    state: torch.Tensor
    weight: torch.Tensor


def make_operands(plan: ExecutionPlan, channels: int, layout: str, gen: torch.Generator):
    tokens, slots = plan.num_tokens, plan.num_rows + 1
    x = torch.randn(tokens, channels, device=DEVICE, generator=gen).to(DTYPE)
    residual = torch.randn(tokens, channels, device=DEVICE, generator=gen).to(DTYPE)
    if layout == LAYOUTS[0]:
        state = torch.randn(slots, W, channels, device=DEVICE, generator=gen).to(DTYPE)
        state = state.transpose(1, 2)
    else:
        state = torch.randn(slots, channels, W, device=DEVICE, generator=gen).to(DTYPE)
    # Channel-contiguous taps, as the Executor keeps them: each tap loads as a vector.
    weight = (torch.randn(K, channels, device=DEVICE, generator=gen) / 2).to(DTYPE).t()
    return Operands(x, residual, state, weight)


def set_bytes(ops: Operands) -> int:
    return sum(t.numel() * t.element_size() for t in (ops.x, ops.residual, ops.state))


#: Fewest steps one timed graph holds. A replay costs about 6 µs outside its kernels
#: (H200: the host's graph launch, the first node's start, the last node's end; seen
#: as the gap between a replay's events and its programs' own clock stamps). Spread
#: over the 2-5 steps a graph of large batches held before, that was 1-2 µs a step;
#: over 64 steps it is under 1% of the shortest step.
GRAPH_STEPS = 64


def graph_us(
    step: Callable[[int], None], sets: int, reps: int, warmup: int = 3, steps: int = GRAPH_STEPS
) -> float:
    """Median µs of one ``step(i)`` inside a graph that runs ``step`` on every set in turn,
    as many passes over the sets as make at least ``steps`` steps (consecutive steps use
    different sets, so a set is cold again when its turn comes)."""
    passes = -(-steps // sets)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compiles) off the capture
        for i in range(sets):
            step(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(passes):
            for i in range(sets):
                step(i)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0 / (sets * passes))
    del graph
    return statistics.median(times)


def eager_us(step: Callable[[], None], reps: int) -> float:
    """Median µs of ``step`` launched eagerly, each call between two events."""
    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0)
    return statistics.median(times)


def copy_ceiling_tbs(reps: int) -> float:
    """Device-to-device copy bandwidth, bytes read + written, in TB/s: the best of a
    graph-captured memcpy, an elementwise copy kernel on the SMs, and an eager copy."""
    src = torch.randn(1 << 29, device=DEVICE).to(DTYPE)  # 1 GiB
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * src.element_size()
    ways = {
        # 8 copies of 1 GiB a replay: its own cost is then 0.1%; 320 copies warm the clocks
        "graph memcpy": graph_us(lambda _: dst.copy_(src), 1, reps, warmup=40, steps=8),
        "graph kernel": graph_us(lambda _: torch.mul(src, 1, out=dst), 1, reps, warmup=4, steps=8),
        "eager copy": eager_us(lambda: dst.copy_(src), reps),
    }
    shown = ", ".join(f"{way} {nbytes / us / 1e6:.2f}" for way, us in ways.items())
    print(f"copy TB/s: {shown}", flush=True)
    return nbytes / min(ways.values()) / 1e6


def same_bytes_copy_us(nbytes: int, reps: int, hot: bool = False) -> float:
    """µs of the best device copy that reads ``nbytes / 2`` and writes as many, timed like
    our kernels (graph replay through input sets past L2): what moving the floor's bytes
    costs at this size, start-up and tail included, with the simplest access pattern.
    The ways: a memcpy node, PyTorch's copy kernel, and (sm_90 on) a Triton copy
    launched as a programmatic dependent launch like our kernels (each replay's copy may
    start while the one before finishes). ``hot``: one buffer pair, copied again on every replay
    (as :func:`measure`'s ``hot``)."""
    half = max(1, nbytes // 2 // DTYPE.itemsize)
    count = 1 if hot else int(min(64, max(2, -(-4 * L2_BYTES // nbytes))))
    sources = [torch.empty(half, device=DEVICE, dtype=DTYPE).normal_() for _ in range(count)]
    targets = [torch.empty_like(source) for source in sources]
    grid = (triton.cdiv(half, COPY_BLOCK),)

    def dependent_copy(i: int) -> None:
        _copy[grid](sources[i], targets[i], half, BLOCK=COPY_BLOCK, num_warps=8, launch_pdl=True)

    ways = [
        lambda i: targets[i].copy_(sources[i]),  # a memcpy node
        lambda i: torch.mul(sources[i], 1, out=targets[i]),  # a kernel on the SMs
    ]
    if torch.cuda.get_device_capability()[0] >= 9:  # griddepcontrol needs sm_90
        ways.append(dependent_copy)
    return min(graph_us(way, count, reps) for way in ways)


#: Elements per program of :func:`_copy` (16 per thread at 8 warps: two 16-byte vectors).
COPY_BLOCK = 4096


@triton.jit
def _copy(source, target, count, BLOCK: tl.constexpr):
    """``target[:count] = source[:count]``, waiting first for the stream's previous kernel
    (a programmatic dependent launch), then letting the next start."""
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(target + at, tl.load(source + at, mask=at < count), mask=at < count)


class TorchBaseline:
    """SPEC §2 in vectorized PyTorch: gather every history, one reduction, scatter back.

    The gather indices come from the plan on the host, once; the step itself is
    graph-capturable (no host sync).
    """

    def __init__(self, plan: ExecutionPlan) -> None:
        out, hist, writes, sources = [], [], [], []
        for row in range(plan.num_rows):
            kind, slot = int(plan.row_kind[row]), int(plan.row_slot[0, row])
            if kind != SPEC and slot == 0:
                continue
            first = int(plan.row_token_start[row])
            q = int(plan.row_query_start[row + 1] - plan.row_query_start[row])
            reads = bool(plan.row_reads_state[row]) and slot != 0
            origin = (slot, int(plan.row_state_offset[row]), reads, first)
            out += range(first, first + q)
            hist += [[self._source(origin, j + k * D) for k in range(K)] for j in range(q)]
            if slot:
                count, start = (min(W, L + q - 1), 1) if kind == SPEC else (L, q)
                writes += [(slot, i) for i in range(count)]
                sources += [self._source(origin, start + i) for i in range(count)]
        self.out = torch.tensor(out, dtype=torch.int64, device=DEVICE)
        self.hist = torch.tensor(hist, dtype=torch.int64, device=DEVICE).reshape(-1, K, 4)
        self.writes = torch.tensor(writes, dtype=torch.int64, device=DEVICE).reshape(-1, 2)
        self.sources = torch.tensor(sources, dtype=torch.int64, device=DEVICE).reshape(-1, 4)

    @staticmethod
    def _source(origin: tuple[int, int, bool, int], pos: int) -> tuple[int, int, int, int]:
        """``(from_state, x row, slot, window entry)`` of history entry ``pos``; from_state 2:
        zeros in place of state."""
        slot, offset, reads, first = origin
        if pos < L:
            return (1 if reads else 2, 0, slot, offset + pos)
        return (0, first + pos - L, 0, 0)

    @staticmethod
    def _gather(src: torch.Tensor, ops: Operands) -> torch.Tensor:
        from_x = ops.x[src[..., 1]]
        from_state = ops.state[src[..., 2], :, src[..., 3]]
        h = torch.where((src[..., 0] == 0)[..., None], from_x, from_state)
        return h.masked_fill((src[..., 0] == 2)[..., None], 0)

    def __call__(self, ops: Operands) -> None:
        h = self._gather(self.hist, ops)  # [N, K, C]
        acc = torch.einsum("nkc,ck->nc", h.float(), ops.weight.float())
        ops.residual.index_add_(0, self.out, F.silu(acc.to(DTYPE)))
        new = self._gather(self.sources, ops)  # every read happens before the write
        ops.state[self.writes[:, 0], :, self.writes[:, 1]] = new


def check(plan: ExecutionPlan, ops: Operands, step: Callable[[Operands], None]) -> None:
    """``step`` against the reference on copies of one input set."""
    got = attrs.evolve(ops, residual=ops.residual.clone(), state=ops.state.clone())
    want = attrs.evolve(ops, residual=ops.residual.clone(), state=ops.state.clone())
    step(got)
    reference.short_conv(plan, want.x, want.residual, want.state, want.weight, dilation=D)
    torch.testing.assert_close(got.residual, want.residual, rtol=2e-2, atol=6e-2)
    assert torch.equal(got.state, want.state), "state differs from the reference"


def measure(
    name: str,
    channels: int,
    layout: str,
    *,
    blocks: kernels.Blocks | None = None,
    reps: int = 40,
    with_torch: bool = True,
    with_copy: bool = True,
    hot: bool = False,
    side_stream: torch.cuda.Stream | None = None,
    bucket: bool = False,
) -> dict:
    """One row of the table: our kernels (and PyTorch) on batch ``name``, checked first.

    ``hot``: one input set, replayed again and again, so whatever of it fits in L2 stays
    there (as when a benchmark replays one graph on the same tensors): not our
    measure, but comparable with measurements made that way. ``bucket``: the batch's plan
    padded to its graph bucket (:data:`BUCKET_CONFIG`), as a graph step runs it.
    """
    plan = compile_plan(batch_of(name), BUCKET_CONFIG if bucket else EAGER_CONFIG)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    first = make_operands(plan, channels, layout, gen)
    count = 1 if hot else int(min(128, max(2, -(-4 * L2_BYTES // set_bytes(first)))))
    sets = [first] + [make_operands(plan, channels, layout, gen) for _ in range(count - 1)]
    shape = kernels.launch_shape(plan)
    plan_buffer = torch.from_numpy(np.array(plan.packed)).to(DEVICE)

    def ours(ops: Operands) -> None:
        kernels.launch_short_conv(
            shape,
            plan_buffer,
            ops.x,
            ops.residual,
            ops.state,
            ops.weight,
            dilation=D,
            group=0,
            blocks=blocks,
            side_stream=side_stream,
        )

    check(plan, first, ours)
    us = graph_us(lambda i: ours(sets[i]), count, reps)
    torch_us = None
    if with_torch:
        baseline = TorchBaseline(plan)
        check(plan, first, baseline)
        # Steps of 55 µs to 21 ms: a replay's start-up is lost in them, and one pass over the
        # sets keeps the gathers' temporaries to a few steps' worth.
        torch_us = graph_us(lambda i: baseline(sets[i]), min(count, 8), max(5, reps // 4), steps=1)
    floor = floor_bytes(plan, channels)
    return dict(
        batch=name,
        requests=plan.num_rows,
        tokens=plan.num_tokens,
        layout=layout,
        C=channels,
        graph=str(plan.graph) if plan.graph else "eager",
        us=us,
        floor_bytes=floor,
        sector_bytes=sector_bytes(plan, channels, layout),
        copy_us=same_bytes_copy_us(floor, reps, hot) if with_copy else None,
        torch_us=torch_us,
    )


#: (channels, warps, channels first, the layout's own window store: a tile where windows
#: are contiguous, entry by entry where channels are) of the row launch.
ROW_VARIANTS = (
    (64, 1, False, True),
    (64, 1, True, True),
    (64, 2, False, True),
    (128, 1, False, True),
    (128, 2, False, True),
    (128, 4, False, True),
    (256, 4, False, True),
    (256, 4, True, True),
    (256, 8, False, True),
)
#: (channels, warps, tokens per program, channels first) of the tile launch.
TILE_VARIANTS = (
    (128, 2, 16, True),
    (128, 1, 8, True),
    (128, 1, 16, True),
    (256, 2, 16, True),
)


#: Per layout, (channels, warps, programs per multiprocessor, next row loaded early) of the
#: persistent row launch (``kernels.VARIANTS``' ``persistent``) around its defaults.
PERSISTENT_VARIANTS = {
    LAYOUTS[0]: (
        (128, 2, 8, True),
        (128, 2, 16, True),
        (128, 2, 32, True),
        (256, 4, 16, True),
        (128, 2, 16, False),
    ),
    LAYOUTS[1]: (
        (64, 1, 16, True),
        (64, 1, 32, True),
        (128, 2, 16, True),
        (64, 1, 16, False),
    ),
}
#: Tiles per multiprocessor of a graph bucket's looping tile launch (``looping-tiles`` on), swept on
#: the bucket plans of the batches a bucket pads.
GRAPH_TILE_VARIANTS = dict.fromkeys(LAYOUTS, ((6,), (12,), (24,), (48,), (96,)))


@attrs.frozen
class Sweep:
    """One launch's block variants per layout, tried on top of a named variant's blocks
    (of the batches with prefills or without; ``bucket``: on their graph bucket's plans,
    the batches a bucket pads only)."""

    prefill: bool
    variants: dict[str, tuple[tuple, ...]]
    base: str
    bucket: bool = False


#: What ``--sweep`` times, by name.
SWEEPS = {
    "rows": (Sweep(False, dict.fromkeys(LAYOUTS, ROW_VARIANTS), "program-per-tile"),),
    "tiles": (Sweep(True, dict.fromkeys(LAYOUTS, TILE_VARIANTS), "program-per-tile"),),
    "both": (
        Sweep(False, dict.fromkeys(LAYOUTS, ROW_VARIANTS), "program-per-tile"),
        Sweep(True, dict.fromkeys(LAYOUTS, TILE_VARIANTS), "program-per-tile"),
    ),
    "persistent": (Sweep(False, PERSISTENT_VARIANTS, "persistent"),),
    "graph-tiles": (Sweep(True, GRAPH_TILE_VARIANTS, "looping-tiles", bucket=True),),
}


def sweep(
    channels: int,
    ceiling: float,
    launches: str,
    layouts: tuple[str, ...] = LAYOUTS,
    batches: tuple[str, ...] = tuple(BATCHES),
    reps: int = 15,
    start: dict[str, kernels.Blocks] | None = None,
) -> dict[str, kernels.Blocks]:
    """Time block-size variants per layout (no PyTorch); return the best blocks per layout.

    Best: the highest geometric-mean share over the batches of many requests each launch
    serves (of ``batches``). ``start``: the blocks to vary per layout (else each sweep's
    base variant's).
    """
    print(f"\nsweep {launches} at C={channels}: us (share of ceiling) per variant", flush=True)
    chosen = {}
    for layout in layouts:
        blocks = (start or {}).get(layout)
        for launch in SWEEPS[launches]:
            blocks = blocks or kernels.default_blocks(channels, layout != LAYOUTS[0], launch.base)
            names = _sweep_batches(launch, batches)
            scores = {}
            for variant in launch.variants[layout]:
                trial = _with_variant(blocks, launch.prefill, variant)
                cells, times = [], []
                for name in names:
                    row = measure(
                        name, channels, layout, blocks=trial, reps=reps, with_torch=False,
                        with_copy=False, bucket=launch.bucket,
                    )  # fmt: skip
                    cells.append(row["floor_bytes"] / (ceiling * 1e6) / row["us"])
                    times.append(row["us"])
                # Scored on the batches of many requests: one-request steps are latency.
                large = [c for n, c in zip(names, cells, strict=True) if _requests(n) > 1]
                scores[variant] = float(np.exp(np.mean(np.log(large or cells))))
                shown = "  ".join(
                    f"{n}: {t:.1f} us {c:.0%}" for n, t, c in zip(names, times, cells, strict=True)
                )
                print(f"  {layout:<20} {'/'.join(map(str, variant)):<20} {shown}", flush=True)
            if scores:
                blocks = _with_variant(blocks, launch.prefill, max(scores, key=scores.get))
        chosen[layout] = blocks
        print(f"  {layout}: chose {blocks}", flush=True)
    return chosen


def _sweep_batches(launch: Sweep, batches: tuple[str, ...]) -> list[str]:
    """The batches a sweep times: those its bucket pads, or those of its launch alone."""
    if launch.bucket:
        return [name for name in batches if padded_grids(name)]
    return [n for n in batches if n != "mixed" and n.startswith("prefill") == launch.prefill]


def _requests(name: str) -> int:
    spec, decode, prefill = BATCHES[name]
    return spec + decode + len(prefill)


def _with_variant(blocks: kernels.Blocks, prefill: bool, variant: tuple) -> kernels.Blocks:
    if len(variant) == 1:  # a graph bucket's looping tiles
        return attrs.evolve(blocks, tiles_resident=variant[0])
    if blocks.rows_resident and not prefill:  # a persistent row launch
        channels, warps, resident, prefetch = variant
        return attrs.evolve(
            blocks,
            rows_channels=channels,
            rows_warps=warps,
            rows_resident=resident,
            rows_prefetch=prefetch,
        )
    if prefill:
        channels, warps, tokens, first = variant
        return attrs.evolve(
            blocks,
            tiles_channels=channels,
            tiles_warps=warps,
            tiles_tokens=tokens,
            tiles_channels_first=first,
        )
    channels, warps, first, own_store = variant
    window_tile = blocks.rows_window_tile == own_store  # defaults hold each layout's own
    return attrs.evolve(
        blocks,
        rows_channels=channels,
        rows_warps=warps,
        rows_channels_first=first,
        rows_window_tile=window_tile,
    )


def table(rows: list[dict], ceiling: float) -> str:
    head = (
        f"{'C':>5} {'state memory':<20} {'batch':<15} {'variant':<10} {'reqs':>4} {'tokens':>6} "
        f"{'us':>8} {'floor us':>8} {'share':>6} {'cap':>5} {'copy us':>8} {'vs copy':>7} "
        f"{'bucket us':>9} {'pad':>6} {'torch us':>9} {'torch':>6}"
    )
    lines = [head, "-" * len(head)]
    for row in rows:
        torch_us, copy_us, bucket_us = row["torch_us"], row["copy_us"], row.get("bucket_us")
        torch_cells = f"{torch_us:>9.1f} {row['floor_us'] / torch_us:>6.0%}" if torch_us else ""
        copy_cells = f"{copy_us:>8.1f} {copy_us / row['us']:>7.0%}" if copy_us else " " * 16
        bucket_cells = (
            f"{bucket_us:>9.1f} {bucket_us / row['us'] - 1:>6.1%}" if bucket_us else " " * 16
        )
        lines.append(
            f"{row['C']:>5} {row['layout']:<20} {row['batch']:<15} {row['variant']:<10} "
            f"{row['requests']:>4} {row['tokens']:>6} {row['us']:>8.1f} {row['floor_us']:>8.2f} "
            f"{row['share']:>6.0%} {row['floor_bytes'] / row['sector_bytes']:>5.0%} "
            f"{copy_cells} {bucket_cells} {torch_cells}"
        )
    lines.append(
        f"copy ceiling {ceiling:.2f} TB/s; share = floor us / us; cap = floor bytes over the "
        "32-byte sectors they touch in this layout (the best share it allows); copy us = a "
        "plain copy of the floor's bytes, vs copy = copy us / us; bucket us = the same batch "
        "on its graph bucket's padded plan, pad = bucket us / us - 1"
    )
    return "\n".join(lines)


def cost_model_view(rows: list[dict]) -> dict:
    """The rows at the first C, vLLM's state layout, in ``stepplan.sim.timing.cost``'s format."""
    channels, variant = rows[0]["C"], rows[0]["variant"]
    entries = []
    for row in rows:
        if row["C"] == channels and row["layout"] == LAYOUTS[0] and row["variant"] == variant:
            kind = row["batch"].split()[0]
            entry = dict(kind=kind, rows=row["requests"], tokens=row["tokens"], us=row["us"])
            if kind == "mixed":  # the cost model prices mixed steps by their total bytes
                entry["bytes"] = row["floor_bytes"]
            entries.append(entry)
    return dict(
        source="bench/kernel_bench.py: stepplan's Triton kernels under CUDA-graph replay",
        kernel=f"stepplan's launch A + launch B (kernel variant {variant}), "
        "[slot, window, channel] state",
        geometry=dict(channels=channels, kernel_size=K, dilation=D, dtype_bytes=DTYPE.itemsize),
        entries=entries,
    )


def write_json(path: str, data: dict) -> None:
    """Atomically: a temporary file beside ``path``, then a rename."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as f:
        json.dump(data, f, indent=1)
    os.replace(f.name, path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--channels", type=int, nargs="+", default=[8192, 2048])
    parser.add_argument("--batches", nargs="+", default=list(BATCHES), choices=list(BATCHES))
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument(
        "--sweep",
        nargs="*",
        choices=tuple(SWEEPS),
        help="time block-size variants of these launches first, in turn, each on the last's "
        "pick (alone: both; the pick: variant 'swept')",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=[
            kernels.DEFAULT_VARIANT,
            *(v for v in kernels.VARIANTS if v != kernels.DEFAULT_VARIANT),
        ],
        choices=list(kernels.VARIANTS),
        help="kernel variants timed side by side on every row (the first: the profile's)",
    )
    parser.add_argument(
        "--buckets", action="store_true", help="time each row on its graph bucket's plan too"
    )
    parser.add_argument(
        "--with-runtime",
        action="store_true",
        help="then runtime_bench.py's GPU table (graph vs eager, padding) for these variants",
    )
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch baseline")
    parser.add_argument(
        "--serial",
        action="store_true",
        help="mixed steps: both launches on one stream (default: rows on a side stream)",
    )
    parser.add_argument(
        "--hot",
        action="store_true",
        help="one input set replayed again and again, partly L2-resident (default: sets past L2)",
    )
    parser.add_argument(
        "--profile-out", help="JSON profile path (default $OUT/kernel_profile.json)"
    )
    return parser.parse_args(argv)


def padded_grids(name: str) -> bool:
    """Whether batch ``name``'s bucket launches more programs than its eager plan (else
    ``--buckets`` would time the same launches twice)."""
    padded, plain = (compile_plan(batch_of(name), c) for c in (BUCKET_CONFIG, EAGER_CONFIG))
    return padded.launch_grids != plain.launch_grids


def measure_variants(
    args: argparse.Namespace,
    channels: int,
    layout: str,
    name: str,
    variants: dict[str, kernels.Blocks],
    ceiling: float,
) -> list[dict]:
    """Batch ``name`` under every variant in turn; the copy and PyTorch baselines, which no
    variant changes, timed once. Each row's line shows its share of ``ceiling`` (the first
    measurement of the run; the table uses the better of two)."""
    rows = []
    for number, (variant, blocks) in enumerate(variants.items()):
        common = dict(
            blocks=blocks,
            reps=args.reps,
            hot=args.hot,
            side_stream=None if args.serial else torch.cuda.Stream(),
        )
        row = measure(
            name, channels, layout, with_torch=not args.no_torch and not number,
            with_copy=not number, **common,
        )  # fmt: skip
        if number:
            row["copy_us"], row["torch_us"] = rows[0]["copy_us"], rows[0]["torch_us"]
        row["variant"] = variant
        if args.buckets and padded_grids(name):
            padded = measure(name, channels, layout, with_torch=False, with_copy=False,
                             bucket=True, **common)  # fmt: skip
            row["bucket_us"], row["bucket_graph"] = padded["us"], padded["graph"]
        rows.append(row)
        share = row["floor_bytes"] / (ceiling * 1e6) / row["us"]
        shown = f", bucket {row['bucket_us']:.1f} us" if "bucket_us" in row else ""
        print(
            f"  {channels} {layout} {name} {variant}: {row['us']:.1f} us ({share:.1%}){shown}",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.profile_out or (
        os.environ.get("OUT") and os.path.join(os.environ["OUT"], "kernel_profile.json")
    )
    if not torch.cuda.is_available():
        print("kernel_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    ceiling = copy_ceiling_tbs(args.reps)
    print(f"{device}: copy ceiling {ceiling:.2f} TB/s", flush=True)
    layouts = tuple(args.layouts)
    chosen: dict[str, kernels.Blocks] = {}
    for launches in args.sweep or ([] if args.sweep is None else ["both"]):
        chosen = sweep(
            args.channels[0], ceiling, launches, layouts, tuple(args.batches), args.reps, chosen
        )
    rows = []
    for channels in args.channels:
        for layout in layouts:
            variants = {
                v: kernels.default_blocks(channels, layout != LAYOUTS[0], v) for v in args.variants
            }
            if layout in chosen and channels == args.channels[0]:
                variants["swept"] = chosen[layout]
            for name in args.batches:
                rows += measure_variants(args, channels, layout, name, variants, ceiling)
    ceiling = max(ceiling, copy_ceiling_tbs(args.reps))  # again, the clocks now warm
    for row in rows:
        row["floor_us"] = row["floor_bytes"] / (ceiling * 1e6)
        row["share"] = row["floor_us"] / row["us"]
    profile = dict(
        device=device,
        dtype=str(DTYPE).removeprefix("torch."),
        C=args.channels,
        K=K,
        D=D,
        Q=Q,
        copy_ceiling_tbs=ceiling,
        blocks={layout: attrs.asdict(blocks) for layout, blocks in chosen.items()},
        variants={
            v: attrs.asdict(kernels.default_blocks(args.channels[0], False, v))
            for v in args.variants
        },
        rows=rows,
        **cost_model_view(rows),
    )
    if out:
        write_json(out, profile)
        print(f"profile written to {out}")
    print()
    print(table(rows, ceiling))
    figures = {"copy_ceiling_tb_per_s": ceiling} | {
        f"{row['C']}_{row['layout']}_{row['batch']}_{row['variant']}".replace(" ", "_"): numbers_of(
            row
        )
        for row in rows
    }
    record_run("kernel_bench", figures, machine=device)
    if args.with_runtime:
        run_runtime_bench(args)
    return 0


def run_runtime_bench(args: argparse.Namespace) -> None:
    """``bench/runtime_bench.py --gpu-only`` for the same variants, in this process."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import runtime_bench

    print(flush=True)
    runtime_bench.main(
        ["--gpu-only", "--channels", str(args.channels[0]), "--variants", *args.variants]
    )


if __name__ == "__main__":
    sys.exit(main())
