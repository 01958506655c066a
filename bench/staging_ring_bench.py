"""The staging ring's claim order, old against new in one process: host µs per build.

``old``: entries in turn (``StagingRing.claim`` before 2026-12-04, reproduced here on the
ring of one share); ``new``: the shipped ``claim`` (entry 0 or 1 when free, else the
entry after the last one handed out). Per batch of ``vllm_builder_bench.BATCHES``, one
case per order, the rounds interleaved so both orders see the same host phase; per round
the p50 of group 0's build in the builder bench's ``idle`` and ``busy`` modes (its own
sample functions). The lent hosts have slow phases; the ratio per round is the figure
to read.

    python3 bench/staging_ring_bench.py [--rounds 10] [--builds 120]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from bench_record import record_run
from vllm_builder_bench import BATCHES, SPEC_TOKENS, Case, busy_samples, host_speed, idle_samples

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--builds", type=int, default=120, help="builds per mode and round")
    args = parser.parse_args()
    config = PlannerConfig(num_spec_tokens=SPEC_TOKENS, graph_mode="full")
    cases = {}
    for seed, name in enumerate(NAMES):
        for order in ("old", "new"):
            case = cases[name, order] = Case(config, "cuda", BATCHES[name], seed, False, False)
            if order == "old":
                claim_in_turn(case.share.buffer._ring)
    found: dict[tuple, list[float]] = {}
    speeds = []
    for _ in range(args.rounds + 1):  # round 0 compiles and captures: dropped
        speeds.append(host_speed())
        for (name, order), case in cases.items():
            for mode, run in (("idle", idle_samples), ("busy", busy_samples)):
                samples = run(case.builders, case.engine, case.steps(args.builds), 1)
                found.setdefault((name, order, mode), []).append(statistics.median(samples))
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("host speed per round (fixed loop p50 µs):", " ".join(f"{s:.2f}" for s in speeds[1:]))
    print(f"{'batch':<18}{'mode':<6}{'old':>8}{'new':>8}{'new/old':>9}")
    print("(p50 µs over the rounds; new/old: the median of the per-round ratios)")
    figures: dict = {"host_speed_p50_us": speeds[1:]}
    for name in NAMES:
        for mode in ("idle", "busy"):
            old, new = found[name, "old", mode][1:], found[name, "new", mode][1:]
            ratio = statistics.median(b / a for a, b in zip(old, new, strict=True))
            print(
                f"{name:<18}{mode:<6}{statistics.median(old):8.1f}"
                f"{statistics.median(new):8.1f}{ratio:9.3f}"
            )
            figures[f"{name} {mode}".replace(" ", "_")] = {
                "old_p50_us": statistics.median(old),
                "new_p50_us": statistics.median(new),
                "new_over_old": ratio,
            }
    record_run("staging_ring_bench", figures, rounds=args.rounds, builds=args.builds)


if __name__ == "__main__":
    main()
