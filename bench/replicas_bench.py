"""A deployment's speed and memory: ``stepplan simulate --replicas N`` on one core.

The trace is the conversation-sized hour of ``bench/RESULTS.md`` ("Simulator speed":
19,366 requests at 5.38 per second, Poisson with cv2 = 2, prompts up to 2,400 tokens,
outputs up to 420) at ``--scale`` times its rate and request count, so each of the
``--replicas`` replicas sees about the hour's load. Each case runs the command line in
a fresh interpreter under ``/usr/bin/time -v`` (its peak RSS) pinned to one core with
``taskset -c 0``, writing a results folder (steps streamed to disk); the wall time is
the run's own (``measured.json``), the RSS and the CPU time (user + system) the
process's: on a loaded machine the CPU time is the figure a core of its own would
give. The record goes to ``bench/results/replicas_bench-<UTC time>.json``::

    python bench/replicas_bench.py --replicas 16 --scale 16 --router round-robin
    python bench/replicas_bench.py --replicas 1 --scale 1     # the single engine
    python bench/replicas_bench.py --replicas 4 --scale 1 --vs-split

``--vs-split`` times, in one process and without files, a round-robin deployment
against single engines (``run_steps``) on the trace split by hand the same way: the
same steps (``tests/test_replicas.py``), so the two CPU times compare the loops.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_record import commit, record_run  # noqa: E402

#: The conversation-sized hour (``bench/sim_bench.py``'s case of that name).
HOUR_REQUESTS, HOUR_RATE = 19366, 5.38
SHAPE = "cv2=2,prompt=uniform:16:2400,output=uniform:1:420"


def spec(scale: float) -> str:
    """The hour at ``scale`` times its rate and request count."""
    return f"synthetic:n={round(HOUR_REQUESTS * scale)},rate={HOUR_RATE * scale:.6g},{SHAPE}"


def _field(report: str, name: str) -> float:
    """A figure of ``/usr/bin/time -v``'s report."""
    return float(re.search(name + r": ([\d.]+)", report)[1])


def run_case(replicas: int, scale: float, router: str, cores: str) -> dict:
    """One run of the command line: its figures."""
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work) / "run"
        code = "import sys; from stepplan.sim.cli import main; sys.exit(main(sys.argv[1:]))"
        argv = [sys.executable, "-c", code, "simulate", spec(scale), "--replicas", str(replicas)]
        argv += ["--router", router, "--out", str(folder), "--quiet"]
        timed = ["/usr/bin/time", "-v", "taskset", "-c", cores, *argv]
        start = time.perf_counter()
        done = subprocess.run(timed, capture_output=True, text=True, cwd=ROOT)
        process_s = time.perf_counter() - start
        if done.returncode:
            raise SystemExit(f"the run failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        peak_kib = int(_field(done.stderr, r"Maximum resident set size \(kbytes\)"))
        cpu_s = _field(done.stderr, r"User time \(seconds\)") + _field(
            done.stderr, r"System time \(seconds\)"
        )
        summary = json.loads((folder / "summary.json").read_text())
        measured = json.loads((folder / "measured.json").read_text())
        sizes = {p.name: p.stat().st_size for p in folder.iterdir() if p.suffix == ".csv"}
    wall_s = measured["run"]["wall_s"]
    steps = summary["steps"]["count"]
    deployment = summary.get("deployment", {})
    return {
        "trace": spec(scale),
        "replicas": replicas,
        "router": router,
        "requests": summary["requests"],
        "finished_requests": summary["finished_requests"],
        "figures": {
            "replica_steps": steps,
            "run_wall_s": wall_s,
            "process_wall_s": process_s,
            "process_cpu_s": cpu_s,
            "steps_per_cpu_s": steps / cpu_s if cpu_s else 0.0,
            "steps_per_s": steps / wall_s if wall_s else 0.0,
            "peak_rss_mib": peak_kib / 1024,
            "steps_csv_mib": sizes.get("steps.csv", 0) / 2**20,
            "load_balance_max_over_mean": deployment.get("load_balance", 1.0),
        },
    }


_SPLIT = """
import json, sys, time
import numpy as np
from stepplan.sim.settings.config import SimConfig, with_settings
from stepplan.sim.deployment.loop import run_deployment
from stepplan.sim.run import prepare_requests, run_steps
from stepplan.sim.workloads import parse_synthetic

class Discard:
    def start(self, rows): pass
    def add_steps(self, steps): pass
    def add_requests(self, rows): pass

spec, replicas, router = sys.argv[1], int(sys.argv[2]), sys.argv[3]
base = SimConfig()
table = prepare_requests(parse_synthetic(spec), base)
config = with_settings(base, {"deployment.replicas": replicas, "deployment.router": router})
start = time.process_time()
end = run_deployment(table, config, Discard())
deployed_s = time.process_time() - start
split_s, split_steps = 0.0, 0
for replica in range(replicas):
    rows = np.arange(replica, table.num_requests, replicas)
    own = with_settings(base, {"seed": replica})
    start = time.process_time()
    alone = run_steps(table.take(rows), own, Discard())
    split_s += time.process_time() - start
    split_steps += alone.summary["steps"]["count"]
print(json.dumps({"deployed_cpu_s": deployed_s, "deployed_steps": end.summary["steps"]["count"],
                  "split_cpu_s": split_s, "split_steps": split_steps}))
"""


def split_case(replicas: int, scale: float, cores: str) -> dict:
    """In one process, without files: the CPU time of a round-robin deployment and of
    single engines on the trace split by hand the same way (the same steps)."""
    argv = ["taskset", "-c", cores, sys.executable, "-c", _SPLIT, spec(scale), str(replicas)]
    done = subprocess.run([*argv, "round-robin"], capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"the run failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    times = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "trace": spec(scale),
        "replicas": replicas,
        "router": "round-robin",
        "figures": {
            **times,
            "deployed_steps_per_cpu_s": times["deployed_steps"] / times["deployed_cpu_s"],
            "split_steps_per_cpu_s": times["split_steps"] / times["split_cpu_s"],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--scale", type=float, default=16.0, help="times the hour's rate")
    parser.add_argument("--router", default="round-robin")
    parser.add_argument("--cores", default="0", help="taskset's core list (default: one core)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument(
        "--note", action="append", default=[], help="a line for the record's notes (repeatable)"
    )
    parser.add_argument(
        "--vs-split",
        action="store_true",
        help="in one process, no files: round-robin replicas against single engines on the "
        "trace split by hand (CPU time of each)",
    )
    args = parser.parse_args()
    tree = commit()  # the code that runs, before anything else is committed meanwhile
    if args.vs_split:
        case = split_case(args.replicas, args.scale, args.cores)
    else:
        case = run_case(args.replicas, args.scale, args.router, args.cores)
    print(json.dumps(case["figures"], indent=2))
    settings = {key: value for key, value in case.items() if key != "figures"}
    if args.note:
        settings["notes"] = args.note
    # The commit taken before the run overrides the writer's, taken after it.
    record_run("replicas_bench", case["figures"], folder=Path(args.out), **settings, **tree)


if __name__ == "__main__":
    main()
