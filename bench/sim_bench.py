"""Simulator speed: steps per second with the real planner compiling every step.

Two workloads (``--cases``), each simulated with the default settings:

- ``bundled``: the whole Azure code trace shipped with the package (8,819 requests,
  57 min, Q = 4; 38,746 steps).
- ``lowrate``: a synthetic, lightly loaded hour, :data:`LOWRATE` -- 1,800 requests at
  0.5 per second (Poisson), Zipf prompts up to 4,000 tokens and outputs up to 2,000,
  generated from the default seed 0 (the same table every run): 115,728 steps of one
  or two rows.
- any trace path or ``synthetic:`` spec given with ``--trace`` (one more case).

    python bench/sim_bench.py [--cases bundled,lowrate] [--trace PATH]
    python bench/sim_bench.py --vs-tree /tmp/oldmain [--repeat 3] [--set memory.kv_cache_gib=2]

Without ``--vs-tree`` it prints, per case, wall time, steps per second, where the wall
time went (planner vs the rest) and a least-squares fit of the measured planner time
per step against live rows (the numbers behind ``cost.host_base_us`` and
``cost.host_per_row_us``). With ``--vs-tree DIR`` it times this tree and the stepplan
checkout in ``DIR`` side by side, each case in fresh subprocesses, the two trees
alternating ``--repeat`` times, and prints the best steps per second of each and their
ratio. ``DIR`` is a checkout with its C extensions built in place, for instance::

    git worktree add /tmp/oldmain main
    (cd /tmp/oldmain && python setup.py build_ext --inplace)

Run it on one core (``taskset -c 0``) for figures comparable with bench/results/history/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import numpy as np
from bench_record import record_run

LOWRATE = "synthetic:n=1800,rate=0.5,cv2=1,prompt=zipf:1.1:4000,output=zipf:1.05:2000"
CASES = {"bundled": None, "lowrate": LOWRATE}
#: The packages of a stepplan checkout, as pyproject.toml maps them.
PACKAGES = ("planner", "executor", "sim", "plots")


def _trace_of(case: str) -> str:
    if case == "bundled":
        return str(resources.files("stepplan.sim").joinpath("data/azure_llm_2023_code.csv"))
    return CASES.get(case) or case


def run_case(case: str, settings: list[str]) -> dict:
    """Simulate one case in this process (with whichever stepplan imports here), through
    the command line's own parsing: an API every version of stepplan has."""
    from stepplan.planner import Planner
    from stepplan.sim import cli
    from stepplan.sim.run import simulate

    try:  # older trees made the planner's config in run.py
        from stepplan.sim.run import planner_config  # type: ignore[attr-defined]
    except ImportError:

        def planner_config(config):
            return config.plan

    extra = [word for setting in settings for word in ("--set", setting)]
    args = cli.build_parser().parse_args(["simulate", _trace_of(case), *extra])
    config = cli.build_config(args)
    requests = cli.load_requests(args, config)
    start, cpu = time.perf_counter(), time.process_time()
    result = simulate(requests, config)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    steps = result.steps
    return {
        "case": case,
        "tree": str(Path(cli.__file__).resolve().parents[2]),
        "native_planner": Planner(planner_config(config)).native,
        "requests": requests.num_requests,
        "steps": int(steps["step"].size),
        "wall_s": wall,
        "cpu_s": cpu,  # the process's CPU time: less shaken than wall by a busy machine
        "plan_us": steps["plan_us"].tolist(),
        "num_rows": steps["num_rows"].tolist(),
        "simulated_s": result.summary["duration_s"],
    }


def _shim(tree: Path, folder: Path) -> Path:
    """A folder whose ``stepplan`` package is ``tree``'s (``PYTHONPATH`` comes before
    the editable install's finder)."""
    package = folder / "stepplan"
    package.mkdir(parents=True)
    for name in PACKAGES:
        (package / name).symlink_to(tree / name, target_is_directory=True)
    return folder


def _run_in(tree: Path | None, case: str, shims: Path, settings: list[str]) -> dict:
    """One case in a fresh interpreter, importing stepplan from ``tree`` (``None``: this
    tree, as installed)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(shims / tree.name)
    command = [sys.executable, __file__, "--worker", case]
    command += [word for setting in settings for word in ("--set", setting)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{tree or 'this tree'}: case {case} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def compare(old: Path, cases: list[str], repeat: int, settings: list[str]) -> dict:
    """Time this tree against ``old``, alternating, and print the best of each; the
    figures per case."""
    figures = {}
    with tempfile.TemporaryDirectory() as temp:
        shims = Path(temp)
        _shim(old, shims / old.name)
        print(f"host: {_host()}; old tree: {old}; best of {repeat} runs each, alternating")
        header = f"{'case':10} {'steps':>8} {'old steps/s':>12} {'new steps/s':>12} {'ratio':>7}"
        print(header + "   old / new wall s, planner us/step")
        for case in cases:
            best: dict[str, dict] = {}
            for _ in range(repeat):
                for label, tree in (("old", old), ("new", None)):
                    run = _run_in(tree, case, shims, settings)
                    if label not in best or run["wall_s"] < best[label]["wall_s"]:
                        best[label] = run
            figures[case] = _print_pair(case, best["old"], best["new"])
        trees = f"old runs imported stepplan from {best['old']['tree']}"
        print(f"({trees}, new from {best['new']['tree']})")
    return figures


def _print_pair(case: str, old: dict, new: dict) -> dict:
    if old["steps"] != new["steps"]:
        print(f"{case}: the trees ran different steps ({old['steps']} vs {new['steps']})")
    rates = [run["steps"] / run["wall_s"] for run in (old, new)]
    planner = [np.mean(run["plan_us"]) for run in (old, new)]
    for run in (old, new):
        if not run["native_planner"]:
            print(f"  note: {run['tree']} packs plans with numpy (build its C extension)")
    print(
        f"{case:10} {new['steps']:>8,} {rates[0]:>12,.0f} {rates[1]:>12,.0f} "
        f"{rates[1] / rates[0]:>6.2f}x   {old['wall_s']:.2f} / {new['wall_s']:.2f}, "
        f"{planner[0]:.1f} / {planner[1]:.1f}"
    )
    return {
        "steps": new["steps"],
        "old_steps_per_s": rates[0],
        "new_steps_per_s": rates[1],
        "old_wall_s": old["wall_s"],
        "new_wall_s": new["wall_s"],
        "old_planner_us_per_step": float(planner[0]),
        "new_planner_us_per_step": float(planner[1]),
    }


def _host() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{platform.processor() or platform.machine()}, {cores} core(s) allowed"


def report(run: dict) -> dict:
    """Print the detailed figures of one case run in this process; its figures."""
    count, wall = run["steps"], run["wall_s"]
    plan_us, rows = np.asarray(run["plan_us"]), np.asarray(run["num_rows"])
    plan_s = plan_us.sum() * 1e-6
    slope, intercept = np.polyfit(rows, plan_us, 1)
    lines = [
        ("case", f"{run['case']} ({run['requests']:,} requests)"),
        ("host", _host()),
        ("wall time s", f"{wall:.2f}"),
        ("steps", f"{count:,}"),
        ("steps / s", f"{count / wall:,.0f}"),
        ("wall us / step", f"{wall / count * 1e6:.1f}"),
        ("  planner us / step", f"{plan_s / count * 1e6:.1f} (StepBatch + compile_plan)"),
        ("  simulator us / step", f"{(wall - plan_s) / count * 1e6:.1f} (everything else)"),
        ("simulated s", f"{run['simulated_s']:.1f}"),
        ("simulated / wall", f"{run['simulated_s'] / wall:.0f}x"),
        (
            "plan us p50 / p90",
            f"{np.percentile(plan_us, 50):.1f} / {np.percentile(plan_us, 90):.1f}",
        ),
        ("plan us fit", f"{intercept:.1f} + {slope:.3f} * rows"),
        ("rows / step mean, max", f"{rows.mean():.1f}, {rows.max()}"),
    ]
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        print(f"{label.ljust(width)}  {value}")
    return {
        "requests": run["requests"],
        "steps": count,
        "wall_s": wall,
        "steps_per_s": count / wall,
        "planner_us_per_step": plan_s / count * 1e6,
        "simulator_us_per_step": (wall - plan_s) / count * 1e6,
        "simulated_over_wall": run["simulated_s"] / wall,
        "plan_p50_us": float(np.percentile(plan_us, 50)),
        "plan_p90_us": float(np.percentile(plan_us, 90)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="bundled,lowrate", help="comma-separated cases")
    parser.add_argument("--trace", help="one more case: a trace path or a synthetic: spec")
    parser.add_argument("--vs-tree", type=Path, help="an older stepplan checkout to compare")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="a setting"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # one case, JSON out
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run_case(args.worker, args.set)))
        return
    cases = [case for case in args.cases.split(",") if case] + ([args.trace] if args.trace else [])
    if args.vs_tree is not None:
        figures = compare(args.vs_tree.resolve(), cases, args.repeat, args.set)
        headline = [f"{case}.new_steps_per_s" for case in figures]
        record_run(
            "sim_bench", figures, old_tree=str(args.vs_tree), settings=args.set, headline=headline
        )
        return
    figures = {}
    for case in cases:
        figures[case] = report(run_case(case, args.set))
        print()
    headline = [f"{case}.steps_per_s" for case in figures]
    record_run("sim_bench", figures, settings=args.set, headline=headline)


if __name__ == "__main__":
    main()
