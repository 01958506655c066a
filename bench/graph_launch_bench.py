"""Graph-launch benchmark (CUDA GPU): the host's cost of one ``CUDAGraph.replay()`` by head.

A graph step's host cost is mostly the graph launch, which grows with the nodes the
graph holds. This times (median of ``--reps``, each launch started with the GPU idle)
graphs of 32 tiny kernels, or 32 forks of two kernels onto a side stream and back (a
mixed step's layers), headed by each way of bringing the plan in:

- nothing;
- one host→device copy node (the plan);
- a copy node each way (the plan in, a ticket back: the staging ring's first design);
- one kernel that pulls plan and ticket and stores the ticket back
  (``stepplan.executor.staging_kernel.pull_plan``, what the executor captures now).

Run: ``python3 bench/graph_launch_bench.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from bench_record import record_run

from stepplan.executor.staging_kernel import pull_plan

LAYERS, WORDS = 32, 4000


class Buffers:
    """A tiny activation, a device plan buffer and pinned host entry and ticket words."""

    def __init__(self) -> None:
        self.activation = torch.zeros(1024, device="cuda")
        self.plan = torch.zeros(WORDS + 1, dtype=torch.int32, device="cuda")
        self.entry = torch.zeros(WORDS + 1, dtype=torch.int32, pin_memory=True)
        self.done = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        self.side = torch.cuda.Stream()


def head(buffers: Buffers, kind: str) -> None:
    if kind == "copy in":
        buffers.plan.copy_(buffers.entry, non_blocking=True)
    elif kind == "copy in + back":
        buffers.plan.copy_(buffers.entry, non_blocking=True)
        buffers.done.copy_(buffers.plan[WORDS:], non_blocking=True)
    elif kind == "pull kernel":
        pull_plan(buffers.entry, buffers.plan, buffers.done)


def layers(buffers: Buffers, forked: bool) -> None:
    for _ in range(LAYERS):
        if not forked:
            buffers.activation.add_(1)
            continue
        main = torch.cuda.current_stream()
        buffers.side.wait_stream(main)
        with torch.cuda.stream(buffers.side):
            buffers.activation.add_(1)
        buffers.activation.mul_(1)
        main.wait_stream(buffers.side)


def capture(step: Callable[[], None]) -> torch.cuda.CUDAGraph:
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):  # compiles outside the capture
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def replay_us(graph: torch.cuda.CUDAGraph, reps: int) -> float:
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        graph.replay()
        samples.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    buffers = Buffers()
    graphs = {}
    for forked in (False, True):
        for kind in ("nothing", "copy in", "copy in + back", "pull kernel"):
            graphs[(kind, forked)] = capture(
                lambda k=kind, f=forked: (head(buffers, k), layers(buffers, f))
            )
    buffers.entry.copy_(torch.arange(WORDS + 1, dtype=torch.int32))
    graphs[("pull kernel", False)].replay()
    torch.cuda.synchronize()
    assert torch.equal(buffers.plan.cpu(), buffers.entry) and int(buffers.done) == WORDS
    print(f"{torch.cuda.get_device_name()}: host µs per replay (median of {args.reps})")
    print(f"{'head':<16} {'layers':<22} " + " ".join(f"round {r:<3}" for r in range(args.rounds)))
    times = {
        key: [replay_us(g, args.reps) for _ in range(args.rounds)] for key, g in graphs.items()
    }
    for (kind, forked), row in times.items():
        shape = f"{LAYERS} forks of 2 kernels" if forked else f"{LAYERS} kernels"
        print(f"{kind:<16} {shape:<22} " + " ".join(f"{t:>9.1f}" for t in row))
    figures = {
        f"{kind.replace(' ', '_')}{'_forked' if forked else ''}_replay_us": row
        for (kind, forked), row in times.items()
    }
    record_run("graph_launch_bench", figures, layers=LAYERS, reps=args.reps)


if __name__ == "__main__":
    main()
