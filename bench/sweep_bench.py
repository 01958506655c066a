"""Sweep speed: a 16-point sweep of the whole bundled Azure code trace (8,819 requests),
against one point, in one run.

Times one point in this process (the default settings), the 16 points one after the
other in this process, ``stepplan sweep --workers N`` over them (the whole command:
reading the sweep, checking every point, the workers' start, the records, the table
and the figure) and, with Ray installed, ``stepplan sweep --ray`` (a local Ray started
by the command, and once more on a Ray already running). The grid is
``scheduler.max_num_seqs`` x ``seed``: points of about one point's cost, so that
``16 x one point / workers`` is the ideal a sweep is held to (target: within 1.2x).

    python bench/sweep_bench.py [--workers 2] [--limit N] [--no-ray] [--no-serial]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import tempfile
import time
from importlib import resources
from pathlib import Path

from bench_record import record_run

from stepplan.sim import cli
from stepplan.sim.results.table import read_csv
from stepplan.sim.run import prepare_requests, simulate
from stepplan.sim.settings.config import SimConfig, with_settings
from stepplan.sim.traces import load_trace

AZURE_CODE = str(resources.files("stepplan.sim").joinpath("data/azure_llm_2023_code.csv"))
GRID = {"scheduler.max_num_seqs": [96, 128, 192, 256], "seed": [0, 1, 2, 3]}


def sweep_file(folder: Path, limit: int | None) -> Path:
    lines = [f'traces = ["{AZURE_CODE}"]', "[settings]"]
    if limit:
        lines.append(f"workload.limit = {limit}")
    lines.append("[grid]")
    lines += [f"{key} = {values}" for key, values in GRID.items()]
    path = folder / "bench_sweep.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def cpu_s() -> float:
    """CPU seconds of this process and its waited-for children (the sweep's workers)."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def one_point(settings: dict) -> tuple[float, float]:
    """Wall and CPU seconds of one point in this process."""
    config = with_settings(SimConfig(), settings)
    start, cpu = time.perf_counter(), cpu_s()
    simulate(prepare_requests(load_trace(AZURE_CODE), config), config)
    return time.perf_counter() - start, cpu_s() - cpu


def points_wall(folder: Path) -> float:
    """The summed wall time of a sweep's points, from its ``sweep_measured.csv``."""
    return float(read_csv(folder / "sweep_measured.csv")["wall_s"].sum())


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def timed_sweep(path: Path, out: Path, *extra: str) -> float:
    start = time.perf_counter()
    code = cli.main(["sweep", str(path), "--out", str(out), "--quiet", *extra])
    if code != 0:
        raise SystemExit(f"stepplan sweep failed with exit code {code}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=int, help="requests of the trace (default: all)")
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--no-serial", action="store_true")
    args = parser.parse_args()
    points = len(GRID["scheduler.max_num_seqs"]) * len(GRID["seed"])
    base = {"workload.limit": args.limit}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    host = platform.processor() or platform.machine()
    print(f"host: {host}, {cores} core(s), {args.workers} workers")
    print(f"trace: {AZURE_CODE} (limit {args.limit or 'none'}), {points} points: {GRID}")
    print(f"load average before: {load_average()} (other processes share the cores)")
    t1, cpu1 = one_point(base)
    ideal = points * t1 / args.workers
    print(f"one point                       {t1:7.2f} s (CPU {cpu1:.2f} s)")
    figures: dict = {"points": points, "one_point_s": t1, "one_point_cpu_s": cpu1}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = sweep_file(folder, args.limit)
        if not args.no_serial:
            serial = sum(
                one_point({**base, "scheduler.max_num_seqs": m, "seed": s})[0]
                for m in GRID["scheduler.max_num_seqs"]
                for s in GRID["seed"]
            )
            print(f"16 points, one after the other  {serial:7.2f} s")
            figures["serial_s"] = serial
        cpu = cpu_s()
        local = timed_sweep(path, folder / "local", "--workers", str(args.workers))
        cpu = cpu_s() - cpu
        print(f"stepplan sweep --workers {args.workers}       {local:7.2f} s")
        share = cpu / (points * cpu1)
        print(f"  its CPU, workers included     {cpu:7.2f} s = {share:.3f} x 16 points' CPU")
        busy = points_wall(folder / "local")
        print(
            f"  its points' wall times, summed  {busy:7.2f} s: sweep / (that / {args.workers}) "
            f"= {local / (busy / args.workers):.3f} (the runner's own overhead)"
        )
        print(f"  / (16 x one point / {args.workers})       {local / ideal:7.3f}  (target <= 1.2)")
        figures |= {"sweep_s": local, "sweep_cpu_s": cpu, "over_ideal": local / ideal}
        if not args.no_serial:
            ratio = local / (serial / args.workers)
            print(f"  / (serial sum / {args.workers})           {ratio:7.3f}")
        if not args.no_ray:
            figures["ray"] = ray_times(path, folder, ideal, local)
    print(f"load average after: {load_average()}")
    headline = ["one_point_s", "sweep_s", "over_ideal"]
    record_run("sweep_bench", figures, workers=args.workers, limit=args.limit, headline=headline)


def ray_times(path: Path, folder: Path, ideal: float, local: float) -> dict:
    try:
        import ray
    except ImportError:
        print("ray: not installed (pip install 'stepplan[ray]'), skipped")
        return {}
    cpus = len(os.sched_getaffinity(0))
    started = timed_sweep(path, folder / "ray", "--ray")
    print(f"stepplan sweep --ray (starts Ray) {started:7.2f} s, / ideal {started / ideal:.3f}")
    print(f"  its points' wall, summed        {points_wall(folder / 'ray'):7.2f} s")
    same = (folder / "ray" / "sweep.csv").read_bytes() == (
        folder / "local" / "sweep.csv"
    ).read_bytes()
    init = time.perf_counter()
    ray.init(num_cpus=cpus, include_dashboard=False, logging_level="ERROR")
    init = time.perf_counter() - init
    print(f"ray.init alone                    {init:7.2f} s")
    warm = timed_sweep(path, folder / "ray_warm", "--ray")
    ray.shutdown()
    busy = points_wall(folder / "ray_warm")
    print(f"stepplan sweep --ray (Ray up)     {warm:7.2f} s, / ideal {warm / ideal:.3f}")
    ratio = warm / (busy / cpus)
    print(f"  its points' wall, summed        {busy:7.2f} s: / (that / {cpus}) = {ratio:.3f}")
    print(f"Ray table == local table: {same}")
    return {
        "starting_ray_s": started,
        "ray_init_s": init,
        "ray_up_s": warm,
        "ray_up_over_ideal": warm / ideal,
        "same_table": same,
    }


if __name__ == "__main__":
    main()
