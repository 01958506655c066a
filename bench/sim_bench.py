"""Simulator speed: the full Azure code trace (8,819 requests, 57 min) with Q = 4 and
the real planner compiling every step, on one core.

Prints wall time, steps, steps per second, simulated time over wall time, where the
wall time went (planner vs the rest), and a least-squares fit of the measured
planner time per step against live rows -- the numbers behind the cost model's
deterministic host term (``cost.host_base_us``, ``cost.host_per_row_us``).

    python bench/sim_bench.py [--trace PATH] [--num-spec-tokens 3] [--limit N]

Run it with one core (``taskset -c 0``) to match the target (<= 30 s).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from importlib import resources

import numpy as np

from stepplan.sim.config import SimConfig, with_settings
from stepplan.sim.run import prepare_requests, simulate
from stepplan.sim.traces import load_trace

AZURE_CODE = str(resources.files("stepplan.sim").joinpath("data/azure_llm_2023_code.csv"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=AZURE_CODE)
    parser.add_argument("--num-spec-tokens", type=int, default=3)
    parser.add_argument("--graph-mode", default="full")
    parser.add_argument("--limit", type=int)
    args = parser.parse_args()

    config = with_settings(
        SimConfig(),
        {
            "scheduler.num_spec_tokens": args.num_spec_tokens,
            "planner.graph_mode": args.graph_mode,
            "workload.limit": args.limit,
        },
    )
    load_start = time.perf_counter()
    requests = prepare_requests(load_trace(args.trace), config)
    load_s = time.perf_counter() - load_start
    start = time.perf_counter()
    result = simulate(requests, config)
    wall = time.perf_counter() - start
    report(args, requests.num_requests, load_s, wall, result)


def report(args: argparse.Namespace, num_requests: int, load_s: float, wall: float, result) -> None:
    steps, summary = result.steps, result.summary
    host = summary["measured"]["host"]  # the measured figures (measured.json in a folder)
    count = steps["step"].size
    plan_s = steps["plan_us"].sum() * 1e-6
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    slope, intercept = np.polyfit(steps["num_rows"], steps["plan_us"], 1)
    rows = [
        ("trace", f"{args.trace} ({num_requests:,} requests, loaded in {load_s:.2f} s)"),
        ("Q / graph mode", f"{args.num_spec_tokens + 1} / {args.graph_mode}"),
        ("host", f"{platform.processor() or platform.machine()}, {cores} core(s) allowed"),
        ("wall time s", f"{wall:.2f}"),
        ("steps", f"{count:,}"),
        ("steps / s", f"{count / wall:,.0f}"),
        ("wall us / step", f"{wall / count * 1e6:.1f}"),
        ("  planner us / step", f"{plan_s / count * 1e6:.1f} (StepBatch + compile_plan)"),
        ("  simulator us / step", f"{(wall - plan_s) / count * 1e6:.1f} (everything else)"),
        ("simulated s", f"{summary['duration_s']:.1f}"),
        ("simulated / wall", f"{summary['duration_s'] / wall:.0f}x"),
        (
            "plan us p50 / p90",
            f"{host['plan_us_p50']:.1f} / {host['plan_us_p90']:.1f}",
        ),
        ("plan us fit", f"{intercept:.1f} + {slope:.3f} * rows"),
        ("rows / step mean, max", f"{steps['num_rows'].mean():.1f}, {steps['num_rows'].max()}"),
    ]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label.ljust(width)}  {value}")


if __name__ == "__main__":
    main()
