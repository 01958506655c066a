"""Stepper speed under each admission policy, and first come first served against an older
tree (the scheduler before the policy seam): steps per second on the compiled stepper.

    python bench/policy_bench.py --vs-tree /tmp/base [--case bundled] [--repeat 3]

Every run is a fresh interpreter (``sim_bench.py``'s worker): with ``--vs-tree DIR``
the old tree and this one on the default settings (``fcfs``), then this one under each
policy with an age limit (``priority`` on :data:`PRIORITY_CASE`, a synthetic workload
that carries priorities), all in turn, ``--repeat`` rounds. The best of each goes to
one JSON record in ``bench/results/`` (date, device, command, commit, figures): the
least wall and the least CPU time of each (CPU time is shaken less by a busy machine).
Run it on one core (``taskset -c 0``) for figures comparable with ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from bench_record import new_record, write_record
from sim_bench import _run_in, _shim

ROOT = Path(__file__).resolve().parents[1]
#: A loaded synthetic workload with priorities (the bundled traces have none).
PRIORITY_CASE = "synthetic:n=8000,rate=3,cv2=2,prompt=zipf:1.1:6000,output=zipf:1.1:800,priority=4"


def configurations(
    old: Path | None, case: str, age_limit_s: float, fcfs_only: bool = False
) -> list[tuple]:
    """``(label, tree, case, settings)`` of every run: the old tree and this one on the
    default settings, then (unless ``fcfs_only``) this one under each policy with an age
    limit."""
    runs: list[tuple] = []
    if old is not None:
        runs += [("old_fcfs", old, case, []), ("new_fcfs", None, case, [])]
    if fcfs_only:
        return runs
    limit = f"scheduler.policy_age_limit_s={age_limit_s}"
    for policy, trace, label in (
        ("fcfs", case, "fcfs_aged"),
        ("shortest-prompt", case, "shortest_prompt_aged"),
        ("fcfs", PRIORITY_CASE, "fcfs_aged_priority_trace"),
        ("priority", PRIORITY_CASE, "priority_aged_priority_trace"),
    ):
        runs.append((label, None, trace, [f"scheduler.policy={policy}", limit]))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vs-tree", type=Path, help="an older checkout, built in place")
    parser.add_argument("--case", default="bundled", help="a sim_bench case, trace or spec")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--age-limit-s", type=float, default=30.0)
    parser.add_argument("--fcfs-only", action="store_true", help="only the two trees' fcfs runs")
    parser.add_argument("--record", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    figures: dict[str, dict] = {}
    old = None if args.vs_tree is None else args.vs_tree.resolve()
    runs = configurations(old, args.case, args.age_limit_s, args.fcfs_only)
    with tempfile.TemporaryDirectory(prefix="policy-bench-") as scratch:
        shims = Path(scratch)
        if old is not None:
            _shim(old, shims / old.name)
        for _ in range(args.repeat):  # round robin, so the machine's drift hits every run
            for label, tree, trace, settings in runs:
                run = _run_in(tree, trace, shims, settings)
                best = figures.setdefault(label, {"steps": run["steps"]})
                best["wall_s"] = min(best.get("wall_s", np.inf), run["wall_s"])
                best["cpu_s"] = min(best.get("cpu_s", np.inf), run["cpu_s"])
                best["steps_per_s"] = run["steps"] / best["wall_s"]
                best["steps_per_cpu_s"] = run["steps"] / best["cpu_s"]
    if old is not None:
        new, before = figures["new_fcfs"], figures["old_fcfs"]
        figures["new_over_old_fcfs"] = {
            "steps_per_s_ratio": new["steps_per_s"] / before["steps_per_s"],
            "steps_per_cpu_s_ratio": new["steps_per_cpu_s"] / before["steps_per_cpu_s"],
        }
    record = new_record("policy_bench", figures, case=args.case)
    print(json.dumps(record, indent=1))
    write_record(record, args.record)


if __name__ == "__main__":
    main()
