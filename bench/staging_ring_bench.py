"""The staging ring's claim order, old against new in one process: host µs per build.

``old``: entries in turn (``StagingRing.claim`` before 2026-12-04, reproduced here on the
ring of one share); ``new``: entry 0 or 1 when free, else the entry after the last one
handed out (the shipped ``claim``). Per batch of ``vllm_builder_bench.BATCHES``, one
share per order, the rounds interleaved so both orders see the same host phase; per
round the p50 of group 0's build, ``idle`` (the GPU idle before each step) and ``busy``
(24 steps queued behind a long kernel, as the builder bench's busy mode). The lent hosts
have slow phases; the ratio per round is the figure to read.

    python3 bench/staging_ring_bench.py [--rounds 10] [--steps 120]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from runtime_bench import fixed_work
from vllm_builder_bench import BATCHES, GROUPS, Engine, batch_steps, build_all, spin

from stepplan.executor.vllm import PlanMetadataBuilder, StepShare
from stepplan.planner import PlannerConfig

NAMES = ("mixed 256", "mixed 64", "spec 256 varied", "spec 256 x 4")


def claim_in_turn(ring) -> None:
    """Give ``ring`` the old claim: the next entry in turn, waited for if in use."""
    turn = [0]

    def claim() -> int:
        index = turn[0]
        if ring._done[index] != ring._issued[index]:
            ring._wait_for_ticket(index)
        turn[0] = (index + 1) % ring.ring_size
        return index

    ring.claim = claim


def make_case(name: str, order: str, steps: int):
    spec, decode, prefills, fixed, _ = BATCHES[name]
    rng = np.random.default_rng(1)
    config = PlannerConfig(num_spec_tokens=3, graph_mode="full")
    share = StepShare(config, "cuda", num_groups=GROUPS)
    if order == "old":
        claim_in_turn(share.buffer._ring)
    builders = [PlanMetadataBuilder(config, "cuda", share=share, group=g) for g in range(GROUPS)]
    engine = Engine("cuda", spec + decode + len(prefills), rng)
    prepared = [engine.step(s) for s in batch_steps(rng, spec, decode, prefills, fixed, 2 * steps)]
    return builders, prepared


def one_round(builders, prepared, steps: int) -> tuple[float, float]:
    """p50 µs of group 0's build: idle, then busy."""
    idle, busy = [], []
    for metadata, kwargs in prepared[:steps]:
        torch.cuda.synchronize()
        spin(100)
        start = time.perf_counter_ns()
        builders[0].build(0, metadata[0], **kwargs)
        idle.append(time.perf_counter_ns() - start)
        build_all(builders[1:], metadata[1:], kwargs)
    for first in range(steps, 2 * steps, 24):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(2e7))
        for metadata, kwargs in prepared[first : first + 24]:
            spin(20)
            start = time.perf_counter_ns()
            builders[0].build(0, metadata[0], **kwargs)
            busy.append(time.perf_counter_ns() - start)
            build_all(builders[1:], metadata[1:], kwargs)
    torch.cuda.synchronize()
    return statistics.median(idle[10:]) / 1e3, statistics.median(busy) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=120)
    args = parser.parse_args()
    cases = {(n, o): make_case(n, o, args.steps) for n in NAMES for o in ("old", "new")}
    found: dict[tuple, list[float]] = {}
    speeds = []
    for _ in range(args.rounds):
        speeds.append(statistics.median(fixed_work() for _ in range(300)))
        for (name, order), (builders, prepared) in cases.items():
            idle, busy = one_round(builders, prepared, args.steps)
            found.setdefault((name, order, "idle"), []).append(idle)
            found.setdefault((name, order, "busy"), []).append(busy)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("host speed per round (fixed loop p50 µs):", " ".join(f"{s:.2f}" for s in speeds))
    print(f"{'batch':<18}{'mode':<6}{'old':>8}{'new':>8}{'new/old':>9}")
    print("(p50 µs over the rounds; new/old: the median of the per-round ratios)")
    for name in NAMES:
        for mode in ("idle", "busy"):
            old, new = found[(name, "old", mode)], found[(name, "new", mode)]
            ratio = statistics.median(b / a for a, b in zip(old, new, strict=True))
            print(
                f"{name:<18}{mode:<6}{statistics.median(old):8.1f}"
                f"{statistics.median(new):8.1f}{ratio:9.3f}"
            )


if __name__ == "__main__":
    main()
